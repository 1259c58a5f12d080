"""core.gpu_health's gate: each reading judged ok / warn / fail / unknown with its remedy, the
mode's effect on the check, NVLink peer sets, and the gate's lines in status.json."""

from __future__ import annotations

import dataclasses

import pytest

from supervisor.core.gpu_health import (
    FabricState,
    GpuHealth,
    HealthSnapshot,
    RecoveryAction,
    Remedy,
    Verdict,
    gate_status,
    health_lines,
    judge_gpu,
    judge_gpus,
    nvlink_peer_sets,
    read_health_lines,
)

HEALTHY = GpuHealth(
    index=1,
    uuid="GPU-1",
    volatile_dbe=0,
    remap_pending=False,
    remap_failed=False,
    retired_pages_pending=None,  # Ampere and newer: not supported
    persistence_on=True,
    fabric=FabricState.NOT_SUPPORTED,
    recovery_action=None,  # an older driver
)


def sick(**changes: object) -> GpuHealth:
    return dataclasses.replace(HEALTHY, **changes)  # type: ignore[arg-type]


def test_a_healthy_gpu_passes_even_without_the_newer_facts():
    verdict = judge_gpu(HEALTHY)
    assert verdict.verdict is Verdict.OK
    assert verdict.remedy is Remedy.NONE
    assert verdict.describe() == "GPU 1 (GPU-1): ok: healthy"


@pytest.mark.parametrize(
    ("changes", "reason", "remedy"),
    [
        ({"lost": True}, "lost (fallen off the bus, Xid 79)", Remedy.REBOOT),
        ({"reset_required": True}, "NVML says the GPU needs a reset", Remedy.RESET),
        ({"volatile_dbe": 1}, "1 uncorrectable ECC error(s)", Remedy.RESET),
        ({"remap_failed": True}, "row remapping failed", Remedy.OPERATOR),
        ({"remap_pending": True}, "a row remap is pending: needs a reset", Remedy.RESET),
        ({"retired_pages_pending": True}, "a page retirement is pending", Remedy.RESET),
        ({"fabric": FabricState.IN_PROGRESS}, "NVLink fabric in progress", Remedy.OPERATOR),
        ({"fabric": FabricState.NOT_STARTED}, "NVLink fabric not started", Remedy.OPERATOR),
        ({"recovery_action": RecoveryAction.GPU_RESET}, "recovery: gpu reset", Remedy.RESET),
        ({"recovery_action": RecoveryAction.NODE_REBOOT}, "recovery: node reboot", Remedy.REBOOT),
        ({"recovery_action": RecoveryAction.DRAIN_P2P}, "recovery: drain p2p", Remedy.OPERATOR),
    ],
)
def test_each_sick_reading_fails_with_its_reason_and_remedy(changes, reason, remedy):
    verdict = judge_gpu(sick(**changes))
    assert verdict.verdict is Verdict.FAIL
    assert reason in verdict.describe()
    assert verdict.remedy is remedy
    assert verdict.needs_reset is (remedy is Remedy.RESET)


def test_the_most_drastic_remedy_wins_and_every_reason_is_named():
    verdict = judge_gpu(sick(remap_pending=True, lost=True))
    assert verdict.remedy is Remedy.REBOOT
    assert not verdict.needs_reset  # a reset would not do
    assert len(verdict.reasons) == 2
    assert verdict.describe().endswith("; reboot the node")


def test_uncorrectable_errors_up_to_the_threshold_pass():
    assert judge_gpu(sick(volatile_dbe=2), max_volatile_dbe=2).verdict is Verdict.OK
    assert judge_gpu(sick(volatile_dbe=3), max_volatile_dbe=2).verdict is Verdict.FAIL


def test_a_completed_fabric_or_none_passes():
    assert judge_gpu(sick(fabric=FabricState.COMPLETED)).verdict is Verdict.OK
    assert judge_gpu(sick(fabric=FabricState.NOT_SUPPORTED)).verdict is Verdict.OK


def test_persistence_off_only_warns():
    verdict = judge_gpu(sick(persistence_on=False))
    assert verdict.verdict is Verdict.WARN
    assert "persistence mode off" in verdict.describe()


@pytest.mark.parametrize(
    ("changes", "missing"),
    [
        ({"volatile_dbe": None}, "uncorrectable ECC count"),
        ({"remap_pending": None, "remap_failed": None}, "pending memory repair"),
        ({"persistence_on": None}, "persistence mode"),
        ({"fabric": None}, "NVLink fabric state"),
    ],
)
def test_a_fact_not_reported_is_unknown_never_a_failure(changes, missing):
    verdict = judge_gpu(sick(**changes))
    assert verdict.verdict is Verdict.UNKNOWN
    assert verdict.unknown == (missing,)
    assert f"unknown: not reported: {missing}" in verdict.describe()


def test_retired_pages_answer_for_memory_repair_where_remapping_is_not_reported():
    older = sick(remap_pending=None, remap_failed=None, retired_pages_pending=False)
    assert judge_gpu(older).verdict is Verdict.OK


def test_a_failure_wins_over_unknown_facts_and_lists_them():
    verdict = judge_gpu(sick(remap_pending=True, volatile_dbe=None))
    assert verdict.verdict is Verdict.FAIL
    assert "not reported: uncorrectable ECC count" in verdict.describe()


def test_a_lost_gpu_lists_no_unknown_facts():
    assert judge_gpu(GpuHealth(index=3, uuid="", lost=True)).unknown == ()


def test_a_reset_failure_names_the_offer_or_says_what_to_do():
    verdict = judge_gpu(sick(remap_pending=True))
    assert verdict.describe("reset it: X").endswith("; reset it: X")
    assert verdict.describe().endswith("; reset the GPU or reboot the node")


def test_a_target_the_read_did_not_cover_is_unknown():
    snapshot = HealthSnapshot(gpus=(HEALTHY,))
    first, second = judge_gpus(snapshot, [1, 5])
    assert first.verdict is Verdict.OK
    assert (second.index, second.verdict, second.unknown) == (5, Verdict.UNKNOWN, ("its health",))


@pytest.mark.parametrize(
    ("verdict", "mode", "status"),
    [
        (Verdict.FAIL, "enforce", "fail"),
        (Verdict.FAIL, "warn", "warn"),
        (Verdict.WARN, "enforce", "warn"),
        (Verdict.UNKNOWN, "enforce", "warn"),
        (Verdict.OK, "enforce", "ok"),
        (Verdict.OK, "warn", "ok"),
    ],
)
def test_the_mode_decides_the_checks_status(verdict, mode, status):
    judged = dataclasses.replace(judge_gpu(HEALTHY), verdict=verdict)
    assert gate_status(judged, mode) == status


@pytest.mark.parametrize(
    ("wanted", "nvlink", "sets"),
    [
        ([1], None, ((1,),)),  # NVML could not say: each GPU alone
        ([2, 0], (), ((0,), (2,))),  # no NVLink at all
        ([1], ((0, 1), (2, 3)), ((0, 1),)),
        ([1, 3], ((0, 1), (2, 3)), ((0, 1), (2, 3))),
        ([0, 1], ((0, 1), (1, 2)), ((0, 1, 2),)),  # connected through GPU 1
        ([3], ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)), ((0, 1, 2, 3),)),  # NVSwitch
    ],
)
def test_gpus_to_reset_are_grouped_into_whole_nvlink_peer_sets(wanted, nvlink, sets):
    assert nvlink_peer_sets(wanted, nvlink) == sets


def test_the_gate_event_becomes_status_lines_and_back():
    ok, bad = judge_gpu(HEALTHY), judge_gpu(sick(index=2, remap_pending=True, volatile_dbe=None))
    unknown = judge_gpu(sick(index=3, fabric=None))
    event = {"event": "gpu_health", "gpus": [v.to_json() for v in (ok, bad, unknown)]}
    lines = health_lines(event, {})
    assert lines == {
        "1": {"verdict": "ok", "reason": ""},
        "2": {"verdict": "fail", "reason": "a row remap is pending: needs a reset"},
        "3": {"verdict": "unknown", "reason": "not reported: NVLink fabric state"},
    }
    assert read_health_lines(lines) == lines
    assert health_lines({"gpus": "garbage"}, lines) is lines
    assert read_health_lines(["not", "an", "object"]) == {}


def test_the_verdicts_json_carries_the_readings():
    data = judge_gpu(sick(remap_pending=True, recovery_action=RecoveryAction.GPU_RESET)).to_json()
    assert data["gpu"] == 1
    assert data["verdict"] == "fail"
    assert data["remedy"] == "reset"
    assert data["remap_pending"] is True
    assert data["recovery_action"] == "gpu_reset"
    assert data["fabric"] == "not_supported"
