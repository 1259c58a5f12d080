"""Faults of the GPUs and of NVML, on simulated GPUs: memory that stays held (reset, or exit 6),
memory released late, NVML that hangs while serving or before the first launch."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.testing import gpu_state
from tests.e2e.run_support import Supervisor
from tests.faults.support import PASSWORD, assert_invariants, faulted, recovered, refused

pytestmark = pytest.mark.slow

RESET = f"{sys.executable} -m supervisor.testing.fake_gpu_reset {{index}}"


def kill_rank(sup: Supervisor) -> None:
    sup.wait_event("ready")
    os.kill(sup.schedulers()["sglang::scheduler_TP1"], signal.SIGKILL)


def test_gpu_memory_that_stays_held_is_reset_and_the_server_relaunched(
    tmp_path: Path,
    free_port: int,
    simulated_process_guard: str,
    shm_record: Path,
    make_gpu_state: Callable[..., Path],
):
    gpus = make_gpu_state(2)
    gpu = {"reset_command": RESET, "release_timeout": "1s"}
    with faulted(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario={"gpu_stuck": True},
        overrides={"gpu": gpu},
        gpus=gpus,
    ) as sup:
        kill_rank(sup)
        recovered(sup)
        assert sup.events("gpu_reset_done")
    assert_invariants(tmp_path, sup, shm_record)


@pytest.mark.parametrize(
    "reset",
    [
        "",  # no reset command: exit 6 at once
        # A command that fails, with a secret in it: it must not reach the log, state or report.
        f"env RESET_PASSWORD={PASSWORD} false {{index}}",
    ],
)
def test_gpu_memory_that_stays_held_without_a_working_reset_is_exit_6(
    reset: str,
    tmp_path: Path,
    free_port: int,
    simulated_process_guard: str,
    shm_record: Path,
    make_gpu_state: Callable[..., Path],
):
    gpus = make_gpu_state(2)
    with faulted(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario={"gpu_stuck": True},
        overrides={"gpu": {"reset_command": reset, "release_timeout": "1s"}},
        gpus=gpus,
    ) as sup:
        kill_rank(sup)
        refused(sup, 6, "GPUs not released")
        if reset:
            assert sup.events("gpu_reset_failed")
    assert_invariants(tmp_path, sup, shm_record)


def test_gpu_memory_released_late_is_waited_for(
    tmp_path: Path,
    free_port: int,
    simulated_process_guard: str,
    shm_record: Path,
    make_gpu_state: Callable[..., Path],
):
    gpus = make_gpu_state(2)
    with faulted(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario={"gpu_release_delay_s": 1.0},
        gpus=gpus,
    ) as sup:
        kill_rank(sup)
        recovered(sup)
        assert sup.events("gpu_release_waiting")
    assert_invariants(tmp_path, sup, shm_record)


def test_nvml_hanging_when_a_rank_dies_is_exit_6_not_a_launch_onto_unread_gpus(
    tmp_path: Path,
    free_port: int,
    simulated_process_guard: str,
    shm_record: Path,
    make_gpu_state: Callable[..., Path],
):
    """While serving nothing asks NVML (the watchdog reads the last snapshot only); the release
    wait after a death does, and GPUs it cannot read are never relaunched onto."""
    gpus = make_gpu_state(2)
    gpu = {"nvml_timeout": "0.3s", "release_timeout": "1s"}
    with faulted(
        tmp_path, free_port, simulated_process_guard, overrides={"gpu": gpu}, gpus=gpus
    ) as sup:
        sup.wait_event("ready")
        gpu_state.set_nvml_hang(gpus, 60.0)
        try:
            kill_rank(sup)
            refused(sup, 6, "GPUs not released")
            assert sup.events("nvml_hung")
            assert len(sup.events("launching")) == 1
        finally:
            gpu_state.set_nvml_hang(gpus, None)
    assert_invariants(tmp_path, sup, shm_record)


def test_a_short_nvml_hang_is_over_for_the_release_wait_of_a_death_soon_after(
    tmp_path: Path,
    free_port: int,
    simulated_process_guard: str,
    shm_record: Path,
    make_gpu_state: Callable[..., Path],
):
    """With release_timeout under 30 s, NVML left alone for a fixed 30 s after a hang made
    every GPU "unknown" for the whole release wait: exit 6 though NVML answered again."""
    gpus = make_gpu_state(2)
    gpu = {"nvml_timeout": "0.3s", "release_timeout": "20s"}
    with faulted(
        tmp_path, free_port, simulated_process_guard, overrides={"gpu": gpu}, gpus=gpus
    ) as sup:
        sup.wait_event("ready")
        gpu_state.set_nvml_hang(gpus, 60.0)
        try:
            hung = sup.wait_event("nvml_hung")  # the driver-event watch asked, while serving
        finally:
            gpu_state.set_nvml_hang(gpus, None)
        assert hung["retry_after_s"] == 5.0  # a quarter of release_timeout
        os.kill(sup.schedulers()["sglang::scheduler_TP1"], signal.SIGKILL)
        recovered(sup)
        assert sup.events("gpu_release_done")
    assert_invariants(tmp_path, sup, shm_record)


@pytest.mark.parametrize("force", [False, True])
def test_nvml_hung_before_the_first_launch_is_exit_6_or_with_force_a_launch(
    force: bool,
    tmp_path: Path,
    free_port: int,
    simulated_process_guard: str,
    shm_record: Path,
    make_gpu_state: Callable[..., Path],
):
    gpus = make_gpu_state(2)
    gpu_state.set_nvml_hang(gpus, 60.0)
    gpu = {"nvml_timeout": "0.3s", "nvml_start_timeout": "0.5s", "release_timeout": "1s"}
    try:
        with faulted(
            tmp_path,
            free_port,
            simulated_process_guard,
            options=("--force",) if force else (),
            overrides={"gpu": gpu},
            gpus=gpus,
        ) as sup:
            if force:
                sup.wait_event("launching_gpus_unknown")
                recovered(sup, ready_count=1)
            else:
                refused(sup, 6, "NVML gave no answer")
                assert sup.events("launching") == []
    finally:
        gpu_state.set_nvml_hang(gpus, None)
    assert_invariants(tmp_path, sup, shm_record)
