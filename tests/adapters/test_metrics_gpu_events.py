"""The metrics adapter with labels in pairs: Xids by GPU and Xid, the recovery action per GPU."""

from __future__ import annotations

from supervisor.adapters.metrics import SupervisorMetrics
from tests.adapters.test_metrics import P, samples


def test_xids_count_by_gpu_and_xid_and_the_action_is_a_gauge_per_gpu():
    metrics = SupervisorMetrics("qwen", "1.0", lambda _argv: None)
    body, _ = metrics.exposition()
    ours = (P + "gpu_xid_total", P + "gpu_recovery_action")
    assert not [k for k in samples(body.decode()) if k[0] in ours]  # none known yet
    event = {"event": "gpu_event", "kind": "xid", "driver_action": "gpu_reset"}
    metrics({**event, "gpu": 0, "xid": 48})
    metrics({**event, "gpu": 0, "xid": 48, "driver_action": None})
    metrics({**event, "gpu": 3, "xid": 79, "driver_action": "node_reboot"})
    body, _ = metrics.exposition()
    found = samples(body.decode())
    assert found[(P + "gpu_xid_total", (("gpu", "0"), ("xid", "48")))] == 2
    assert found[(P + "gpu_xid_total", (("gpu", "3"), ("xid", "79")))] == 1
    assert found[(P + "gpu_recovery_action", (("gpu", "0"),))] == 1  # GPU reset
    assert found[(P + "gpu_recovery_action", (("gpu", "3"),))] == 2  # node reboot
    assert found[(P + "incidents_total", (("kind", "gpu_xid"),))] == 0  # known from the start
