"""run.gpu_repair's resets run in parallel off the loop: they overlap, the loop keeps ticking
(systemd's watchdog, the start timeout's extension) while a reset blocks, STATUS= tells the
progress, and a stop signal kills the resets still running and ends the wait.

Real threads and a real event queue; each blocking reset is released by the test (or by the
loop's own ticks), never by a sleep, and overlap is shown by order, not by time."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Sequence

import pytest
from structlog.testing import capture_logs

from supervisor.adapters.clock import SystemClock
from supervisor.adapters.events import QueueEvents, signal_event
from supervisor.core.gpu_release import GpuCheck, GpuCondition, ResetOutcome
from supervisor.run import gpu_repair
from supervisor.run.events import EventClock, StopRequested
from supervisor.run.gpu_repair import Resets, run_resets
from tests.fakes import FakeClock, ScriptedGpus, gpu

BOUND_S = 60.0  # how long any one step below may take before the test fails


class BlockingResetter:
    """Records "start N" / "end N" in `log`; a reset ends once `release` is set (or after
    BOUND_S: a failed outcome, so a test that never releases fails instead of hanging)."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.release = threading.Event()
        self.closed = False

    def reset(self, index: int, uuid: str, indices: Sequence[int] = ()) -> ResetOutcome:
        self.log.append(f"start {index}")
        released = self.release.wait(BOUND_S)
        self.log.append(f"end {index}")
        if self.closed:
            return ResetOutcome(ok=False, detail="killed: the supervisor is stopping")
        return ResetOutcome(ok=released, detail="reset" if released else "never released")

    def close(self) -> None:
        self.closed = True
        self.release.set()


def resets(
    resetter: BlockingResetter,
    clock: EventClock,
    indices: Sequence[int],
    status: Callable[[str], object] = lambda _text: None,
) -> tuple[Resets, dict[int, float], dict[int, str]]:
    sensor = ScriptedGpus(FakeClock(), lambda _now: tuple(gpu(i, 0) for i in indices))
    started = clock.monotonic()
    reset_at: dict[int, float] = {}
    failed: dict[int, str] = {}
    done = run_resets(
        [GpuCheck(index=i, uuid=f"GPU-{i}", condition=GpuCondition.RELEASING) for i in indices],
        sensor=sensor,
        resetter=resetter,
        live={},
        peer_sets=False,
        reset_at=reset_at,
        reset_failed=failed,
        clock=clock,
        elapsed=lambda: clock.monotonic() - started,
        reset_timeout_s=BOUND_S,
        status=status,
    )
    return done, reset_at, failed


def test_resets_of_several_gpus_overlap_and_the_loop_ticks_until_each_ended():
    log: list[str] = []
    resetter = BlockingResetter(log)

    def tick() -> None:
        log.append("tick")
        # Released by the loop itself, once both resets are running: neither can end before
        # the other started, so they ran at the same time.
        if {"start 0", "start 1"} <= set(log) and log.count("tick") >= 3:
            resetter.release.set()

    extensions: list[float] = []
    statuses: list[str] = []
    clock = EventClock(
        SystemClock(), QueueEvents(), on_tick=tick, extend=extensions.append, max_slice_s=0.01
    )
    with capture_logs() as logs:
        _, reset_at, failed = resets(resetter, clock, (0, 1), statuses.append)
    assert failed == {}
    assert sorted(reset_at) == [0, 1]
    first_end = min(log.index("end 0"), log.index("end 1"))
    assert max(log.index("start 0"), log.index("start 1")) < first_end
    assert "tick" in log[max(log.index("start 0"), log.index("start 1")) : first_end]
    assert extensions  # EXTEND_TIMEOUT_USEC was asked for while they ran
    assert statuses[0].startswith("resetting GPU(s) 0, 1: 0 of 2 done; ")
    assert statuses[-1].startswith("resetting GPU(s) 0, 1: 2 of 2 done")
    names = [e["event"] for e in logs]
    assert names.count("gpu_reset_started") == 2
    assert names.count("gpu_reset_done") == 2
    assert names.index("gpu_reset_done") > names.index("gpu_reset_started", 1)


def test_a_stop_signal_during_resets_kills_them_and_ends_the_wait():
    log: list[str] = []
    resetter = BlockingResetter(log)
    events = QueueEvents()

    def tick() -> None:
        if {"start 0", "start 1"} <= set(log):  # both running: the operator stops the unit
            events.put(signal_event(signal.SIGTERM))

    clock = EventClock(SystemClock(), events, on_tick=tick, max_slice_s=0.01)
    with capture_logs() as logs, pytest.raises(StopRequested):
        resets(resetter, clock, (0, 1))
    assert resetter.closed
    assert sorted(log[-2:]) == ["end 0", "end 1"]  # both workers ended before the raise
    failed = [e for e in logs if e["event"] == "gpu_reset_failed"]
    assert len(failed) == 2
    assert all("stopping" in e["detail"] for e in failed)


def test_a_refused_plan_runs_no_reset():
    log: list[str] = []
    resetter = BlockingResetter(log)
    clock = EventClock(SystemClock(), QueueEvents(), max_slice_s=0.01)
    sensor = ScriptedGpus(FakeClock(), lambda _now: (gpu(0, 0, 4242),))
    done = run_resets(
        [GpuCheck(index=0, uuid="GPU-0", condition=GpuCondition.RELEASING)],
        sensor=sensor,
        resetter=resetter,
        live={0: (4242,)},
        peer_sets=False,
        reset_at={},
        reset_failed={},
        clock=clock,
        elapsed=clock.monotonic,
        reset_timeout_s=BOUND_S,
    )
    assert "running processes 4242" in done.refusal
    assert log == []


def test_a_reset_that_never_ends_is_failed_at_the_bound_and_the_wait_goes_on(monkeypatch):
    """Each reset is bounded by its own timeout; this bound is for a bug in one (its worker is
    left behind, the run ends with exit 6): it must not hold the loop forever."""
    monkeypatch.setattr(gpu_repair, "RESET_SLACK_S", 0.0)
    log: list[str] = []
    resetter = BlockingResetter(log)  # released only after the wait gave up
    clock = EventClock(SystemClock(), QueueEvents(), max_slice_s=0.01)
    sensor = ScriptedGpus(FakeClock(), lambda _now: (gpu(0, 0),))
    failed: dict[int, str] = {}
    try:
        with capture_logs() as logs:
            run_resets(
                [GpuCheck(index=0, uuid="GPU-0", condition=GpuCondition.RELEASING)],
                sensor=sensor,
                resetter=resetter,
                live={},
                peer_sets=False,
                reset_at={},
                reset_failed=failed,
                clock=clock,
                elapsed=clock.monotonic,
                reset_timeout_s=0.05,
            )
    finally:
        resetter.release.set()
    assert "did not end within 0.05 s" in failed[0]
    assert [e["event"] for e in logs] == ["gpu_reset_started", "gpu_reset_failed"]
