#!/usr/bin/env python3
"""Benchmark the supervisor's idle cost (not a test): `sglang-supervisor run` supervising the
simulated server, measured once ready. Results: BENCHMARKS.md.

    .venv/bin/python scripts/bench_idle.py [--seconds 30] [--ranks 8] [--gpus 8] [--crowd 0]
                                           [--cgroup auto|off]

--gpus 0 runs without GPUs (backend none); --crowd N adds N sleeping host processes.
CPU = utime + stime of the supervisor and its NVML worker over wall time; RSS = VmRSS.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_support import MiB, crowd, free_port, host_process_count, http_ok, wait_for  # noqa: E402

from supervisor.testing import gpu_state  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def supervisor_command(workdir: Path, port: int, ranks: int, gpus: int, cgroup: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "supervisor",
        "run",
        "--gpu-backend",
        "sim" if gpus else "none",
        "--cgroup",
        cgroup,
        "--name",
        f"bench-idle-{os.getpid()}",
        "--state-dir",
        str(workdir / "state"),
        "--server-command",
        f"{sys.executable} -m supervisor.testing.fake_sglang",
        "--force",
        "--log-format",
        "json",
        "--",
        "--model-path",
        "m",
        "--tp-size",
        str(ranks),
        "--port",
        str(port),
    ]


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def nvml_workers(parent: int) -> list[int]:
    """The supervisor's NVML worker processes (adapters/gpu_guard.py)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"gpu_guard" in cmdline:
            out.append(int(entry.name))
    return out


def idle_cost(
    seconds: float, ranks: int = 8, gpus: int = 8, extra: int = 0, cgroup: str = "auto"
) -> dict[str, float | int | str]:
    """CPU (% of one core) and RSS of an idle `run` supervising `ranks` simulated ranks."""
    with crowd(extra):
        return _idle_cost(seconds, ranks, gpus, cgroup) | {"host_processes": host_process_count()}


def _idle_cost(seconds: float, ranks: int, gpus: int, cgroup: str) -> dict[str, float | int | str]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-idle-"))
    gpu_dir = workdir / "gpus"
    port = free_port()
    env = dict(os.environ)
    if gpus:
        gpu_state.create_gpus(gpu_dir, gpus, numa_nodes=2)
        env["FAKE_GPU_STATE_DIR"] = str(gpu_dir)
    env["FAKE_SGLANG_BYTES_PER_GB"] = str(16 * 1024)
    env["FAKE_SGLANG_SCENARIO"] = json.dumps({"startup_s": 0.2})
    proc = subprocess.Popen(
        supervisor_command(workdir, port, ranks, gpus, cgroup),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    try:
        wait_for(lambda: http_ok(port), 120, "supervised server ready")
        time.sleep(5)  # let startup work (imports, first reads) settle before measuring
        pids = [proc.pid, *nvml_workers(proc.pid)]
        before = {p: cpu_s(p) for p in pids}
        t0 = time.monotonic()
        time.sleep(seconds)
        wall = time.monotonic() - t0
        used = {p: cpu_s(p) - before[p] for p in pids}
        return {
            "ranks": ranks,
            "gpus": gpus,
            "cgroup": cgroup,
            "cpu_percent": 100 * sum(used.values()) / wall,
            # With simulated GPUs the worker's event wait is a poll of the state directory;
            # real NVML blocks in the driver. Shown apart so the two can be told apart.
            "nvml_worker_cpu_percent": 100 * sum(used[p] for p in pids[1:]) / wall,
            "rss_mib": rss_bytes(proc.pid) / MiB,
            "nvml_worker_rss_mib": sum(rss_bytes(w) for w in pids[1:]) / MiB,
            "seconds": wall,
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--crowd", type=int, default=0)
    parser.add_argument("--cgroup", choices=["auto", "off"], default="auto")
    args = parser.parse_args()
    cost = idle_cost(args.seconds, args.ranks, args.gpus, args.crowd, args.cgroup)
    print(json.dumps(cost), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
