"""memory.incident: the report's GPU part in each state, and a state directory that refuses the
file (the incident is logged, never a crash)."""

from __future__ import annotations

import json
from pathlib import Path

from structlog.testing import capture_logs

from supervisor.core.policy import Decision, Limits, Reading, Verdict
from supervisor.core.readings import GpuState
from supervisor.memory.incident import Incident, memory_report
from tests.fakes import FakeClock

DECISION = Decision(verdict=Verdict.KILL, reason="r", streak=0, next_interval_s=0.1)
READING = Reading(t_s=10.0, available_bytes=1, tree_charged_bytes=2)


def _report(gpus, proc_root: Path):
    return memory_report(
        decision=DECISION,
        limits=Limits(),
        history=[READING],
        tree=(),
        gpus=gpus,
        log_tail=("line --api-key sk-abcdef123",),
        now_s=12.0,
        proc_root=proc_root,
    )


def test_the_gpu_part_says_not_read_unknown_or_gives_the_snapshot_with_its_age(tmp_path: Path):
    gpu = GpuState(index=0, uuid="GPU-0", name="H200", total_bytes=9, used_bytes=3)
    assert _report(None, tmp_path)["gpu_snapshot"] == {"state": "not read"}
    assert _report((11.5, None), tmp_path)["gpu_snapshot"] == {"state": "unknown", "age_s": 0.5}
    snap = _report((11.0, (gpu,)), tmp_path)["gpu_snapshot"]
    assert snap["age_s"] == 1.0
    assert snap["gpus"][0]["used_bytes"] == 3
    report = _report(None, tmp_path)
    assert report["meminfo"] is None  # no /proc/meminfo under this root
    assert report["server_log_tail"] == ["line --api-key ***"]


def test_times_come_from_the_clock_and_later_steps_are_appended(tmp_path: Path):
    clock = FakeClock(start_s=0.0)
    incident = Incident.create(tmp_path, "memory_kill", "summary", {"k": 1}, clock)
    assert incident is not None
    assert incident.path.name.startswith("incident-2027")
    clock.advance(60.0)
    incident.record_next("tree_gone", after_ms=12.5)
    data = json.loads(incident.path.read_text())
    assert data["created_at"] == "2027-01-15T08:00:00Z"
    assert data["next"] == [{"step": "tree_gone", "at": "2027-01-15T08:01:00Z", "after_ms": 12.5}]


def test_a_state_directory_that_refuses_the_file_is_logged_not_raised(tmp_path: Path):
    blocked = tmp_path / "file-in-the-way"
    blocked.write_text("")
    with capture_logs() as logs:
        assert Incident.create(blocked, "memory_kill", "s", {}) is None
    assert logs[0]["event"] == "incident_not_written"
    incident = Incident.create(tmp_path, "memory_kill", "s", {})
    assert incident is not None
    incident.path = tmp_path / "removed-meanwhile" / incident.path.name
    with capture_logs() as logs:
        incident.record_next("tree_gone")
    assert logs[0]["event"] == "incident_not_updated"
    assert incident.data["next"][0]["step"] == "tree_gone"  # kept in memory all the same


def test_only_the_newest_incidents_are_kept(tmp_path):
    clock = FakeClock()
    made = []
    for _ in range(5):
        incident = Incident.create(tmp_path, "memory_kill", "test", {}, clock, keep=3)
        assert incident is not None
        made.append(incident.path.name)
        clock.advance(1.0)  # a second apart: the names carry the UTC second
    assert sorted(p.name for p in tmp_path.glob("incident-*.json")) == sorted(made[2:])
