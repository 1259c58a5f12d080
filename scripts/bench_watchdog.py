#!/usr/bin/env python3
"""Benchmark the memory watchdog (not a test): reaction time and overshoot on leak ramps, side by
side with earlyoom when installed, and the supervisor's idle cost. Results: BENCHMARKS.md.

    .venv/bin/python scripts/bench_watchdog.py [--runs 5] [--rates 0.5,2,6] [--skip-idle]

Per rate and run, a simulated SGLang server (2 ranks) starts; rank 0 leaks private memory at
the rate; a 1 ms sampler in this process records when the watched quantity crosses the kill
line and when every process of the tree is gone (no /proc entry, or a zombie: memory freed).

* tree:     the product's main line - the tree's RssAnon+RssShmem vs budget + margin
            (budget = the tree measured at ready, margin 256 MiB);
* host:     MemAvailable vs a kill level 512 MiB below MemAvailable at the start; our watchdog
            with that level, and earlyoom -M with the same level. earlyoom runs with --dryrun
            (1.7 has no --ignore, and it must never pick another process on this shared
            machine): when it announces its SIGKILL, this script kills the tree at once.

Real memory: at most 1 GiB of leak per run (max_bytes), freed by the kill.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_support import (  # noqa: E402
    GB,
    HOG,
    MiB,
    crowd,
    free_port,
    gone,
    http_ok,
    read_meminfo_available,
    read_rss,
    server_cgroup,
    wait_for,
)

from supervisor.adapters.cgroup import ServerCgroup  # noqa: E402
from supervisor.adapters.host import HostProbe  # noqa: E402
from supervisor.adapters.server_process import ServerProcess  # noqa: E402
from supervisor.core.classify import FailureKind  # noqa: E402
from supervisor.core.events import STOP_REQUESTED, KillReason, WatchdogEvent  # noqa: E402
from supervisor.core.policy import Level, Limits  # noqa: E402
from supervisor.core.redact import redact_line  # noqa: E402
from supervisor.memory.watchdog import MemoryWatchdog  # noqa: E402

LEAK_CAP_BYTES = 1024 * MiB
TREE_MARGIN_BYTES = 256 * MiB
HOST_MARGIN_BYTES = 512 * MiB
SAMPLE_S = 0.001


def start_server(
    rate_bytes_per_s: int,
    leak_after_s: float,
    workdir: Path,
    leaker: str,
    group: ServerCgroup | None = None,
) -> ServerProcess:
    """The simulated SGLang server (2 ranks, rank 0 leaks), or a bare hog process: the fake's
    ranks touch pages inside a 20 ms event loop and top out near 0.5 GB/s on this VM."""
    if leaker == "hog":
        argv = [sys.executable, "-c", HOG, str(rate_bytes_per_s), str(LEAK_CAP_BYTES)]
        argv.append(str(leak_after_s))
        return ServerProcess.start(
            argv,
            dict(os.environ),
            run_id=uuid.uuid4().hex,
            sink=lambda line: None,
            redact=redact_line,
            cgroup=group,
        )
    scenario = {
        "startup_s": 0.1,
        "leak": {
            "rank": 0,
            "bytes_per_s": rate_bytes_per_s,
            "after_s": leak_after_s,
            "max_bytes": LEAK_CAP_BYTES,
            "kind": "anon",
        },
    }
    env = dict(os.environ)
    env["FAKE_SGLANG_SCENARIO"] = json.dumps(scenario)
    env["FAKE_SGLANG_BYTES_PER_GB"] = str(16 * 1024)
    env.pop("FAKE_GPU_STATE_DIR", None)
    port = free_port()
    argv = [sys.executable, "-m", "supervisor.testing.fake_sglang", "--model-path", "m"]
    argv += ["--tp-size", "2", "--port", str(port)]
    server = ServerProcess.start(
        argv, env, run_id=uuid.uuid4().hex, sink=lambda line: None, redact=redact_line, cgroup=group
    )
    wait_for(lambda: http_ok(port), 60, "server ready")
    return server


@dataclass
class Sample:
    series: list[tuple[float, int]]  # (time, bytes past the kill line; negative below it)
    rss: list[tuple[float, int]]  # (time, the leaking process's RssAnon+RssShmem)
    gone_at: float | None = None


def sampler(
    mode: str,
    line_bytes: int,
    leak_pid: int,
    others_bytes: int,
    pids: list[int],
    stop: threading.Event,
    out: Sample,
) -> None:
    """1 ms sampling of the watched quantity and of the tree's existence."""
    while not stop.is_set():
        now = time.monotonic()
        rss = read_rss(leak_pid)
        if mode == "tree":
            over = None if rss is None else rss + others_bytes - line_bytes
        else:
            over = line_bytes - read_meminfo_available()
        if over is not None:
            out.series.append((now, over))
        if rss is not None:
            out.rss.append((now, rss))
        if gone(pids):
            out.gone_at = now
            return
        time.sleep(SAMPLE_S)


def analyse(sample: Sample) -> tuple[float | None, int, float | None]:
    """(crossing -> gone in ms, overshoot bytes, ramp bytes/s). A kill before the crossing (the
    trend term) is measured against the moment the ramp *would* have crossed: negative."""
    series = sample.series
    if sample.gone_at is None or len(series) < 3 or len(sample.rss) < 3:
        return None, 0, None
    # The ramp from the leaking process's own RSS (MemAvailable also moves with the rest of this
    # shared machine): from the first 4 MiB of growth to its peak.
    base = sample.rss[0][1]
    start = next((p for p in sample.rss if p[1] > base + 4 * MiB), None)
    top = max(sample.rss, key=lambda p: p[1])
    peak_over = max(over for _, over in series)
    if start is None or top[0] <= start[0]:
        return None, max(0, peak_over), None
    ramp = (top[1] - start[1]) / (top[0] - start[0])
    crossed = next((t for t, over in series if over >= 0), None)
    if crossed is None:
        # Killed before the line (the trend term): when the ramp would have crossed it.
        t_peak, over_peak = max(series, key=lambda p: p[1])
        crossed = t_peak + (0 - over_peak) / ramp
    return (sample.gone_at - crossed) * 1000, max(0, peak_over), ramp


@dataclass
class RunResult:
    crossing_to_gone_ms: float | None
    overshoot_bytes: int
    ramp_bytes_per_s: float | None
    detail: str = ""
    mreleased: int = 0  # processes whose memory process_mrelease handed back


def limits_for(mode: str, baseline: int) -> tuple[int, Limits]:
    """(the kill line in bytes, the watchdog's limits) for the `tree` or the `host` line."""
    if mode == "tree":
        line = baseline + TREE_MARGIN_BYTES
        return line, Limits(
            warn=Level(bytes_=3 * MiB),
            terminate=Level(bytes_=2 * MiB),
            kill=Level(bytes_=1 * MiB),
            tree_budget_bytes=baseline + 16 * MiB,
            tree_kill_bytes=line,
            psi_full_warn_percent=None,
        )
    line = read_meminfo_available() - HOST_MARGIN_BYTES
    return line, Limits(
        warn=Level(bytes_=line + 2 * HOST_MARGIN_BYTES),
        terminate=Level(),  # off: earlyoom is run with TERM = KILL as well
        kill=Level(bytes_=line),
        psi_full_warn_percent=None,
    )


def start_earlyoom(line: int, server: ServerProcess) -> subprocess.Popen[str]:
    """earlyoom --dryrun at `line`; when it announces its kill, the tree is killed at once."""
    kib = max(1, line // 1024)
    eo = subprocess.Popen(
        # stdbuf: earlyoom's stdout is block-buffered into a pipe otherwise.
        ["stdbuf", "-oL", "earlyoom", "-M", f"{kib},{kib}", "--dryrun", "-r", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )

    def watch() -> None:
        if eo.stdout is None:
            return
        for text in eo.stdout:
            if os.environ.get("BENCH_DEBUG"):
                print("earlyoom:", text.rstrip(), flush=True)
            if re.search(r"sending SIG(KILL|TERM) to process", text):
                server.kill_all(KillReason(FailureKind.MEMORY_KILL, "earlyoom"))
                return

    threading.Thread(target=watch, daemon=True).start()
    return eo


def stop_earlyoom(eo: subprocess.Popen[str]) -> None:
    eo.send_signal(signal.SIGTERM)
    eo.wait(timeout=10)
    if eo.stdout is not None:
        eo.stdout.close()


def one_run(
    mode: str, tool: str, rate_gb_s: float, workdir: Path, leaker: str, use_cgroup: bool
) -> RunResult:
    with server_cgroup(use_cgroup) as group:
        return _one_run(mode, tool, rate_gb_s, workdir, leaker, group)


def _one_run(
    mode: str,
    tool: str,
    rate_gb_s: float,
    workdir: Path,
    leaker: str,
    group: ServerCgroup | None,
) -> RunResult:
    # The leak starts after a pause long enough to measure the baseline first.
    rate = int(rate_gb_s * GB)
    server = start_server(rate, leak_after_s=2.0, workdir=workdir, leaker=leaker, group=group)
    if leaker == "hog":
        time.sleep(0.5)  # the interpreter's own start-up allocations settle before the baseline
    tree = server.tree()
    pids = [p.pid for p in tree]
    ranks = [p for p in tree if p.title.startswith("sglang::scheduler_TP0")] or list(tree[:1])
    baseline = sum(p.charged_bytes for p in tree)
    line, limits = limits_for(mode, baseline)
    stop = threading.Event()
    sample = Sample(series=[], rss=[])
    others = baseline - ranks[0].charged_bytes
    thread = threading.Thread(
        target=sampler, args=(mode, line, ranks[0].pid, others, pids, stop, sample), daemon=True
    )
    thread.start()
    dog: MemoryWatchdog | None = None
    eo: subprocess.Popen[str] | None = None
    try:
        if tool == "watchdog":
            probe = HostProbe()
            events: queue.SimpleQueue[WatchdogEvent] = queue.SimpleQueue()
            read_host = lambda _tree: probe.read_meminfo()  # noqa: E731 - one-line adapter
            dog = MemoryWatchdog(server, limits, post=events.put, read_host=read_host)
            dog.start()
        else:
            eo = start_earlyoom(line, server)
        thread.join(timeout=30)
    finally:
        stop.set()
        if dog is not None:
            dog.stop()
        if eo is not None:
            stop_earlyoom(eo)
        server.kill_all(STOP_REQUESTED)
        wait_for(lambda: gone(pids), 10, "tree gone")
        server.reap()
        server.close()
    took_ms, overshoot, ramp = analyse(sample)
    result = RunResult(took_ms, overshoot, ramp, "" if took_ms is not None else "no kill seen")
    result.mreleased = server.memory_released if tool == "watchdog" else 0
    return result


def summarize(results: list[RunResult]) -> dict[str, object]:
    times = [r.crossing_to_gone_ms for r in results if r.crossing_to_gone_ms is not None]
    over = [r.overshoot_bytes / GB for r in results]
    ramps = [r.ramp_bytes_per_s / GB for r in results if r.ramp_bytes_per_s]
    return {
        "n": len(times),
        "median_ms": statistics.median(times) if times else None,
        "min_ms": min(times) if times else None,
        "max_ms": max(times) if times else None,
        "overshoot_median_gb": statistics.median(over) if over else None,
        "overshoot_max_gb": max(over) if over else None,
        "ramp_gb_s": statistics.median(ramps) if ramps else None,
        "dropped": len(results) - len(times),
        "mreleased": [r.mreleased for r in results],
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rates", default="0.5,2,6")
    parser.add_argument("--crowd", type=int, default=0, help="sleeping host processes beside")
    parser.add_argument("--cgroup", choices=["auto", "off", "both"], default="both")
    parser.add_argument("--lines", default="tree,host")
    parser.add_argument("--skip-idle", action="store_true")
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rates = [float(x) for x in args.rates.split(",")]
    cgroups = {"auto": [True], "off": [False], "both": [True, False]}[args.cgroup]
    have_earlyoom = shutil.which("earlyoom") is not None
    workdir = Path(tempfile.mkdtemp(prefix="bench-watchdog-"))
    report: dict[str, object] = {"rates": rates, "runs": args.runs, "earlyoom": have_earlyoom}
    report["crowd"] = args.crowd
    combos = [("fake", "tree", "watchdog"), ("hog", "tree", "watchdog")]
    combos.append(("hog", "host", "watchdog"))
    if have_earlyoom:
        combos.append(("hog", "host", "earlyoom"))
    combos = [c for c in combos if c[1] in args.lines.split(",")]
    with crowd(args.crowd):
        report["rows"] = _rows(args.runs, rates, combos, cgroups, workdir)
    if not args.skip_idle:
        from bench_idle import idle_cost  # scripts/bench_idle.py, beside this file

        report["idle"] = idle_cost(args.idle_seconds)
        print(json.dumps(report["idle"]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _rows(
    runs: int,
    rates: list[float],
    combos: list[tuple[str, str, str]],
    cgroups: list[bool],
    workdir: Path,
) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for rate in rates:
        for leaker, mode, tool in combos:
            if leaker == "fake" and rate > 0.5:
                continue  # the simulated ranks cannot leak faster on this VM (see start_server)
            for use_cgroup in cgroups if tool == "watchdog" else [False]:
                results = [
                    one_run(mode, tool, rate, workdir, leaker, use_cgroup) for _ in range(runs)
                ]
                row: dict[str, object] = {"rate_gb_s": rate, "leaker": leaker, "mode": mode}
                row.update(tool=tool, containment="cgroup" if use_cgroup else "/proc")
                row.update(summarize(results))
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
