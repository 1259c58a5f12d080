"""The run loop and NVML before the first launch, on a fake clock: no launch onto GPUs nobody
could read; NVML that answers late, never (exit 6), or never with --force."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.core.events import SignalEvent
from supervisor.core.readings import GpuState
from supervisor.errors import GpuUnrecoverable
from tests.run.runner_support import runner, settings, world

SIGTERM = SignalEvent(signal.SIGTERM, "SIGTERM")


@pytest.mark.parametrize("answers_at_s", [5.0, None])
def test_no_launch_until_nvml_answers_and_exit_6_when_it_never_does(
    tmp_path: Path, answers_at_s: float | None
):
    w = world(tmp_path)
    w.events.at(100.0, SIGTERM)

    def nvml(now: float) -> tuple[GpuState, ...] | None:
        return w.gpus(now) if answers_at_s is not None and now >= answers_at_s else None

    run = runner(w, settings(tmp_path), gpus=nvml)
    with capture_logs() as logs:
        if answers_at_s is not None:
            assert run.run() == 0
        else:
            with pytest.raises(GpuUnrecoverable) as err:
                run.run()
            assert err.value.exit_code == 6
    events = [e["event"] for e in logs]
    assert events[0] == "nvml_unanswered"
    if answers_at_s is not None:
        assert events.index("nvml_answered") < events.index("launching")
    else:
        assert "launching" not in events
        assert logs[-1]["event"] == "fatal"
        assert "NVML gave no answer for 30 s" in logs[-1]["reason"]


def test_force_launches_onto_gpus_nvml_never_read(tmp_path: Path):
    w = world(tmp_path)
    w.events.at(100.0, SIGTERM)
    with capture_logs() as logs:
        assert runner(w, settings(tmp_path, force=True), gpus=lambda now: None).run() == 0
    events = [e["event"] for e in logs]
    assert events.index("launching_gpus_unknown") < events.index("launching")
