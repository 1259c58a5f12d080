"""Helpers for tests that run the simulated SGLang server (supervisor/testing) as real processes."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil

from supervisor.testing import shm

MARKER_ENV = "FAKE_SGLANG_MARKER"
# Tests express "300 GB" host pools in KiB of real memory: 16 KiB per simulated GB keeps an
# 8-rank × 300 GB server under 40 MiB (the suite's real-memory budget is tens of MiB).
TEST_BYTES_PER_GB = 16 * 1024
# SGLang's /health takes at least 1 s (the simulation's health_delay_s default); the suite's
# launches answer at once unless a test sets the delay (tests/testing/test_fake_sglang.py).
TEST_HEALTH_DELAY_S = 0.0


def fake_server_env(
    scenario: Mapping[str, Any] | None = None,
    *,
    state_dir: Path | None = None,
    bytes_per_gb: int = TEST_BYTES_PER_GB,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment for a fake launch: os.environ (with the test's marker) + the fake's knobs."""
    env = dict(os.environ if base is None else base)
    env["FAKE_SGLANG_SCENARIO"] = json.dumps(
        {"health_delay_s": TEST_HEALTH_DELAY_S, **(scenario or {})}
    )
    env["FAKE_SGLANG_BYTES_PER_GB"] = str(bytes_per_gb)
    if state_dir is not None:
        env["FAKE_GPU_STATE_DIR"] = str(state_dir)
    else:
        env.pop("FAKE_GPU_STATE_DIR", None)
    return env


def fake_server_argv(args: Sequence[str]) -> list[str]:
    """How the supervisor launches the simulation: exactly SGLang's argv after the module."""
    return [sys.executable, "-m", "supervisor.testing.fake_sglang", *args]


def run_fake_to_exit(
    args: Sequence[str], env: Mapping[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run the simulation that is expected to exit by itself (bad input), capturing its output."""
    return subprocess.run(
        fake_server_argv(args),
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def http_status(
    port: int, path: str, *, timeout_s: float = 5.0, host: str = "127.0.0.1"
) -> int | None:
    """GET `path`; the status code, or None when the connection is refused (still loading)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except ConnectionRefusedError:
        return None
    finally:
        conn.close()


def post_generate(port: int, *, timeout_s: float = 30.0, host: str = "127.0.0.1") -> int:
    """POST /generate as a client would; the status code of the answer."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        body = json.dumps({"text": "Hello", "sampling_params": {"max_new_tokens": 8}})
        conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def http_json(port: int, path: str, *, host: str = "127.0.0.1") -> Any:
    conn = http.client.HTTPConnection(host, port, timeout=5.0)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        assert response.status == 200, f"GET {path}: {response.status}"
        return json.loads(response.read())
    finally:
        conn.close()


@dataclass
class FakeServer:
    """A running simulated server, launched in its own session like the supervisor does."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    extra_pids: list[int] = field(default_factory=list)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_lines(self, containing: str) -> list[str]:
        return [line for line in self.log_text().splitlines() if containing in line]

    def status(self, path: str = "/health", *, timeout_s: float = 5.0) -> int | None:
        return http_status(self.port, path, timeout_s=timeout_s)

    def running_requests(self) -> float:
        """sglang:num_running_reqs from /metrics (the server runs with --enable-metrics)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5.0)
        try:
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        line = next(m for m in text.splitlines() if m.startswith("sglang:num_running_reqs"))
        return float(line.rsplit(" ", 1)[1])

    def tree(self) -> list[psutil.Process]:
        """The main process's live descendants (ranks, detokenizer, resource tracker)."""
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def titled(self, prefix: str = "sglang::") -> dict[str, psutil.Process]:
        """Descendants whose title starts with `prefix`, by title. A child that still carries
        its parent's title (a scheduler's short-lived init fork) is not that process."""
        out: dict[str, psutil.Process] = {}
        for proc in self.tree():
            try:
                cmdline = proc.cmdline()
                parent = proc.parent()
                inherited = parent is not None and parent.cmdline()[:1] == cmdline[:1]
            except psutil.Error:
                continue
            if cmdline and cmdline[0].startswith(prefix) and not inherited:
                out[cmdline[0]] = proc
        return out

    def stop(self) -> None:
        """SIGKILL the whole process group and reap the main process."""
        for pid in self.extra_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        # The ranks die by PDEATHSIG (or with the group): wait until they are gone.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def shm_names_of(pid: int) -> list[str]:
    """The /dev/shm names whose creator PID, read by SGLang's rule, is `pid` (sorted)."""
    return sorted(p.name for p in shm.SHM_DIR.iterdir() if shm.creator_pid(p.name) == pid)


def recorded_shm_names(record: Path) -> list[str]:
    """The segment names the simulated processes appended to $FAKE_SGLANG_SHM_RECORD."""
    try:
        return [line for line in record.read_text().splitlines() if line]
    except FileNotFoundError:
        return []


def leaked(record: Path) -> list[str]:
    """The recorded segments still in /dev/shm."""
    return [name for name in recorded_shm_names(record) if (shm.SHM_DIR / name).exists()]


def remove_recorded_shm(record: Path) -> list[str]:
    """Unlink every recorded segment still in /dev/shm; returns their names.

    The record is the test's own (a fresh file per test), so whatever it names was made by the
    test's processes: a SIGKILLed server leaks its segments, as SGLang's does.
    """
    removed: list[str] = []
    for name in recorded_shm_names(record):
        with contextlib.suppress(FileNotFoundError):
            (shm.SHM_DIR / name).unlink()
            removed.append(name)
    return removed


def run_gpu_tool(
    module: str, *args: str, state_dir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """One of the simulated GPUs' commands (fake_gpu, fake_gpu_reset) run to its end, on the
    simulated GPUs in `state_dir` (None: none named, as for a user who forgot them)."""
    env = {k: v for k, v in os.environ.items() if k != "FAKE_GPU_STATE_DIR"}
    if state_dir is not None:
        env["FAKE_GPU_STATE_DIR"] = str(state_dir)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def fake_gpu(*args: str, state_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_gpu_tool("supervisor.testing.fake_gpu", *args, state_dir=state_dir)


class _Stranger(BaseHTTPRequestHandler):
    """Any server that answers 200 to everything (another SGLang, say); records what it got."""

    protocol_version = "HTTP/1.1"
    seen: list[str]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append(f"{self.command} {self.path}")
        body = json.dumps({"is_generation": True, "model_path": "someone/else"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer  # noqa: N815 - stdlib names


@contextlib.contextmanager
def stranger_on(port: int, host: str = "127.0.0.1") -> Iterator[list[str]]:
    """A foreign HTTP server on `port` (this test's process) for as long as the block runs;
    yields the requests it answered ("GET /health", ...)."""
    seen: list[str] = []
    handler = type("Stranger", (_Stranger,), {"seen": seen})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
