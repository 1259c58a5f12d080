"""What a GPU driver event means for the server (core/xid.py), and how a `gpu_event` shows in
the status, the metrics and the journal."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.core.backoff import BackoffPolicy, RestartBudget, RunEnd, decide_after_failure
from supervisor.core.classify import FailureKind
from supervisor.core.gpu_health import EventKind, GpuEvent, RecoveryAction
from supervisor.core.log_text import journal_line
from supervisor.core.metrics_map import EventMapper, Op, Update
from supervisor.core.status import Status, fold
from supervisor.core.xid import (
    APPLICATION_XIDS,
    Verdict,
    counted,
    decide,
    read_counts,
    worse,
    xid_info,
)

TARGETS = frozenset({0, 1})


def event(
    kind: EventKind = EventKind.XID,
    code: int = 0,
    *,
    gpu: int = 0,
    action: RecoveryAction | None = None,
) -> GpuEvent:
    return GpuEvent(
        index=gpu,
        uuid=f"GPU-{gpu}",
        kind=kind,
        code=code,
        at_s=1_800_000_000.0,
        recovery_action=action,
    )


def xid(code: int, *, gpu: int = 0, action: RecoveryAction | None = None) -> GpuEvent:
    return event(EventKind.XID, code, gpu=gpu, action=action)


@pytest.mark.parametrize("code", sorted(APPLICATION_XIDS))
def test_application_xids_are_ignored_whatever_the_driver_says(code: int):
    decision = decide(xid(code, action=RecoveryAction.GPU_RESET), TARGETS)
    assert decision.verdict is Verdict.IGNORE
    assert not decision.verdict.kills
    assert decision.meaning == xid_info(code).meaning
    assert "ignored" in decision.reason()


def test_the_application_xids_are_the_device_plugins():
    assert frozenset({13, 31, 43, 45, 68, 109}) == APPLICATION_XIDS


@pytest.mark.parametrize(
    ("code", "driver", "verdict", "action"),
    [
        # Xid 79: lost, whatever the driver could (not) say
        (79, None, Verdict.REBOOT, RecoveryAction.NODE_REBOOT),
        (79, RecoveryAction.NONE, Verdict.REBOOT, RecoveryAction.NODE_REBOOT),
        # the table's reset when the driver says nothing or less
        (48, None, Verdict.RESET, RecoveryAction.GPU_RESET),
        (48, RecoveryAction.NONE, Verdict.RESET, RecoveryAction.GPU_RESET),
        (95, None, Verdict.RESET, RecoveryAction.GPU_RESET),
        (119, None, Verdict.RESET, RecoveryAction.GPU_RESET),
        # the driver's, when it asks for more than the table
        (48, RecoveryAction.NODE_REBOOT, Verdict.REBOOT, RecoveryAction.NODE_REBOOT),
        (48, RecoveryAction.DRAIN_P2P, Verdict.DRAIN, RecoveryAction.DRAIN_P2P),
        (94, RecoveryAction.DRAIN_AND_RESET, Verdict.DRAIN, RecoveryAction.DRAIN_AND_RESET),
        (74, RecoveryAction.SYSTEM_REBOOT, Verdict.REBOOT, RecoveryAction.SYSTEM_REBOOT),
        (32, RecoveryAction.BUS_RESET, Verdict.RESET, RecoveryAction.BUS_RESET),
        # a critical Xid with nothing to reset: restart
        (32, None, Verdict.RESTART, RecoveryAction.NONE),
        (69, RecoveryAction.NONE, Verdict.RESTART, RecoveryAction.NONE),
        (999, None, Verdict.RESTART, RecoveryAction.NONE),  # not in the table
    ],
)
def test_a_critical_xid_on_a_target_gpu_follows_the_stronger_action(
    code: int, driver: RecoveryAction | None, verdict: Verdict, action: RecoveryAction
):
    decision = decide(xid(code, gpu=1, action=driver), TARGETS)
    assert decision.verdict is verdict
    assert decision.action is action
    assert decision.verdict.kills
    assert decision.on_target
    assert decision.xid == code
    assert decision.verdict.ends_run == (verdict in (Verdict.REBOOT, Verdict.DRAIN))


def test_the_reason_names_the_xid_its_meaning_the_action_and_what_follows():
    reboot = decide(xid(79, gpu=1), TARGETS).reason()
    assert reboot.startswith("Xid 79 on GPU 1 (GPU has fallen off the bus)")
    assert "node_reboot" in reboot
    assert "the node needs a reboot, no relaunch" in reboot
    reset = decide(xid(48), TARGETS).reason()
    assert "double-bit ECC" in reset
    assert "resetting the GPU" in reset
    drain = decide(xid(48, action=RecoveryAction.DRAIN_P2P), TARGETS).reason()
    assert "drain" in drain


def test_an_informational_xid_is_logged_unless_the_driver_asks_for_an_action():
    assert decide(xid(63), TARGETS).verdict is Verdict.LOG
    assert decide(xid(92, action=RecoveryAction.NONE), TARGETS).verdict is Verdict.LOG
    asked = decide(xid(63, action=RecoveryAction.GPU_RESET), TARGETS)
    assert asked.verdict is Verdict.RESET


def test_events_on_gpus_that_are_not_the_servers_are_only_logged():
    for gpu_event in (xid(79, gpu=5), xid(48, gpu=5), event(EventKind.DOUBLE_BIT_ECC, gpu=5)):
        decision = decide(gpu_event, TARGETS)
        assert decision.verdict is Verdict.LOG
        assert not decision.on_target
        assert "not a GPU of this server" in decision.reason()
    # an application Xid elsewhere is not "ignored" (that is for the server's own): logged
    assert decide(xid(13, gpu=5), TARGETS).verdict is Verdict.LOG


def test_ecc_events_a_lost_gpu_and_recovery_action_events():
    assert decide(event(EventKind.DOUBLE_BIT_ECC), TARGETS).verdict is Verdict.RESET
    assert decide(event(EventKind.SINGLE_BIT_ECC), TARGETS).verdict is Verdict.LOG
    assert decide(event(EventKind.GPU_LOST), TARGETS).verdict is Verdict.REBOOT
    asked = {
        RecoveryAction.NONE: Verdict.LOG,  # cleared, e.g. after a reset
        RecoveryAction.GPU_RESET: Verdict.RESET,
        RecoveryAction.NODE_REBOOT: Verdict.REBOOT,
        RecoveryAction.DRAIN_P2P: Verdict.DRAIN,
        RecoveryAction.DRAIN_AND_RESET: Verdict.DRAIN,
        RecoveryAction.RECOVER_IMEX_DOMAIN: Verdict.DRAIN,
    }
    for action, verdict in asked.items():
        decision = decide(event(EventKind.RECOVERY_ACTION, action.value), TARGETS)
        assert decision.verdict is verdict, action
        assert decision.xid is None
    # an action newer than this table: stop for the operator rather than guess
    unknown = decide(event(EventKind.RECOVERY_ACTION, 42), TARGETS)
    assert unknown.verdict is Verdict.DRAIN
    assert "42" in unknown.meaning


def test_the_worse_decision_wins_and_the_earlier_on_a_tie():
    restart = decide(xid(32), TARGETS)
    reset = decide(xid(48), TARGETS)
    reboot = decide(xid(79), TARGETS)
    assert worse(None, restart) is restart
    assert worse(restart, reset) is reset
    assert worse(reboot, reset) is reboot
    again = decide(xid(95), TARGETS)
    assert worse(reset, again) is reset


def test_a_fatal_xid_ends_the_run_with_exit_6_and_xid_restarts_are_never_a_repeated_start():
    """An Xid is the GPU's or the driver's, not the launch's: the relaunch comes after a reset
    or onto a GPU the health gate passed, so twice before ready is no `start_repeated` (exit 4);
    a GPU that keeps failing meets the crash-loop limit instead."""
    budget = RestartBudget(BackoffPolicy(max_restarts=3))
    _, fatal = decide_after_failure(budget, FailureKind.GPU_XID_FATAL, 0.0)
    assert fatal.end is RunEnd.GPU_UNRECOVERABLE
    ends = []
    for now in (0.0, 20.0, 60.0, 120.0):
        budget, decision = decide_after_failure(budget, FailureKind.GPU_XID, now)
        ends.append(decision.end)
    assert ends == [None, None, None, RunEnd.CRASH_LOOP]


def test_xid_counts_per_gpu_and_their_json():
    counts = counted({}, 1, 79)
    assert counts == {"1": {"79": 1}}
    counts = counted(counts or {}, 1, 79)
    counts = counted(counts or {}, 0, 13)
    assert counts == {"1": {"79": 2}, "0": {"13": 1}}
    assert counted(counts or {}, 0, None) is None  # a DBE event: no Xid
    assert counted(counts or {}, True, 13) is None
    assert read_counts(counts) == counts
    assert read_counts("junk") == {}
    assert read_counts({"0": "x", "1": {"79": 2, "48": "y"}}) == {"1": {"79": 2}}


def gpu_event_log(**fields: Any) -> dict[str, Any]:
    return {
        "event": "gpu_event",
        "level": "error",
        "gpu": 1,
        "uuid": "GPU-1",
        "kind": "xid",
        "xid": 79,
        "meaning": "GPU has fallen off the bus",
        "action": "node_reboot",
        "driver_action": None,
        "decision": "reboot",
        "target": True,
        "xid_count": 1,
        **fields,
    }


def test_the_status_counts_xids_per_gpu_and_keeps_them_through_its_json():
    status = Status.begin(
        instance="q",
        supervisor_pid=1,
        supervisor_start_ticks=None,
        restart_window_s=1800.0,
        now_s=0.0,
    )
    for fields in ({}, {"xid": 13, "gpu": 0}, {}, {"kind": "dbe", "xid": None}):
        status = fold(status, gpu_event_log(**fields), 1.0)
    assert status.gpu_xids == {"1": {"79": 2}, "0": {"13": 1}}
    data = status.to_json()
    assert data["gpu_xids"] == {"1": {"79": 2}, "0": {"13": 1}}
    assert Status.from_json(data).gpu_xids == status.gpu_xids
    del data["gpu_xids"]  # a status file of an older supervisor
    assert Status.from_json(data).gpu_xids == {}


def test_metrics_count_xids_by_gpu_and_xid_and_gauge_the_drivers_action():
    mapper = EventMapper(lambda _argv: None)

    def feed(**fields: Any) -> list[Update]:
        return mapper.feed(gpu_event_log(**fields), mono_s=0.0, wall_s=0.0)

    assert feed() == [Update("gpu_xid_total", Op.INC, label="1,79")]
    assert feed(xid=48, gpu=0, driver_action="gpu_reset") == [
        Update("gpu_xid_total", Op.INC, label="0,48"),
        Update("gpu_recovery_action", Op.SET, 1.0, "0"),
    ]
    assert feed(kind="dbe", xid=None, driver_action="none") == [
        Update("gpu_recovery_action", Op.SET, 0.0, "1")
    ]
    # label values stay bounded: never free text
    assert feed(xid="79; drop", gpu="x", driver_action="rm -rf") == [
        Update("gpu_xid_total", Op.INC, label="other,other")
    ]


def test_a_gpu_event_reads_as_a_sentence_in_the_journal():
    line = journal_line(gpu_event_log())
    assert line.startswith(
        "<3>GPU 1: Xid 79 (GPU has fallen off the bus), recovery action node_reboot: killing "
        "the server, no relaunch (the node needs a reboot)"
    )
    assert "uuid=GPU-1" in line
    ignored = journal_line(
        gpu_event_log(level="warning", xid=13, meaning="m", action=None, decision="ignore")
    )
    assert ignored.startswith("<4>GPU 1: Xid 13 (m): an application error, ignored")
    dbe = journal_line(gpu_event_log(kind="dbe", xid=None, meaning="m", decision="reset"))
    assert dbe.startswith("<3>GPU 1: double-bit ECC error (m), recovery action node_reboot")
