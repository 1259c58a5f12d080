"""Signals to the supervisor at every moment: each one has a defined answer (stop with a drain,
ignore, report), none kills it without one, and a supervisor killed outright is cleaned up after
by the next one."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.run_support import Supervisor, marked_pids
from tests.faults.support import assert_invariants, faulted, recovered, stop
from tests.testing.support import leaked
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def answered(sig: int, event: str | None) -> Callable[[Supervisor], None]:
    """`sig` to a ready supervisor: answered with `event` (None: silently), the server untouched."""

    def act(sup: Supervisor) -> None:
        sup.wait_event("ready")
        before = sup.schedulers()
        sup.signal(sig)
        if sig != signal.SIGUSR1:  # (two USR1s at once may merge into one delivery)
            sup.signal(signal.SIGUSR1)
        sup.wait_event("status")
        # A `sig` still pending now is delivered before the SIGTERM below (lower numbers
        # first): had it killed the supervisor, the exit would not be 0.
        if event is not None:
            assert sup.events(event)
        assert sup.schedulers() == before
        stop(sup)

    return act


def stops(sig: int, when: str) -> Callable[[Supervisor], None]:
    def act(sup: Supervisor) -> None:
        sup.wait_event(when)
        sup.signal(sig)
        assert sup.wait_exit(timeout_s=60) == 0
        assert sup.events("stopped")

    return act


def stop_during_backoff(sup: Supervisor) -> None:
    sup.wait_event("ready")
    os.kill(sup.schedulers()["sglang::scheduler_TP1"], signal.SIGKILL)
    sup.wait_event("restarting")
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(timeout_s=60) == 0
    assert len(sup.events("launching")) == 1


SIGNALS: dict[str, tuple[Callable[[Supervisor], None], dict[str, object]]] = {
    "SIGHUP": (answered(signal.SIGHUP, "reloaded"), {}),  # the same file: nothing changed
    "SIGUSR1": (answered(signal.SIGUSR1, "status"), {}),
    "SIGUSR2": (answered(signal.SIGUSR2, None), {}),
    "SIGPIPE": (answered(signal.SIGPIPE, None), {}),
    "SIGQUIT when ready": (stops(signal.SIGQUIT, "ready"), {}),
    "SIGINT when ready": (stops(signal.SIGINT, "ready"), {}),
    "SIGTERM while loading": (stops(signal.SIGTERM, "loading"), {"scenario": {"startup_s": 60}}),
    "SIGTERM during the backoff": (
        stop_during_backoff,
        {"run": {"backoff_initial": "60s", "backoff_max": "60s"}},
    ),
}


@pytest.mark.parametrize("name", list(SIGNALS))
def test_a_signal_has_its_defined_answer_and_leaves_nothing(
    name: str, tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    act, extra = SIGNALS[name]
    scenario = extra.get("scenario")
    run = extra.get("run", {})
    assert scenario is None or isinstance(scenario, dict)
    assert isinstance(run, dict)
    with faulted(
        tmp_path, free_port, simulated_process_guard, scenario=scenario, overrides={"run": run}
    ) as sup:
        act(sup)
    assert_invariants(tmp_path, sup, shm_record)


def test_a_supervisor_killed_outright_with_its_tree_is_cleaned_up_after_by_the_next(
    tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    """The supervisor and its whole tree SIGKILLed at once (the OOM killer, a cgroup kill):
    nothing drains, SGLang's shared memory stays, and the next start, which knows the dead
    tree's PIDs and start times from the state file, removes it."""
    state_dir = tmp_path / "state"
    with faulted(tmp_path, free_port, simulated_process_guard, state_dir=state_dir) as first:
        first.wait_event("ready")
        everyone = marked_pids(simulated_process_guard)
        for pid in everyone:  # stopped first: no process may clean up after another
            os.kill(pid, signal.SIGSTOP)
        for pid in everyone:
            os.kill(pid, signal.SIGKILL)
        first.wait_exit()
        wait_until(lambda: not marked_pids(simulated_process_guard), timeout_s=10, what="all gone")
    assert leaked(shm_record) != [], "the killed tree left its segments (as SGLang's does)"
    with faulted(tmp_path, free_port, simulated_process_guard, state_dir=state_dir) as second:
        recovered(second, ready_count=1)
        assert second.events("shm_removed")
    assert_invariants(tmp_path, second, shm_record)
