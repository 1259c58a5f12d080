#!/usr/bin/env python3
"""Benchmark the restart latency of `run` (not a test): a rank SIGKILLed, then the supervisor's
`ready` event, against the simulated server's own return to 200 measured in the same run.
Results: BENCHMARKS.md.

    .venv/bin/python scripts/bench_run.py [--runs 10] [--cgroup auto|off] [--json out.json]

`run` supervises the simulated SGLang server (2 ranks) with the restart backoff at its minimum
(1 ms). Per run this script SIGKILLs rank 1 and polls /health every 2 ms: "server back" is the
first 200 after the kill (the relaunched server answering); "ready" is the timestamp of the
supervisor's next `ready` event. The difference is what the supervisor adds to the server's own
start: noticing the death, killing the rest, relaunching, and noticing readiness.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_support import ROOT, free_port, http_ok, spread, wait_for


def events(log: Path, name: str) -> list[dict[str, object]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("event") == name:
            out.append(event)
    return out


def epoch(event: dict[str, object]) -> float:
    stamp = str(event["timestamp"]).replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp()


def scheduler(pid_parent: int, title: str) -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(title.encode()):
                    return int(entry.name)
            except OSError:
                continue
    return None


def back_after(port: int, t_kill: float, result: dict[str, float]) -> None:
    """Poll /health every 2 ms: the first failure after the kill, then the first 200."""
    down = False
    deadline = time.time() + 60
    while time.time() < deadline:
        ok = http_ok(port)
        if not ok:
            down = True
        elif down:
            result["back"] = time.time() - t_kill
            return
        time.sleep(0.002)


def one_restart(
    proc: subprocess.Popen[bytes], log: Path, port: int, count: int
) -> dict[str, float]:
    rank = scheduler(proc.pid, "sglang::scheduler_TP1")
    if rank is None:
        raise RuntimeError("no rank 1")
    result: dict[str, float] = {}
    t_kill = time.time()
    poller = threading.Thread(target=back_after, args=(port, t_kill, result), daemon=True)
    os.kill(rank, signal.SIGKILL)
    poller.start()
    wait_for(lambda: len(events(log, "ready")) >= count + 1, 60, "the supervisor's ready")
    poller.join(60)
    ready = epoch(events(log, "ready")[count]) - t_kill
    return {"server_back_ms": result["back"] * 1000, "ready_ms": ready * 1000}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--cgroup", choices=["auto", "off"], default="auto")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-run-"))
    port = free_port()
    log = workdir / "run.log"
    env = dict(os.environ)
    env["FAKE_SGLANG_BYTES_PER_GB"] = str(16 * 1024)
    env["FAKE_SGLANG_SCENARIO"] = json.dumps({"startup_s": 0.2, "warmup_s": 0.1})
    argv = [sys.executable, "-m", "supervisor", "run", "--gpu-backend", "none", "--force"]
    argv += ["--state-dir", str(workdir / "state"), "--name", f"bench-run-{os.getpid()}"]
    argv += ["--cgroup", args.cgroup, "--log-format", "json"]
    argv += ["--backoff-initial", "1ms", "--backoff-max", "1ms", "--max-restarts", "1000"]
    argv += ["--server-command", f"{sys.executable} -m supervisor.testing.fake_sglang", "--"]
    argv += ["--model-path", "m", "--tp-size", "2", "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_for(lambda: len(events(log, "ready")) >= 1, 120, "first ready")
        runs = [one_restart(proc, log, port, i + 1) for i in range(args.runs)]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    added = [r["ready_ms"] - r["server_back_ms"] for r in runs]
    report = {
        "cgroup": args.cgroup,
        "mode": events(log, "server_launched")[0].get("mode"),
        "server_back_ms": spread([r["server_back_ms"] for r in runs]),
        "ready_ms": spread([r["ready_ms"] for r in runs]),
        "added_ms": spread(added),
    }
    print(json.dumps(report, indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
