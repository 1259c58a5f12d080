"""Faults of the server's processes: every one is recovered from (the server ready again) or
ends the run with its documented exit code and a `fatal` event; the invariants hold either way.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.run_support import Supervisor
from tests.faults.support import assert_invariants, faulted, recovered, refused, stop
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def kill_rank(sig: int, rank: int = 1) -> Callable[[Supervisor], None]:
    def act(sup: Supervisor) -> None:
        sup.wait_event("ready")
        os.kill(sup.schedulers()[f"sglang::scheduler_TP{rank}"], sig)

    return act


def kill_main(sup: Supervisor) -> None:
    launched = sup.wait_event("server_launched")
    sup.wait_event("ready")
    os.kill(launched["pid"], signal.SIGKILL)


def ready_first(sup: Supervisor) -> None:
    sup.wait_event("ready")


def kill_escapee(sup: Supervisor) -> None:
    """A double-forked escapee dies while the server runs: its zombie is ours to reap."""
    sup.wait_event("ready")
    me = sup.proc.pid
    found = wait_until(
        lambda: next((p for p in sup.tree() if _parent(p) == me and _titled(p)), None),
        timeout_s=20,
        what="the escapee reparented to the supervisor",
    )
    assert found is not None
    os.kill(found, signal.SIGKILL)
    wait_until(lambda: _parent(found) != me, timeout_s=20, what="the escapee reaped")


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[1])


def _titled(pid: int) -> bool:
    try:
        return b"tokenizer_worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@dataclass(frozen=True)
class Fault:
    """`act` injects it into the running supervisor; then either `ready_count` readies are
    awaited and a stop must end the run with 0, or the run must end with `exit_code`."""

    act: Callable[[Supervisor], None] | None = None
    scenario: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    ready_count: int = 2
    exit_code: int | None = None
    reason: str = ""
    event: str | None = None  # an event the fault must have logged


FAULTS: dict[str, Fault] = {
    "rank SIGKILL": Fault(act=kill_rank(signal.SIGKILL), event="server_failed"),
    "rank SIGSTOP": Fault(act=kill_rank(signal.SIGSTOP, rank=0), event="unhealthy"),
    "rank SIGSEGV": Fault(act=kill_rank(signal.SIGSEGV), event="server_failed"),
    "main process SIGKILL": Fault(act=kill_main, event="server_failed"),
    # After ready is seen (the same death twice before ready would end the run with exit 4).
    "rank zombie": Fault(scenario={"zombie": {"rank": 1, "after_s": 1.5}}, event="unhealthy"),
    "health 503 after ready": Fault(scenario={"health_fail_after_s": 0.3}, event="unhealthy"),
    "health never answers": Fault(
        scenario={"health_fail_after_s": 0.3, "health_fail_mode": "no_answer"},
        run={"health_timeout": "2s", "failure_threshold": 1},  # /health's floor: two looks
        event="unhealthy",
    ),
    "setsid escapee at stop": Fault(
        act=ready_first,
        scenario={"orphan": {"kind": "setsid", "lifetime_s": 600}},
        ready_count=1,
    ),
    "double-forked escapee dies": Fault(
        act=kill_escapee,
        scenario={"orphan": {"kind": "double_fork", "lifetime_s": 600}},
        ready_count=1,
    ),
    # The same failure twice before the server was ever ready: a deterministic start failure,
    # not retried into a crash loop (exit 4, whatever the budget left).
    "exits at every start": Fault(
        scenario={"exit_code_on_start": 1},
        run={"max_restarts": 2},
        exit_code=4,
        reason="the same failure twice before ready",
    ),
    "rank dies at init with status 2": Fault(
        scenario={"exit_code_on_start": 2},
        run={"max_restarts": 1},
        exit_code=4,  # a crash, retried once: never taken for SGLang's own "bad flags" (3)
        reason="the same failure twice before ready",
    ),
    "SGLang rejects a flag": Fault(
        scenario={"bad_flags": ["--api-key"]}, exit_code=3, reason="unrecognized arguments"
    ),
    "load without progress": Fault(
        scenario={"startup_s": 60.0},
        run={"startup_stall_timeout": "1s", "max_restarts": 1},
        exit_code=4,
        reason="the same failure twice before ready: startup_stall",
    ),
    "load past the hard limit": Fault(
        scenario={"startup_s": 60.0},
        run={"startup_timeout": "1s"},
        exit_code=4,
        reason="not ready within startup_timeout",
    ),
    "server ignores SIGTERM": Fault(
        act=ready_first, scenario={"ignore_sigterm": True}, run={"stop_grace": "1s"}, ready_count=1
    ),
}


@pytest.mark.parametrize("name", list(FAULTS))
def test_a_process_fault_is_recovered_or_refused_and_leaves_nothing(
    name: str, tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    fault = FAULTS[name]
    with faulted(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario=fault.scenario,
        overrides={"run": fault.run},
    ) as sup:
        if fault.act is not None:
            fault.act(sup)
        if fault.exit_code is None:
            recovered(sup, fault.ready_count)
        else:
            refused(sup, fault.exit_code, fault.reason)
        if fault.event is not None:
            assert sup.events(fault.event), f"no {fault.event} event"
    assert_invariants(tmp_path, sup, shm_record)


def test_stop_of_a_ready_server_with_nothing_wrong(
    tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    """The baseline the matrix compares against: a clean stop leaves nothing either."""
    with faulted(tmp_path, free_port, simulated_process_guard) as sup:
        sup.wait_event("ready")
        stop(sup)
    assert_invariants(tmp_path, sup, shm_record)
