"""`sglang-supervisor run` and the GPU health gate on simulated GPUs: a pending row remap refuses
the launch (exit 1, the GPU and the reason named) and passes after a simulated reset; an
unsupported NVML call reads "unknown" and never fails the gate; after a death, a GPU that needs
a reset on NVLink GPUs that cannot be reset alone gets its whole peer set reset in one command
(`{indices}`), is checked again, and the server is relaunched."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.testing import gpu_faults
from tests.e2e.run_support import supervisor

pytestmark = pytest.mark.slow

FAKE_GPU = [sys.executable, "-m", "supervisor.testing.fake_gpu"]


def test_a_pending_remap_refuses_the_launch_and_passes_after_a_reset(
    tmp_path, free_port, simulated_process_guard, gpu_state_dir
):
    gpu_faults.inject(gpu_state_dir, 1, "remap-pending")
    with supervisor(
        tmp_path, free_port, simulated_process_guard, gpu_state_dir=gpu_state_dir
    ) as refused:
        assert refused.wait_exit() == 1
        fatal = refused.events("fatal")[-1]
        assert fatal["exit_code"] == 1
        assert "gpu_health_1 failed" in fatal["reason"]
        gate = refused.events("gpu_health")[-1]
        sick = next(g for g in gate["gpus"] if g["gpu"] == 1)
        assert sick["verdict"] == "fail"
        assert sick["uuid"].startswith("GPU-")
        assert sick["reason"] == "a row remap is pending: needs a reset"
        report = refused.events("preflight_report")[-1]
        check = next(c for c in report["checks"] if c["name"] == "gpu_health_1")
        assert check["status"] == "fail"
        assert "GPU 1 (GPU-" in check["detail"]
        assert refused.events("launching") == []
    subprocess.run(
        [*FAKE_GPU, "reset", "1", "--dir", str(gpu_state_dir)], check=True, capture_output=True
    )
    with supervisor(
        tmp_path, free_port, simulated_process_guard, gpu_state_dir=gpu_state_dir
    ) as passed:
        passed.wait_event("ready")
        gate = passed.events("gpu_health")[-1]
        assert [g["verdict"] for g in gate["gpus"]] == ["ok", "ok"]
        passed.signal(signal.SIGTERM)
        assert passed.wait_exit() == 0


def test_an_unsupported_call_reads_unknown_and_the_server_launches(
    tmp_path, free_port, simulated_process_guard, gpu_state_dir
):
    gpu_faults.inject(gpu_state_dir, 0, "unsupported", "nvmlDeviceGetTotalEccErrors")
    with supervisor(
        tmp_path, free_port, simulated_process_guard, gpu_state_dir=gpu_state_dir
    ) as sup:
        sup.wait_event("ready")
        gate = sup.events("gpu_health")[0]
        assert gate["gpus"][0]["verdict"] == "unknown"
        assert gate["gpus"][0]["unknown"] == ["uncorrectable ECC count"]
        assert gate["failed"] == []
        (unknown,) = sup.events("gpu_health_unknown")  # logged once, however often read
        assert unknown["field"] == "volatile_dbe"
        assert "Not Supported" in unknown["reason"]
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0


def test_a_gpu_needing_a_reset_after_a_death_gets_its_whole_nvlink_peer_set_reset(
    tmp_path, free_port, simulated_process_guard, make_gpu_state: Callable[..., Path]
):
    # Two NVLink pairs that cannot be reset one GPU at a time (pre-Ampere NVLink, or Ampere
    # NVSwitch without the fabric manager): `reset 1` alone is refused by the simulation.
    gpus = make_gpu_state(4, nvlink_peers=2, per_gpu_reset=False)
    reset = f"{sys.executable} -m supervisor.testing.fake_gpu reset {{indices}} --dir {gpus}"
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        gpu_state_dir=gpus,
        overrides={"gpu": {"reset_command": reset}},
    ) as sup:
        sup.wait_event("ready")
        gpu_faults.inject(gpus, 1, "remap-pending")  # a DBE while serving left a remap pending
        os.kill(sup.schedulers()["sglang::scheduler_TP1"], signal.SIGKILL)
        started = sup.wait_event("gpu_reset_started")
        assert (started["gpu"], started["gpus"]) == (1, [0, 1])
        done = sup.wait_event("gpu_reset_done")
        assert done["gpus"] == [0, 1]
        sup.wait_event("ready", count=2)
        gates = sup.events("gpu_health")
        assert [g["verdict"] for g in gates[-1]["gpus"]] == ["ok", "ok"]
        assert sup.events("gpu_reset_failed") == []
        assert gpu_faults.read_health(gpus, 1).faults() == []
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0


def test_on_such_gpus_a_per_gpu_reset_command_fails_and_the_run_ends_with_exit_6(
    tmp_path, free_port, simulated_process_guard, make_gpu_state: Callable[..., Path]
):
    gpus = make_gpu_state(4, nvlink_peers=2, per_gpu_reset=False)
    reset = f"{sys.executable} -m supervisor.testing.fake_gpu reset {{index}} --dir {gpus}"
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        gpu_state_dir=gpus,
        overrides={"gpu": {"reset_command": reset}},
    ) as sup:
        sup.wait_event("ready")
        gpu_faults.inject(gpus, 1, "remap-pending")
        os.kill(sup.schedulers()["sglang::scheduler_TP1"], signal.SIGKILL)
        assert sup.wait_exit() == 6
        failed = sup.events("gpu_reset_failed")[0]
        assert failed["gpus"] == [1]
        assert "GPU 1 reset failed" in sup.events("fatal")[-1]["reason"]
        assert len(sup.events("launching")) == 1
    (incident,) = (tmp_path / "state").glob("incident-*-gpu_unrecoverable-*.json")
    readings = json.loads(incident.read_text())["gpu_release"]["health"]
    assert [(g["gpu"], g["verdict"], g["remap_pending"]) for g in readings] == [
        (0, "ok", False),
        (1, "fail", True),
    ]
