"""Fixtures shared by the whole suite: the simulated-process leak guard, simulated GPUs, ports,
and a launcher for the simulated SGLang server (supervisor/testing)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest
import structlog

from supervisor import log as sup_log
from supervisor.adapters.processes import default_signal_dispositions
from supervisor.testing import gpu_state, shm
from tests.testing.support import (
    MARKER_ENV,
    TEST_BYTES_PER_GB,
    FakeServer,
    fake_server_argv,
    remove_recorded_shm,
)
from tests.testing.support import fake_server_env as _fake_server_env

# Processes that are already dying (PDEATHSIG, a killed group) get this long to disappear before
# the guard calls them leaked. Orphans live 20 s by default, so a forgotten one is still caught.
_LEAK_GRACE_S = 3.0


def _marked_processes(token: str) -> list[psutil.Process]:
    """Processes carrying this test's marker in their environment, or titled sglang:: below us."""
    needle = f"{MARKER_ENV}={token}".encode()
    me = os.getpid()
    found: dict[int, psutil.Process] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            try:
                found[int(entry.name)] = psutil.Process(int(entry.name))
            except psutil.NoSuchProcess:
                continue
    for child in psutil.Process(me).children(recursive=True):
        try:
            cmdline = child.cmdline()
        except psutil.Error:
            continue
        if cmdline and cmdline[0].startswith("sglang::"):
            found[child.pid] = child
    return [p for p in found.values() if _alive(p)]


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {' '.join(proc.cmdline()).strip()[:80]!r}"
    except psutil.Error:
        return str(proc.pid)


@pytest.fixture(autouse=True)
def _structlog_as_it_was() -> Iterator[None]:
    """A CLI call in-process configures logging onto this test's captured stderr, which pytest
    closes afterwards: every later log call would fail. Put the configuration back, with the
    format errors are reported in and the event tap's sinks."""
    saved = structlog.get_config()
    saved_format, saved_sinks = sup_log._format, sup_log._sinks
    yield
    structlog.configure(**saved)
    sup_log._format, sup_log._sinks = saved_format, saved_sinks


@pytest.fixture(autouse=True)
def simulated_process_guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Give every test a marker, and fail it if a process carrying the marker survives it.

    The marker (FAKE_SGLANG_MARKER=<token>) is set in os.environ, so every process the test
    starts inherits it, through the supervisor too; the simulated processes keep it readable in
    /proc/PID/environ. Survivors are SIGKILLed, then the test fails naming them.
    """
    token = uuid.uuid4().hex
    monkeypatch.setenv(MARKER_ENV, token)
    yield token
    _check_processes(token)


def _check_processes(token: str) -> None:
    deadline = time.monotonic() + _LEAK_GRACE_S
    survivors = _marked_processes(token)
    while survivors and time.monotonic() < deadline:
        time.sleep(0.05)  # polling for processes already on their way out (bounded)
        survivors = _marked_processes(token)
    if not survivors:
        return
    names = [_describe(p) for p in survivors]
    for proc in survivors:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            continue
    psutil.wait_procs(survivors, timeout=5)
    pytest.fail(f"test left simulated processes alive (killed now): {'; '.join(names)}")


@pytest.fixture
def free_port() -> int:
    """A loopback TCP port that was free a moment ago (bound to port 0, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def make_gpu_state(tmp_path: Path) -> Callable[..., Path]:
    """Factory: make_gpu_state(count=8, total_bytes=..., numa_nodes=2) -> a FAKE_GPU_STATE_DIR."""

    def make(count: int = 8, **kwargs: Any) -> Path:
        directory = tmp_path / f"gpus-{uuid.uuid4().hex[:8]}"
        gpu_state.create_gpus(directory, count, **kwargs)
        return directory

    return make


@pytest.fixture
def gpu_state_dir(make_gpu_state: Callable[..., Path]) -> Path:
    """Eight simulated H200s (143771 MiB each) over two NUMA nodes (GPUs 0-3 on node 0)."""
    return make_gpu_state(8, numa_nodes=2)


@pytest.fixture
def fake_server_env() -> Callable[..., dict[str, str]]:
    """fake_server_env(scenario=None, *, state_dir=None, bytes_per_gb=16384) -> env for a launch.

    The env is os.environ (which carries this test's leak marker) plus FAKE_SGLANG_SCENARIO,
    FAKE_SGLANG_BYTES_PER_GB (16 KiB per simulated GB) and FAKE_GPU_STATE_DIR.
    """
    return _fake_server_env


@pytest.fixture
def start_fake_server(tmp_path: Path, free_port: int) -> Iterator[Callable[..., FakeServer]]:
    """start_fake_server(args, scenario=None, *, state_dir=None, bytes_per_gb=16384, port=...)

    Launches `python -m supervisor.testing.fake_sglang [--model-path fake/model] --port PORT
    *args` in its own session (as the supervisor does), stderr+stdout to a log file; every
    server is SIGKILLed with its group at teardown.
    """
    started: list[FakeServer] = []

    def start(
        args: Sequence[str] = (),
        scenario: Mapping[str, Any] | None = None,
        *,
        state_dir: Path | None = None,
        bytes_per_gb: int = TEST_BYTES_PER_GB,
        port: int | None = None,
    ) -> FakeServer:
        port = free_port if port is None and not started else port
        if port is None:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
        log_path = tmp_path / f"fake-sglang-{len(started)}.log"
        has_model = any(a.split("=")[0] in ("--model-path", "--model") for a in args)
        argv = [*([] if has_model else ["--model-path", "fake/model"]), "--port", str(port), *args]
        env = _fake_server_env(scenario, state_dir=state_dir, bytes_per_gb=bytes_per_gb)
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                fake_server_argv(argv),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=default_signal_dispositions,  # as the supervisor starts it
            )
        server = FakeServer(proc=proc, port=port, log_path=log_path)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(autouse=True)
def shm_record(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """$FAKE_SGLANG_SHM_RECORD for the test: every simulated process it starts (directly or
    through the supervisor) records its /dev/shm segments there; at teardown, after the servers
    were killed, the recorded segments still present are unlinked and the record removed. A
    test that asserts "nothing leaked" reads the record itself (tests.testing.support).
    """
    fd, name = tempfile.mkstemp(prefix="fake-sglang-shm-", suffix=".txt")
    os.close(fd)
    record = Path(name)
    monkeypatch.setenv(shm.RECORD_ENV, str(record))
    try:
        yield record
    finally:
        remove_recorded_shm(record)
        record.unlink(missing_ok=True)
