#!/usr/bin/env python3
"""Benchmark the kill of a server tree (not a test): decision -> SIGKILL and -> gone, on a quiet
host and beside thousands of sleeping host processes, in both containments, how often
process_mrelease freed memory, and a storm of escapees killed by one cgroup.kill.
Results: BENCHMARKS.md.

    .venv/bin/python scripts/bench_kill.py [--runs 10] [--crowd 4000] [--json out.json]

The tree is the simulated SGLang server with 8 ranks, each holding 128 MiB of real anonymous
memory (so that its exit takes the time memory takes). "decision" is the call of kill_all, as
the watchdog makes it the moment it decides; "SIGKILL" the first signal leaving (killpg in
/proc mode, the cgroup.kill write in cgroup mode); "gone" when no process of the tree is left
(a poll on cgroup.events, or /proc in /proc mode).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_support import (
    crowd,
    free_port,
    host_process_count,
    http_ok,
    server_cgroup,
    spread,
    wait_for,
)

from supervisor.adapters import cgroup as cgroup_module
from supervisor.adapters import server_process
from supervisor.adapters.server_process import ServerProcess
from supervisor.core.classify import FailureKind
from supervisor.core.events import KillReason

P = ParamSpec("P")
R = TypeVar("R")
REASON = KillReason(FailureKind.MEMORY_KILL, "bench")
FIRST_SIGNAL: list[float] = []


def _timed(fn: Callable[P, R]) -> Callable[P, R]:
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        FIRST_SIGNAL.append(time.perf_counter())
        return fn(*args, **kwargs)

    return wrapper


# The first SIGKILL of each mode, timed where it leaves.
server_process.ServerProcess.signal_group = _timed(  # type: ignore[method-assign]
    server_process.ServerProcess.signal_group
)
cgroup_module.ServerCgroup.kill = _timed(cgroup_module.ServerCgroup.kill)  # type: ignore[method-assign]


def start(group: cgroup_module.ServerCgroup | None) -> tuple[ServerProcess, int]:
    port = free_port()
    env = dict(os.environ)
    env["FAKE_SGLANG_BYTES_PER_GB"] = str(32 * 2**20)  # runtime_gb 4 -> 128 MiB per rank
    env["FAKE_SGLANG_SCENARIO"] = json.dumps({"startup_s": 0.1})
    env.pop("FAKE_GPU_STATE_DIR", None)
    argv = [sys.executable, "-m", "supervisor.testing.fake_sglang", "--model-path", "m"]
    argv += ["--tp-size", "8", "--port", str(port)]
    server = ServerProcess.start(
        argv,
        env,
        run_id=uuid.uuid4().hex,
        sink=lambda _line: None,
        redact=lambda line: line,
        cgroup=group,
    )
    wait_for(lambda: http_ok(port), 120, "server ready")
    return server, port


def gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                    return False
        except (OSError, IndexError):
            continue
    return True


def one_kill(use_cgroup: bool) -> dict[str, float | int]:
    with server_cgroup(use_cgroup) as group:
        server, _port = start(group)
        try:
            pids = [p.pid for p in server.tree()]  # as the watchdog has read it
            FIRST_SIGNAL.clear()
            t0 = time.perf_counter()
            server.kill_all(REASON)
            t_kill = time.perf_counter()
            if group is not None:
                group.wait_empty(30.0)
            else:
                while not gone(pids):
                    time.sleep(0.0005)
            t_gone = time.perf_counter()
            return {
                "to_sigkill_ms": (FIRST_SIGNAL[0] - t0) * 1000,
                "kill_all_ms": (t_kill - t0) * 1000,
                "to_gone_ms": (t_gone - t0) * 1000,
                "members": len(pids),
                "mreleased": server.memory_released,
            }
        finally:
            server.kill_all(REASON)
            wait_for(lambda: gone(pids), 30, "tree gone")
            server.reap()
            server.close()


STORM = """
import os, sys, time
for i in range(50):
    pid = os.fork()
    if pid == 0:
        if i % 2:
            os.setsid(); time.sleep(300)             # setsid escapee
        elif os.fork() == 0:
            time.sleep(300)                          # double fork: reparented at once
        os._exit(0)
print("spawned", flush=True)
time.sleep(300)
"""


def storm() -> dict[str, float | int]:
    """50 escapees (setsid and double fork) and their launcher, killed by one cgroup.kill."""
    with server_cgroup(True) as group:
        assert group is not None
        lines: list[str] = []
        server = ServerProcess.start(
            [sys.executable, "-c", STORM],
            dict(os.environ),
            run_id=uuid.uuid4().hex,
            sink=lines.append,
            redact=lambda line: line,
            cgroup=group,
        )
        try:
            wait_for(lambda: len(group.pids()) >= 51, 60, "the storm")
            members = len(group.pids())
            t0 = time.perf_counter()
            group.kill()
            emptied = group.wait_empty(30.0)
            return {
                "members_killed": members,
                "all_gone": int(emptied and not group.pids()),
                "to_gone_ms": (time.perf_counter() - t0) * 1000,
            }
        finally:
            server.reap()
            server.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--crowd", type=int, default=4000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report: dict[str, object] = {"rows": []}
    rows: list[dict[str, object]] = []
    for extra in (0, args.crowd):
        with crowd(extra):
            hosts = host_process_count()
            for mode in ("cgroup", "/proc"):
                runs = [one_kill(mode == "cgroup") for _ in range(args.runs)]
                row = {"mode": mode, "host_processes": hosts, "crowd": extra}
                for key in ("to_sigkill_ms", "kill_all_ms", "to_gone_ms"):
                    row[key] = spread([float(r[key]) for r in runs])
                row["mreleased"] = [int(r["mreleased"]) for r in runs]
                row["members"] = runs[0]["members"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    report["rows"] = rows
    report["storm"] = [storm() for _ in range(3)]
    print(json.dumps(report["storm"]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
