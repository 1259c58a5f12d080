"""One node of the LWS harness's group in one generation (a pod): its supervisor process, log,
ports and directories, read as an operator would (JSON log lines, HTTP, /proc)."""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from supervisor.testing.procs import cmdline, pids_with_env

T = TypeVar("T")

POD_ENV = "SGLANG_LWS_HARNESS_POD"


def poll_until(predicate: Callable[[], T | None], *, timeout_s: float, what: str) -> T:
    """Poll `predicate` every 20 ms until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    while not (last := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)  # polling a condition with a deadline
    return last


def pod_pids(pod: str) -> list[int]:
    """Live (non-zombie) processes whose environment names `pod`, or a pod below it
    ("group/g0/n1" is below "group" and "group/g0")."""
    exact, below = f"{POD_ENV}={pod}".encode(), f"{POD_ENV}={pod}/".encode()
    return pids_with_env(lambda env: any(item == exact or item.startswith(below) for item in env))


def http_get(port: int, path: str, *, timeout_s: float = 5.0) -> tuple[int, Any] | None:
    """GET http://127.0.0.1:port/path: (status, JSON body or text), None when nobody answers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read().decode(errors="replace")
    except (ConnectionError, TimeoutError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    try:
        return response.status, json.loads(body)
    except json.JSONDecodeError:
        return response.status, body


@dataclass
class NodeRun:
    """A node's supervisor in one generation; `pod` is the marker of every process it started."""

    node_rank: int
    generation: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    config_path: Path
    state_dir: Path
    gpu_dir: Path
    sglang_port: int
    http_port: int
    pod: str
    stopped_by_harness: bool = False  # it got SIGTERM from the harness (a deleted pod)
    leftover_pids: tuple[int, ...] = ()  # alive after the supervisor ended; SIGKILLed

    @property
    def is_leader(self) -> bool:
        return self.node_rank == 0

    @property
    def exit_code(self) -> int | None:
        return self.proc.poll()

    # -- the log -------------------------------------------------------------------------

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        out = []
        for line in self.log_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                event = json.loads(line)
                if isinstance(event, dict) and (name is None or event.get("event") == name):
                    out.append(event)
        return out

    def wait_event(self, name: str, count: int = 1, timeout_s: float = 60.0) -> dict[str, Any]:
        """The `count`-th `name` event, waited for; fails early when the supervisor ended."""

        def found() -> list[dict[str, Any]] | None:
            events = self.events(name)
            if len(events) >= count:
                return events
            if self.proc.poll() is not None and len(self.events(name)) < count:
                raise AssertionError(
                    f"node {self.node_rank} (generation {self.generation}) exited "
                    f"{self.proc.returncode} before {count} {name!r} event(s); log tail: "
                    f"{self.log_text()[-1500:]!r}"
                )
            return None

        what = f"{count} {name!r} event(s) of node {self.node_rank} gen {self.generation}"
        return poll_until(found, timeout_s=timeout_s, what=what)[count - 1]

    def launched_argv(self, count: int = 1) -> list[str]:
        """The SGLang argv of this supervisor's `count`-th launch (its `launching` event)."""
        argv: list[str] = self.wait_event("launching", count)["argv"]
        return argv

    def flag_value(self, flag: str, count: int = 1) -> str | None:
        """The value given to `flag` in the `count`-th launch (the last one when repeated)."""
        argv, value = self.launched_argv(count), None
        for i, arg in enumerate(argv):
            if arg == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
        return value

    # -- processes -----------------------------------------------------------------------

    def pids(self) -> list[int]:
        """Live processes of this pod, the supervisor included."""
        return pod_pids(self.pod)

    def tree(self) -> list[int]:
        """Live processes of this pod other than the supervisor (the server tree)."""
        return [pid for pid in self.pids() if pid != self.proc.pid]

    def schedulers(self) -> dict[str, int]:
        """The live SGLang ranks of this node, by process title."""
        titles = {pid: cmdline(pid) for pid in self.tree()}
        return {t: pid for pid, t in titles.items() if t.startswith("sglang::scheduler")}

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout_s: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"node {self.node_rank} (generation {self.generation}) still running after "
                f"{timeout_s} s; log tail: {self.log_text()[-1500:]!r}"
            ) from None

    # -- HTTP ----------------------------------------------------------------------------

    def get(self, path: str) -> tuple[int, Any] | None:
        """GET on this node's supervisor listener."""
        return http_get(self.http_port, path)

    def status(self, path: str) -> int | None:
        answer = self.get(path)
        return None if answer is None else answer[0]

    def sglang_status(self, path: str = "/health") -> int | None:
        """GET on this node's SGLang (node_rank >= 1: its dummy health server)."""
        answer = http_get(self.sglang_port, path)
        return None if answer is None else answer[0]

    def wait_status(self, path: str, status: int, timeout_s: float = 60.0) -> Any:
        """Poll the listener's `path` until it answers `status`; the body."""
        answer = poll_until(
            lambda: a if (a := self.get(path)) is not None and a[0] == status else None,
            timeout_s=timeout_s,
            what=f"{path} {status} on node {self.node_rank} gen {self.generation}",
        )
        return answer[1]
