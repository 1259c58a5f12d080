"""The fault matrix's harness: one real `sglang-supervisor run` per fault against the simulated
server, the documented outcome asserted (recovered, or the named exit code with a `fatal`
event), then the invariants every fault must leave intact.

Invariants, checked after the supervisor has exited:
- no process of the test is left (the leak guard's marker, through the supervisor too);
- no /dev/shm segment the simulated server made is left (FAKE_SGLANG_SHM_RECORD);
- state.json, when there is one, is a valid state file;
- no secret (the api key, the config's HF token, a password in the supervisor's environment)
  is in any file the run wrote: logs, state, incidents, ledger.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from supervisor.run.state import STATE_FILE, RunState
from tests.e2e.run_support import Supervisor, marked_pids, supervisor
from tests.testing.support import leaked
from tests.waiting import wait_until

API_KEY = "sk-fault-api-key-1234567"
HF_TOKEN = "hf_e2e_secret_token"  # tests/e2e/run_support.py CONFIG's [server] env
PASSWORD = "pw-fault-secret-9876"  # in the supervisor's own environment (systemd Environment=)
SECRETS = (API_KEY, HF_TOKEN, PASSWORD)
SERVER_ARGS = ("--tp", "2", "--api-key", API_KEY)
ENV = {"FAULT_DB_PASSWORD": PASSWORD}


@contextlib.contextmanager
def faulted(
    tmp_path: Path,
    port: int,
    marker: str,
    *,
    scenario: Mapping[str, Any] | None = None,
    options: Sequence[str] = (),
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    gpus: Path | None = None,
    env: Mapping[str, str] | None = None,
    state_dir: Path | None = None,
    server_args: Sequence[str] = SERVER_ARGS,
) -> Iterator[Supervisor]:
    """`run` with the fault's scenario, config and environment, secrets everywhere."""
    with supervisor(
        tmp_path,
        port,
        marker,
        scenario=scenario,
        server_args=server_args,
        options=options,
        overrides=overrides,
        gpu_state_dir=gpus,
        env={**ENV, **(env or {})},
        state_dir=state_dir,
    ) as sup:
        yield sup


def recovered(sup: Supervisor, ready_count: int = 2, timeout_s: float = 60.0) -> None:
    """The server came back (its `ready_count`-th ready), then a stop ends the run with 0."""
    sup.wait_event("ready", count=ready_count, timeout_s=timeout_s)
    stop(sup)


def stop(sup: Supervisor) -> None:
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(timeout_s=60) == 0, sup.log_text()[-2000:]


def refused(sup: Supervisor, code: int, reason: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """The run ended with `code`, its last event `fatal` naming the reason."""
    assert sup.wait_exit(timeout_s=timeout_s) == code, sup.log_text()[-2000:]
    events = [e for e in sup.events() if e.get("event") != "server_output"]
    fatal = events[-1]
    assert fatal["event"] == "fatal", events[-3:]
    assert fatal["exit_code"] == code
    assert reason in fatal["reason"] + fatal.get("detail", ""), fatal
    return fatal


def assert_invariants(
    tmp_path: Path, sup: Supervisor, shm_record: Path, secrets: Sequence[str] = SECRETS
) -> None:
    assert sup.proc.poll() is not None, "the supervisor must have exited"
    left = wait_until(lambda: not marked_pids(sup.marker), timeout_s=10, what="every process gone")
    assert left, f"processes left: {marked_pids(sup.marker)}"
    assert leaked(shm_record) == [], "shared memory left in /dev/shm"
    state = sup.state_dir / STATE_FILE
    if state.is_file():
        RunState.from_json(json.loads(state.read_text()))
    for path in written_files(tmp_path):
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, f"{secret!r} revealed in {path}"


def written_files(tmp_path: Path) -> list[Path]:
    """Everything the run wrote under the test's directory; the configs given are not."""
    return [
        p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink() and p.suffix != ".toml"
    ]
