"""The `gpu_health` event where an operator looks: status.json (core/status.py), the metrics
(core/metrics_map.py) and the journal sentence (core/log_text.py); all folded from the event."""

from __future__ import annotations

from typing import Any

from supervisor.core.gpu_health import FabricState, GpuHealth, judge_gpu
from supervisor.core.log_text import sentence
from supervisor.core.metrics_map import EventMapper, Op
from supervisor.core.status import Status, fold

HEALTHY = GpuHealth(
    index=0,
    uuid="GPU-0",
    volatile_dbe=0,
    remap_pending=False,
    remap_failed=False,
    persistence_on=True,
    fabric=FabricState.NOT_SUPPORTED,
)


def gate_event() -> dict[str, Any]:
    sick = GpuHealth(index=1, uuid="GPU-1", remap_pending=True)  # the rest not reported
    return {
        "event": "gpu_health",
        "mode": "enforce",
        "gpus": [judge_gpu(HEALTHY).to_json(), judge_gpu(sick).to_json()],
        "failed": ["gpu_health_1"],
    }


def test_status_shows_each_gpus_last_verdict_and_keeps_it_in_its_json():
    status = Status.begin(
        instance="x", supervisor_pid=1, supervisor_start_ticks=1, restart_window_s=60, now_s=0
    )
    status = fold(status, gate_event(), 5.0)
    assert status.gpu_health == {
        "0": {"verdict": "ok", "reason": ""},
        "1": {"verdict": "fail", "reason": "a row remap is pending: needs a reset"},
    }
    assert Status.from_json(status.to_json()).gpu_health == status.gpu_health
    assert fold(status, {"event": "gpu_health", "gpus": None}, 6.0).gpu_health == status.gpu_health


def test_metrics_set_one_verdict_per_gpu_and_the_pending_remap():
    updates = EventMapper(lambda _argv: None).feed(gate_event(), mono_s=0.0, wall_s=0.0)
    health = {str(u.label): u.value for u in updates if u.metric == "gpu_health"}
    assert health["0,ok"] == 1.0
    assert health["0,fail"] == 0.0
    assert health["1,fail"] == 1.0
    assert {v for k, v in health.items() if k.startswith("1,") and k != "1,fail"} == {0.0}
    remap = {u.label: (u.op, u.value) for u in updates if u.metric == "gpu_remap_pending"}
    assert remap == {"0": (Op.SET, 0.0), "1": (Op.SET, 1.0)}


def test_metrics_labels_stay_bounded_and_an_unknown_remap_is_not_exported():
    event = {
        "event": "gpu_health",
        "gpus": [{"gpu": "rm -rf", "verdict": "x", "remap_pending": None}],
    }
    updates = EventMapper(lambda _argv: None).feed(event, mono_s=0.0, wall_s=0.0)
    assert {u.label for u in updates if u.metric == "gpu_health"} == {
        "other,ok",
        "other,warn",
        "other,fail",
        "other,unknown",
    }
    assert [u.op for u in updates if u.metric == "gpu_remap_pending"] == [Op.UNSET]


def test_the_journal_reads_the_gate_as_one_sentence():
    text, used = sentence(gate_event())
    assert text == (
        "GPU health (enforce): GPU 0 ok, GPU 1 fail (a row remap is pending: needs a reset)"
    )
    assert used == {"mode", "gpus"}
    unknown, _ = sentence(
        {"event": "gpu_health_unknown", "field": "volatile_dbe", "reason": "Not Supported"}
    )
    assert unknown == "GPU health: volatile_dbe not reported (Not Supported)"
