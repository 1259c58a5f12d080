"""Run the real `python -m supervisor run` against the simulated SGLang server.

The supervisor logs JSON lines to a file; tests wait on its events. Processes of a test carry
the leak guard's marker in their environment (tests/conftest.py), which is how "no process of
the tree left" is checked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.adapters.cgroup import CgroupError, discover
from supervisor.testing.lws_config import DEFAULT_CONFIG, config_toml, merge
from supervisor.testing.procs import cmdline, pids_with_env
from tests.cgroups import remove_instance_cgroups
from tests.testing.support import MARKER_ENV, fake_server_env
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
MODEL_CONFIG = ROOT / "configs" / "models" / "llama-3-70b" / "config.json"
SERVER_COMMAND = f"{sys.executable} -m supervisor.testing.fake_sglang"

# Tiny timings: health every 0.2 s, a restart after 0.1 s; pre-flight overheads shrunk so the
# simulated 2-rank server fits any test machine; the watchdog and GPUs are other tests' subject.
# {name}-style placeholders are filled per test; `overrides` replace keys, section by section.
CONFIG: dict[str, dict[str, Any]] = {
    "server": {"model_config": "{model_config}", "env": {"HF_TOKEN": "hf_e2e_secret_token"}},
    "preflight": dict(DEFAULT_CONFIG["preflight"]),  # the harness's: tiny overheads, own ledger
    "run": {
        "name": "{name}",
        "state_dir": "{state_dir}",
        "cgroup": "{cgroup}",
        "health_interval": "0.2s",
        "health_timeout": "2s",
        "failure_threshold": 3,
        "stop_grace": "5s",
        "backoff_initial": "0.1s",
        "backoff_max": "0.4s",
        "startup_stall_timeout": "30s",
    },
    "watchdog": {"enabled": False},
    "gpu": {"backend": "{backend}", "release_timeout": "20s"},
}


def config_text(
    fill: Mapping[str, str], overrides: Mapping[str, Mapping[str, Any]] | None = None
) -> str:
    """The TOML config: CONFIG with `overrides` applied (a value None drops the key)."""
    return config_toml(merge(CONFIG, overrides or {}), fill)


@dataclass
class Supervisor:
    proc: subprocess.Popen[bytes]
    log_path: Path
    state_dir: Path
    port: int
    marker: str
    notify: socket.socket | None = None
    datagrams: list[str] = field(default_factory=list)

    # -- reading -------------------------------------------------------------------------

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        out = []
        for line in self.log_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict) and (name is None or event.get("event") == name):
                out.append(event)
        return out

    # A bound against a hang, never a speed expectation: a start beside two busy cores and a
    # loaded suite took over 30 s (6.6 s for the GPU health read alone), and a passing story
    # never waits it out.
    def wait_event(self, name: str, count: int = 1, timeout_s: float = 120.0) -> dict[str, Any]:
        events = wait_until(
            lambda: found if len(found := self.events(name)) >= count else None,
            timeout_s=timeout_s,
            what=f"{count} {name!r} event(s)",
            context=lambda: f"log tail: {self.log_text()[-1500:]!r}",
        )
        assert events is not None
        return events[count - 1]

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state_dir / "state.json").read_text())
        return data

    def received(self) -> list[str]:
        """sd_notify datagrams received so far."""
        assert self.notify is not None
        while True:
            try:
                self.datagrams.append(self.notify.recv(4096).decode())
            except BlockingIOError:
                return self.datagrams

    def tree(self) -> list[int]:
        """Live processes of this test other than the supervisor (the server tree)."""
        return [pid for pid in marked_pids(self.marker) if pid != self.proc.pid]

    def schedulers(self) -> dict[str, int]:
        """The ranks by title; a child still carrying its parent's title (a scheduler's init
        fork) is left out."""
        out = {}
        for pid in self.tree():
            title = cmdline(pid)
            if title.startswith("sglang::scheduler") and cmdline(_parent(pid)) != title:
                out[title] = pid
        return out

    # -- acting --------------------------------------------------------------------------

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout_s: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout_s)


def _parent(pid: int) -> int:
    """The parent's PID from /proc/PID/stat (the field after the parenthesised name); 0 once
    the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def marked_pids(marker: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries the test's marker."""
    needle = f"{MARKER_ENV}={marker}".encode()
    return pids_with_env(lambda env: needle in env)


# The whole e2e suite runs once per containment: scripts/test sets this to "off" for the /proc
# run; "auto" uses a cgroup where this machine allows one (root, cgroup v2 mounted).
CONTAINMENT = os.environ.get("SGLANG_SUPERVISOR_E2E_CGROUP", "auto")


def expected_cgroup_mode() -> str:
    """What `cgroup = "auto"` gives here: a cgroup for root where v2 is mounted, else /proc."""
    try:
        host = discover()
    except CgroupError:
        return "/proc"
    if os.geteuid() != 0:
        return "/proc"
    offered = (host.v2_dir / "cgroup.controllers").read_text().split()
    if "memory" in offered:
        return "cgroup v2"
    return "cgroup v2 + v1 memory" if host.memory_v1_dir else "cgroup v2, memory from /proc"


def instance_name(tmp_path: Path) -> str:
    """One instance name per test: leftover cleanup kills processes of the same instance, and
    cgroups are named after it, so two suites running at once on one machine never share it."""
    return "e2e-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:10]


def write_config(
    tmp_path: Path,
    state_dir: Path,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    backend: str = "none",
) -> Path:
    path = tmp_path / f"run-{uuid.uuid4().hex[:6]}.toml"
    fill = {
        "model_config": str(MODEL_CONFIG),
        "state_dir": str(state_dir),
        "backend": backend,
        "name": instance_name(tmp_path),
        "cgroup": CONTAINMENT,
    }
    path.write_text(config_text(fill, overrides))
    return path


@contextlib.contextmanager
def supervisor(
    tmp_path: Path,
    port: int,
    marker: str,
    *,
    scenario: Mapping[str, Any] | None = None,
    server_args: Sequence[str] = ("--tp", "2"),
    options: Sequence[str] = (),
    state_dir: Path | None = None,
    notify: bool = False,
    gpu_state_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    wrapper: Sequence[str] = (),
) -> Iterator[Supervisor]:
    """Start `python -m supervisor run` on the simulated server; at exit make sure that it and
    its tree are gone (SIGKILL whatever is left, then wait for the tree). `overrides` replace
    keys of the TOML config; `wrapper` is a command the supervisor runs under (`unshare`)."""
    state_dir = state_dir or tmp_path / "state"
    backend = "sim" if gpu_state_dir else "none"
    config = write_config(tmp_path, state_dir, overrides, backend=backend)
    log_path = tmp_path / f"supervisor-{uuid.uuid4().hex[:6]}.log"
    env = {**fake_server_env(scenario, state_dir=gpu_state_dir), **(env or {})}
    notify_sock = None
    if notify:
        notify_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        name = f"sglang-supervisor-e2e-{uuid.uuid4().hex}"
        notify_sock.bind(b"\0" + name.encode())
        notify_sock.setblocking(False)
        env["NOTIFY_SOCKET"] = "@" + name
    argv = [
        *wrapper,
        sys.executable,
        "-m",
        "supervisor",
        "run",
        "--config",
        str(config),
        "--server-command",
        SERVER_COMMAND,
        "--log-format",
        "json",
        *options,
        "--",
        "--model-path",
        "fake/model",
        "--port",
        str(port),
        *server_args,
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    sup = Supervisor(proc, log_path, state_dir, port, marker, notify=notify_sock)
    passed = False
    try:
        yield sup
        passed = True
    finally:
        exited_itself = proc.poll() is not None and proc.returncode != -signal.SIGKILL
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        for pid in marked_pids(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if notify_sock is not None:
            notify_sock.close()
        left = remove_instance_cgroups(instance_name(tmp_path))
        if left and passed and exited_itself:
            raise AssertionError(f"the supervisor left cgroups behind (removed now): {left}")
