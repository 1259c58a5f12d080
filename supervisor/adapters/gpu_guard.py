"""NVML isolated in a worker process with a deadline per query (implements ports.GpuSensor).

NVML can block forever after some GPU faults (open-gpu-kernel-modules #1333). A thread stuck in
the driver cannot be killed, keeps its NVML handle (which also blocks a GPU reset) and every later
in-process NVML call queues behind the same library lock; a worker process can be abandoned and
replaced. So: a query that misses its deadline marks the GPU state unknown (None), raises an
alert, kills the worker, and the next queries answer None at once until `retry_after_s` has
passed (in `run`: core.gpu_release.nvml_retry_after_s, bounded by the release wait's timeout
and longer with each hang in a row). The memory watchdog never queries: it reads
`last_snapshot()`, which never blocks.

Worker protocol (stdin/stdout, one JSON line each): "read" -> {"gpus": [...]} or {"gpus": null};
"events MS" -> {"events": [...], "unwatched": [...]} (adapters/nvml_events.py: the driver events
since the last request, waiting up to MS milliseconds for the first); "health" ->
{"health": {...}} or {"health": null} (adapters/nvml_health.py: every GPU's health read).
The worker imports the pynvml-shaped module it is told to (`--module`; the shell names the
simulation's when the `sim` backend is chosen).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from supervisor.adapters import nvml_events, nvml_health
from supervisor.adapters.nvml import open_gpu_sensor
from supervisor.adapters.processes import own_child, spawning
from supervisor.core.gpu_health import GpuEvent, HealthSnapshot
from supervisor.core.readings import GpuProcess, GpuState

log = structlog.get_logger("supervisor.gpu_guard")

# The first answer's deadline ([gpu] nvml_start_timeout): importing pynvml and nvmlInit take
# ~0.1-0.5 s on a healthy box, seconds on many GPUs without persistence mode.
START_TIMEOUT_S = 15.0


def _to_json(gpus: tuple[GpuState, ...] | None) -> str:
    if gpus is None:
        return json.dumps({"gpus": None})
    return json.dumps(
        {
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "total_bytes": g.total_bytes,
                    "used_bytes": g.used_bytes,
                    "numa_node": g.numa_node,
                    "processes": [[p.pid, p.used_bytes] for p in g.processes],
                }
                for g in gpus
            ]
        }
    )


def _from_json(line: str) -> tuple[GpuState, ...] | None:
    data: Any = json.loads(line)
    if data.get("gpus") is None:
        return None
    return tuple(
        GpuState(
            index=int(g["index"]),
            uuid=str(g["uuid"]),
            name=str(g["name"]),
            total_bytes=int(g["total_bytes"]),
            used_bytes=int(g["used_bytes"]),
            numa_node=g["numa_node"],
            processes=tuple(GpuProcess(pid=int(p), used_bytes=u) for p, u in g["processes"]),
        )
        for g in data["gpus"]
    )


class GuardedGpuSensor:
    """GpuSensor whose every NVML query runs in a worker process and is bounded by `timeout_s`."""

    def __init__(
        self,
        module: str = "pynvml",
        *,
        timeout_s: float = 5.0,
        start_timeout_s: float = START_TIMEOUT_S,
        retry_after_s: float | Callable[[int], float] = 30.0,
        env: Mapping[str, str] | None = None,
        on_alert: Callable[[str], None] | None = None,
    ) -> None:
        self.module = module
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        # Seconds, or a function of how many queries in a row missed their deadline.
        self.retry_after_s = retry_after_s
        self._hangs_in_a_row = 0
        self.env = dict(env) if env is not None else None
        self.on_alert = on_alert
        self._worker: subprocess.Popen[str] | None = None
        self._answered = False
        self._abandoned: list[subprocess.Popen[str]] = []
        self._retry_at = 0.0
        self._lock = threading.Lock()
        self._last: tuple[float, tuple[GpuState, ...] | None] | None = None
        self.hangs = 0
        self._unwatched: set[tuple[int | None, str]] = set()  # logged once each
        self._unknown_logged: set[str] = set()  # health fields NVML could not report

    def last_snapshot(self) -> tuple[float, tuple[GpuState, ...] | None] | None:
        """(monotonic time, GPUs or None) of the latest query; never blocks, never queries."""
        return self._last

    def read_gpus(self) -> tuple[GpuState, ...] | None:
        with self._lock:
            self._reap_abandoned()
            if time.monotonic() < self._retry_at:
                return None
            gpus = self._query()
            self._last = (time.monotonic(), gpus)
            return gpus

    def close(self) -> None:
        """Stop the worker: its NVML handle goes with it (a GPU reset needs every client gone)."""
        with self._lock:
            for abandoned in self._abandoned:
                # Killed already; a worker stuck in the driver stays listed (never blocks long).
                with contextlib.suppress(subprocess.TimeoutExpired):
                    abandoned.wait(timeout=1.0)
            self._reap_abandoned()
            worker, self._worker = self._worker, None
            if worker is None:
                return
            with contextlib.suppress(OSError):
                if worker.stdin is not None:
                    worker.stdin.close()
            try:
                worker.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                self._abandon(worker)
                # Killed now: unless it is stuck in the driver it is gone within milliseconds, and
                # reaped here its Popen never outlives the sensor unwaited.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.wait(timeout=1.0)
                self._reap_abandoned()
            if worker.stdout is not None:
                worker.stdout.close()

    # -- worker management -------------------------------------------------------------

    def _start(self) -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "supervisor.adapters.gpu_guard", "--module", self.module]
        self._answered = False
        with spawning():  # its exit status is its Popen's, never the orphan reaper's
            worker = subprocess.Popen(
                argv,
                env={**os.environ, **self.env} if self.env is not None else None,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                bufsize=1,
                close_fds=True,
            )
            own_child(worker)
        return worker

    def read_events(self, wait_ms: int = 0) -> tuple[GpuEvent, ...] | None:
        """Driver events since the last call (waiting up to `wait_ms` for one); None: unknown."""
        with self._lock:
            self._reap_abandoned()
            if time.monotonic() < self._retry_at:
                return None
            line = self._ask(f"events {int(wait_ms)}")
        return None if line is None else nvml_events.events_from_answer(line, self._unwatched)

    def read_health(self) -> HealthSnapshot | None:
        """Every GPU's health; None: unknown (NVML hung or failed). A field NVML cannot
        report is logged once per field (`gpu_health_unknown`)."""
        with self._lock:
            self._reap_abandoned()
            if time.monotonic() < self._retry_at:
                return None
            line = self._ask("health")
        if line is None:
            return None
        try:
            snapshot = nvml_health.health_from_json(json.loads(line)["health"])
        except (ValueError, KeyError, TypeError):
            return None
        for field, reason in snapshot.unknown if snapshot is not None else ():
            if field not in self._unknown_logged:
                self._unknown_logged.add(field)
                log.info("gpu_health_unknown", field=field, reason=reason, verdict="unknown")
        return snapshot

    def _query(self) -> tuple[GpuState, ...] | None:
        line = self._ask("read")
        if line is None:
            return None
        try:
            return _from_json(line)
        except (ValueError, KeyError, TypeError):
            return None

    def _ask(self, request: str) -> str | None:
        """One request to the worker (started if need be); its answer line, None when hung."""
        if self._worker is None or self._worker.poll() is not None:
            self._worker = self._start()
        worker = self._worker
        if worker.stdin is None or worker.stdout is None:  # pragma: no cover - PIPEs above
            raise RuntimeError("gpu worker started without pipes")
        deadline = self.timeout_s if self._answered else max(self.timeout_s, self.start_timeout_s)
        try:
            worker.stdin.write(request + "\n")
            worker.stdin.flush()
            ready, _, _ = select.select([worker.stdout], [], [], deadline)
            line = worker.stdout.readline() if ready else ""
        except (OSError, ValueError):
            line = ""
        if not line:
            self._hung(worker, f"NVML query gave no answer within {deadline:g} s")
            return None
        self._answered = True
        self._hangs_in_a_row = 0
        return line

    def _hung(self, worker: subprocess.Popen[str], why: str) -> None:
        self.hangs += 1
        self._worker = None
        self._abandon(worker)
        self._hangs_in_a_row += 1
        retry = self.retry_after_s
        retry_s = retry(self._hangs_in_a_row) if callable(retry) else retry
        self._retry_at = time.monotonic() + retry_s
        log.error("nvml_hung", reason=why, retry_after_s=retry_s, gpu_state="unknown")
        if self.on_alert is not None:
            self.on_alert(why)

    def _abandon(self, worker: subprocess.Popen[str]) -> None:
        # SIGKILL stays pending while the worker is stuck in the driver (D state); reap it later.
        with contextlib.suppress(OSError):
            worker.kill()
        for stream in (worker.stdin, worker.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        self._abandoned.append(worker)

    def _reap_abandoned(self) -> None:
        self._abandoned = [w for w in self._abandoned if w.poll() is None]


def _serve(module: str) -> int:
    # Die with the supervisor even if it is SIGKILLed: stdin EOF ends the loop, and PDEATHSIG
    # covers a worker blocked in a query at that moment. PDEATHSIG fires when the *thread* that
    # started the worker exits, so the first query should come from a long-lived thread (the
    # run loop's); a worker lost that way is simply restarted by the next query.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    try:
        nvml = importlib.import_module(module)
        sensor = open_gpu_sensor("nvml", module=nvml)
    except Exception:  # noqa: BLE001 - any failure to open NVML answers "unknown"
        sensor = None
    # From the start: NVML delivers only the events that happen after they are registered.
    watch = nvml_events.EventWatch(nvml) if sensor is not None else None
    for line in sys.stdin:
        request = line.split()
        if request[:1] == ["events"] and len(request) == 2 and request[1].isdigit():
            answer = json.dumps(nvml_events.answer(watch, int(request[1])))
        elif request == ["read"]:
            answer = _to_json(sensor.read_gpus() if sensor is not None else None)
        elif request == ["health"]:
            health = sensor.read_health() if sensor is not None else None
            answer = json.dumps({"health": nvml_health.health_to_json(health)})
        else:
            continue
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()
    if watch is not None:
        watch.close()
    if sensor is not None:
        sensor.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m supervisor.adapters.gpu_guard")
    parser.add_argument("--module", default="pynvml", help="pynvml or a module shaped like it")
    args = parser.parse_args(argv)
    os.environ.pop("PYTHONWARNINGS", None)
    return _serve(args.module)


if __name__ == "__main__":
    sys.exit(main())
