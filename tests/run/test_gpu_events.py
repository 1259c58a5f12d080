"""run.gpu_events: driver events while serving, judged and acted on (kill, incident, the run
loop told; a reboot or drain ends the run; a reset before the relaunch), on fakes."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from supervisor.adapters.clock import SystemClock
from supervisor.core.classify import Classification, FailureKind
from supervisor.core.events import Event, MemoryAction, WatchdogEvent
from supervisor.core.gpu_health import EventKind, GpuEvent, RecoveryAction
from supervisor.core.ports import Clock
from supervisor.core.sglang_args import parse_launch_args
from supervisor.errors import ExitCode, GpuUnrecoverable
from supervisor.memory.incident import opener
from supervisor.run.death import DeathReport
from supervisor.run.gpu_events import GpuEventGuard, GpuEventWatch, merged, watch_plugins
from supervisor.run.plugins import LaunchInfo, Plugins
from supervisor.run.state import StateStore
from tests.fakes import FakeServer
from tests.waiting import wait_until

ARGV = ("--model-path", "m", "--tp-size", "2")  # GPUs 0 and 1


def xid(code: int, gpu: int = 0, action: RecoveryAction | None = None) -> GpuEvent:
    return GpuEvent(
        index=gpu, uuid=f"GPU-{gpu}", kind=EventKind.XID, code=code, at_s=1.0e9,
        recovery_action=action,
    )  # fmt: skip


class Launch:
    """One launch watched by a guard: the server, what was posted, the incidents written."""

    def __init__(self, tmp_path: Path) -> None:
        self.store = StateStore(tmp_path)
        self.store.ensure_writable()
        self.state_dir = tmp_path
        self.guard = GpuEventGuard(self.store, lambda _ms: (), opener(tmp_path, "gpu_xid"))
        self.server = FakeServer(pid=100, run_id="r1", ranks=2)
        self.posted: list[Event] = []
        info = LaunchInfo(run_id="r1", argv=ARGV, plan=parse_launch_args(ARGV), fit=None)
        self.watch = self.guard.watch_for(self.server, self.posted.append, info)

    def incidents(self) -> list[dict[str, Any]]:
        files = sorted(self.state_dir.glob("incident-*-gpu_xid-*.json"))
        return [json.loads(f.read_text()) for f in files]

    def death(self, kind: FailureKind) -> DeathReport:
        return DeathReport(
            run_id="r1",
            classification=Classification(kind, "hint"),
            exit_status=None,
            was_ready=True,
            pids=(101, 102),
            argv=ARGV,
            plan=parse_launch_args(ARGV),
            fit=None,
        )


@pytest.fixture
def launch(tmp_path: Path) -> Launch:
    return Launch(tmp_path)


def test_a_critical_xid_kills_the_group_writes_an_incident_and_tells_the_run_loop(launch: Launch):
    with capture_logs() as logs:
        launch.guard.on_event(xid(79, gpu=1), True)
    (reason,) = launch.server.reasons
    assert reason.failure is FailureKind.GPU_XID_FATAL
    assert "Xid 79 on GPU 1" in reason.detail
    assert "reboot" in reason.detail
    (posted,) = launch.posted
    assert isinstance(posted, WatchdogEvent)
    assert (posted.action, posted.failure) == (MemoryAction.KILLED, FailureKind.GPU_XID_FATAL)
    assert posted.reason == reason.detail
    (incident,) = launch.incidents()
    assert incident["kind"] == "gpu_xid"
    assert incident["gpu_event"]["gpu"] == 1
    assert incident["gpu_event"]["xid"] == 79
    assert incident["gpu_event"]["meaning"] == "GPU has fallen off the bus"
    assert incident["gpu_event"]["recovery_action"] == "node_reboot"
    assert incident["xid_counts"] == {"79": 1}
    assert posted.incident_path is not None
    assert posted.incident_path.endswith(".json")
    (logged,) = [e for e in logs if e["event"] == "gpu_event"]
    assert logged["log_level"] == "error"
    assert (logged["gpu"], logged["xid"], logged["decision"]) == (1, 79, "reboot")


def test_a_dbe_asks_for_a_reset_and_a_restart_not_an_end(launch: Launch):
    launch.guard.on_event(xid(48, action=RecoveryAction.GPU_RESET), True)
    assert launch.server.reasons[0].failure is FailureKind.GPU_XID
    assert launch.guard.reset_gpus == {0}
    launch.guard.on_death(launch.death(FailureKind.GPU_XID))  # no end of the run


@pytest.mark.parametrize(("code", "gpu"), [(13, 0), (43, 1), (79, 5), (48, 7)])
def test_application_xids_and_other_gpus_events_are_only_logged(
    launch: Launch, code: int, gpu: int
):
    with capture_logs() as logs:
        launch.guard.on_event(xid(code, gpu=gpu), True)
    assert launch.server.reasons == []
    assert launch.posted == []
    assert launch.incidents() == []
    (logged,) = logs
    assert logged["event"] == "gpu_event"
    assert logged["decision"] == ("ignore" if gpu in (0, 1) else "log")
    assert logged["log_level"] == ("warning" if gpu in (0, 1) else "info")
    assert launch.guard.xid_counts[gpu][code] == 1


def test_a_worse_event_after_the_kill_ends_the_run_at_the_death_hook(launch: Launch):
    launch.guard.on_event(xid(48), True)
    launch.guard.on_event(xid(79, gpu=1), True)
    assert len(launch.server.reasons) == 1  # one kill
    assert len(launch.posted) == 1
    (incident,) = launch.incidents()
    assert [step["step"] for step in incident["next"]] == ["escalated"]
    with pytest.raises(GpuUnrecoverable) as err:
        launch.guard.on_death(launch.death(FailureKind.GPU_XID))
    assert err.value.exit_code is ExitCode.GPU_UNRECOVERABLE
    assert "reboot" in str(err.value)
    assert launch.store.load().last_failure == FailureKind.GPU_XID_FATAL.value
    steps = [step["step"] for step in launch.incidents()[0]["next"]]
    assert steps == ["escalated", "classified", "not_relaunched"]


def test_a_fatal_classification_is_left_to_the_restart_decision(launch: Launch):
    launch.guard.on_event(xid(79), True)
    # No raise here: the death is already classified gpu_xid_fatal, and backoff ends the run.
    launch.guard.on_death(launch.death(FailureKind.GPU_XID_FATAL))
    steps = [step["step"] for step in launch.incidents()[0]["next"]]
    assert steps[-1] == "classified"
    assert "not_relaunched" not in steps


class Release:
    """GpuRelease as the relaunch hook uses it: the resetter, and the waits it was asked for."""

    def __init__(self, resetter: object | None) -> None:
        self.resetter = resetter
        self.waits: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def wait(self, old_pids: Sequence[int], clock: Clock, *, reset: Sequence[int] = ()) -> None:
        self.waits.append((tuple(old_pids), tuple(reset)))


def test_before_the_relaunch_the_gpus_an_event_asked_a_reset_for_are_reset(launch: Launch):
    launch.guard.on_event(xid(48, gpu=1), True)
    launch.guard.on_event(xid(95, gpu=0), True)  # after the kill: its GPU is reset as well
    release = Release(resetter=object())
    launch.guard.before_relaunch(release, (101, 102), SystemClock())  # type: ignore[arg-type]
    assert release.waits == [((101, 102), (0, 1))]
    assert launch.incidents()[0]["next"][-1] == {
        "step": "gpu_reset",
        "at": launch.incidents()[0]["next"][-1]["at"],
        "gpus": [0, 1],
    }
    launch.guard.before_relaunch(release, (), SystemClock())  # type: ignore[arg-type]
    assert len(release.waits) == 1  # once


def test_a_restart_needs_no_reset_and_a_reset_without_a_command_ends_the_run(launch: Launch):
    launch.guard.on_event(xid(32), True)  # restart: nothing to reset
    release = Release(resetter=None)
    launch.guard.before_relaunch(release, (101,), SystemClock())  # type: ignore[arg-type]
    assert release.waits == []
    launch.guard.on_event(xid(48, gpu=1), True)
    with pytest.raises(GpuUnrecoverable) as err:
        launch.guard.before_relaunch(release, (101,), SystemClock())  # type: ignore[arg-type]
    assert "reset_command is not set" in str(err.value)
    assert "Xid 48 on GPU 1" in str(err.value)


def test_a_fault_read_after_the_server_died_ends_the_run_before_the_relaunch(launch: Launch):
    """The server crashed of it first (rank_crash); the event came in the watch's last read."""
    launch.guard.on_death(launch.death(FailureKind.RANK_CRASH))  # nothing known yet
    launch.guard.on_event(xid(79, gpu=1), False)
    assert launch.server.reasons == []  # the tree is gone: no kill, no post
    assert launch.posted == []
    assert len(launch.incidents()) == 1
    with pytest.raises(GpuUnrecoverable, match="reboot"):
        launch.guard.before_relaunch(Release(object()), (), SystemClock())  # type: ignore[arg-type]


def test_the_next_launch_starts_clean_and_the_incident_records_the_relaunch(launch: Launch):
    launch.guard.on_event(xid(48), True)
    info = LaunchInfo(run_id="r2", argv=ARGV, plan=parse_launch_args(ARGV), fit=None)
    launch.guard.watch_for(FakeServer(pid=200, run_id="r2", ranks=2), launch.posted.append, info)
    assert launch.guard.decision is None
    assert launch.guard.reset_gpus == set()
    assert launch.incidents()[0]["next"][-1]["step"] == "relaunched"
    assert launch.guard.xid_counts[0][48] == 1  # the counts are the run's


def test_the_watch_thread_hands_on_each_event_and_reads_once_more_after_the_stop():
    batches: list[tuple[GpuEvent, ...]] = [(xid(13),), (), (xid(31), xid(43))]
    calls: list[int] = []
    seen: list[tuple[int, bool]] = []
    stopped = threading.Event()

    def read(wait_ms: int) -> tuple[GpuEvent, ...] | None:
        calls.append(wait_ms)
        if stopped.is_set():
            return (xid(45),)
        return batches.pop(0) if batches else None

    watch = GpuEventWatch(read, lambda e, serving: seen.append((e.code, serving)), poll_s=0.01)
    watch.start()
    wait_until(lambda: len(seen) >= 3, timeout_s=10, what="three events handed on")
    stopped.set()
    watch.stop()
    assert seen == [(13, True), (31, True), (43, True), (45, False)]
    assert set(calls) == {100}


def test_a_failing_handler_is_logged_and_the_watch_goes_on():
    handled: list[int] = []

    def on_event(event: GpuEvent, _serving: bool) -> None:
        handled.append(event.code)
        if event.code == 13:
            raise RuntimeError("bug")

    watch = GpuEventWatch(lambda _ms: (xid(13),), on_event, poll_s=0.01)
    with capture_logs() as logs:
        watch.start()
        wait_until(lambda: len(handled) >= 2, timeout_s=10, what="a second read")
        watch.stop()
    assert any(e["event"] == "gpu_event_watch_failed" for e in logs)


def test_only_a_sensor_with_driver_events_gets_the_watch_and_plugins_merge(tmp_path: Path):
    store = StateStore(tmp_path)
    assert watch_plugins(None, store, opener(tmp_path, "gpu_xid")) == Plugins()

    def hook(_report: DeathReport) -> None:
        pass

    both = merged(Plugins(death_hooks=(hook,)), Plugins(death_hooks=(hook,), components=()))
    assert both.death_hooks == (hook, hook)
    assert both.relaunch_hooks == ()
