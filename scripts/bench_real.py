#!/usr/bin/env python3
"""Benchmark `run` against SGLang 0.5.23's own server on CPU (not a test; the lane's
environment first: scripts/real_sglang/build). Results: BENCHMARKS.md.

    .venv/bin/python scripts/bench_real.py [--kills 3] [--idle-s 30] [--json out.json]

One `run` of the tiny Llama at TP 2 (docs/real-sglang.md), health probed every 10 s (the
default), in this order:

- idle: once ready, utime + stime of the supervisor over `--idle-s` s of wall time, beside the
  same of the server's tree (the reference, measured over the same seconds);
- per kill: SIGKILL of `sglang::scheduler_TP1`; "noticed" is the supervisor's `server_failed`
  event from the kill; "restart lag" is the supervisor's `ready` after SGLang's own "The server
  is fired up and ready to roll!" line of the relaunched server (what the supervisor adds to the
  server's own start), beside that start itself (`server_launched` to that line);
- stop: SIGTERM with nothing in flight to the supervisor's exit, beside the drain it logged
  (`stopped` drained_s: SIGTERM to the tree gone).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.real_sglang.lane import RealSupervisor, lane_missing, real_supervisor  # noqa: E402
from tests.testing.support import MARKER_ENV  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
FIRED_UP = "The server is fired up and ready to roll!"


def epoch(event: dict[str, Any]) -> float:
    stamp = str(event["timestamp"]).replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp()


def cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def idle(sup: RealSupervisor, seconds: float) -> dict[str, float]:
    tree = sup.tree()
    start = time.monotonic()
    own0, tree0 = cpu_s(sup.proc.pid), sum(cpu_s(p) for p in tree)
    time.sleep(seconds)  # a measurement window, not synchronisation
    wall = time.monotonic() - start
    own1, tree1 = cpu_s(sup.proc.pid), sum(cpu_s(p) for p in tree)
    return {
        "seconds": wall,
        "supervisor_cpu_percent": 100 * (own1 - own0) / wall,
        "server_tree_cpu_percent": 100 * (tree1 - tree0) / wall,
        "server_tree_processes": len(tree),
    }


def fired_up_after(sup: RealSupervisor, after: float) -> dict[str, Any]:
    for event in sup.events("server_output"):
        if FIRED_UP in str(event.get("line", "")) and epoch(event) > after:
            return event
    raise AssertionError("no fired-up line after the relaunch")


def after(sup: RealSupervisor, name: str, t: float) -> list[dict[str, Any]]:
    return [e for e in sup.events(name) if epoch(e) > t]


def one_kill(sup: RealSupervisor) -> dict[str, Any]:
    """SIGKILL scheduler_TP1, wait for the next ready; every figure from the log's timestamps.
    A relaunch that itself failed before ready counts in `relaunch_failures` (its start is not
    the server's own start: the restart lag is then taken from the launch that got ready)."""
    pid = sup.schedulers()["sglang::scheduler_TP1"]
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)
    sup.wait_event("server_failed", count=len(sup.events("server_failed")) + 1, timeout_s=120)
    ready_before = len(sup.events("ready"))
    sup.wait_ready(count=ready_before + 1)
    ready = after(sup, "ready", t_kill)[0]
    failed = after(sup, "server_failed", t_kill)
    launched = [e for e in after(sup, "server_launched", t_kill) if epoch(e) < epoch(ready)]
    fired = fired_up_after(sup, epoch(launched[-1]))
    return {
        "noticed_s": epoch(failed[0]) - t_kill,
        "failure": failed[0]["failure"],
        "relaunch_failures": [f["failure"] for f in failed[1:] if epoch(f) < epoch(ready)],
        "kill_to_relaunch_s": epoch(launched[0]) - t_kill,
        "server_start_s": epoch(fired) - epoch(launched[-1]),
        "restart_lag_s": epoch(ready) - epoch(fired),
    }


def stop(sup: RealSupervisor) -> dict[str, float]:
    t_term = time.monotonic()
    sup.signal(signal.SIGTERM)
    rc = sup.wait_exit(timeout_s=300)
    wall = time.monotonic() - t_term
    drained = float(sup.wait_event("stopped")["drained_s"])
    return {"rc": rc, "stop_s": wall, "drained_s": drained, "beyond_drain_s": wall - drained}


def summary(values: list[float]) -> dict[str, float | int]:
    return {
        "n": len(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench_real.py")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if (missing := lane_missing()) is not None:
        print(f"bench_real: {missing}", file=sys.stderr)
        return 1
    os.environ[MARKER_ENV] = uuid.uuid4().hex  # the tree is found by it, as in the tests
    result: dict[str, Any] = {"load_average_start": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        options = ("--health-interval", "10s")
        with real_supervisor(Path(tmp), os.environ[MARKER_ENV], tp=2, options=options) as sup:
            sup.wait_ready()
            result["idle"] = idle(sup, args.idle_s)
            kills = [one_kill(sup) for _ in range(args.kills)]
            result["kills"] = kills
            result["stop"] = stop(sup)
    for key in ("noticed_s", "kill_to_relaunch_s", "server_start_s", "restart_lag_s"):
        result[key] = summary([k[key] for k in kills])
    result["relaunch_failures"] = sum(len(k["relaunch_failures"]) for k in kills)
    result["load_average_end"] = os.getloadavg()
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
