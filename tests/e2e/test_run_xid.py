"""`sglang-supervisor run` on simulated GPUs that report Xids while the server serves: Xid 79
kills the group and ends with exit 6 ("reboot"), no relaunch; Xid 48 is followed by a reset
and a relaunch; an application Xid, and any Xid on a GPU that is not the server's, is only
logged."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor.testing import gpu_faults
from tests.e2e.run_support import Supervisor, supervisor

pytestmark = pytest.mark.slow

RESET = f"{sys.executable} -m supervisor.testing.fake_gpu_reset {{index}}"


def inject(gpus: Path, *args: str) -> None:
    """The documented way: `python -m supervisor.testing.fake_gpu inject xid N --gpu I`."""
    subprocess.run(
        [sys.executable, "-m", "supervisor.testing.fake_gpu", "inject", *args, "--dir", str(gpus)],
        check=True,
        capture_output=True,
    )


def incidents(sup: Supervisor) -> list[dict[str, Any]]:
    files = sorted(sup.state_dir.glob("incident-*-gpu_xid-*.json"))
    return [json.loads(f.read_text()) for f in files]


def test_xid_79_while_serving_kills_the_group_and_exits_6_for_a_reboot(
    tmp_path, free_port, simulated_process_guard, gpu_state_dir
):
    with supervisor(
        tmp_path, free_port, simulated_process_guard, gpu_state_dir=gpu_state_dir
    ) as sup:
        sup.wait_event("ready")
        inject(gpu_state_dir, "xid", "79", "--gpu", "1")
        assert sup.wait_exit() == 6
        (event,) = sup.events("gpu_event")
        assert (event["gpu"], event["xid"], event["decision"]) == (1, 79, "reboot")
        assert event["level"] == "error"
        assert sup.events("server_failed")[0]["failure"] == "gpu_xid_fatal"
        fatal = sup.events("fatal")[-1]
        assert fatal["exit_code"] == 6
        assert "reboot" in fatal["reason"]
        assert "Xid 79 on GPU 1" in fatal["reason"]
        assert len(sup.events("launching")) == 1  # no relaunch
        assert not sup.events("restarting")
        assert sup.tree() == []  # the whole group is gone
        (incident,) = incidents(sup)
        assert incident["gpu_event"] == {
            **incident["gpu_event"],
            "gpu": 1,
            "xid": 79,
            "meaning": "GPU has fallen off the bus",
            "decision": "reboot",
        }
        assert sup.state()["last_failure"] == "gpu_xid_fatal"


def test_xid_48_resets_the_gpu_and_relaunches(
    tmp_path, free_port, simulated_process_guard, gpu_state_dir
):
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        gpu_state_dir=gpu_state_dir,
        overrides={"gpu": {"reset_command": RESET}},
    ) as sup:
        sup.wait_event("ready")
        before = set(sup.tree())
        inject(gpu_state_dir, "xid", "48", "--gpu", "0")
        event = sup.wait_event("gpu_event")
        assert (event["gpu"], event["xid"], event["decision"]) == (0, 48, "reset")
        assert event["driver_action"] == "gpu_reset"
        assert sup.wait_event("restarting")["failure"] == "gpu_xid"
        reset = sup.wait_event("gpu_reset_done")
        assert reset["gpu"] == 0
        sup.wait_event("ready", count=2)
        assert not before & set(sup.tree())  # a new tree
        health = gpu_faults.read_health(gpu_state_dir, 0)
        assert health.recovery_action == 0  # the reset cleared what the driver asked for
        assert health.ecc["volatile"][1] == 0
        steps = [s["step"] for s in incidents(sup)[0]["next"]]
        assert steps[:2] == ["classified", "gpu_reset"]
        assert "relaunched" in steps
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0


def test_an_application_xid_and_an_xid_on_another_gpu_are_only_logged(
    tmp_path, free_port, simulated_process_guard, gpu_state_dir
):
    with supervisor(
        tmp_path, free_port, simulated_process_guard, gpu_state_dir=gpu_state_dir
    ) as sup:
        sup.wait_event("ready")
        ranks = sup.schedulers()
        inject(gpu_state_dir, "xid", "13", "--gpu", "0")
        inject(gpu_state_dir, "xid", "79", "--gpu", "5")  # not one of the server's (0, 1)
        # One thread reads and acts in order: once the second is logged, the first is done.
        sup.wait_event("gpu_event", count=2)
        application, elsewhere = sup.events("gpu_event")
        assert (application["gpu"], application["xid"]) == (0, 13)
        assert (application["decision"], application["target"]) == ("ignore", True)
        assert (elsewhere["gpu"], elsewhere["xid"]) == (5, 79)
        assert (elsewhere["decision"], elsewhere["target"]) == ("log", False)
        assert sup.schedulers() == ranks  # the same processes, still serving
        assert not sup.events("unhealthy")
        assert not sup.events("restarting")
        assert incidents(sup) == []
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
    status = json.loads((sup.state_dir / "status.json").read_text())
    assert status["gpu_xids"] == {"0": {"13": 1}, "5": {"79": 1}}
