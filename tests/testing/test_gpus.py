"""Simulated GPUs: registration by ranks, release rules, reset, and fake_nvml against pynvml."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pynvml
import pytest

from supervisor.adapters.nvml import GpuBackendError, open_gpu_sensor
from supervisor.preflight.sensors import open_sensor
from supervisor.testing import fake_nvml, gpu_state
from supervisor.testing.fake_gpu_reset import EXIT_OTHER, reset
from tests.waiting import wait_until

FAKED = [
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetMemoryAffinity",
    "nvmlDeviceGetCpuAffinity",
    # Health: fake_nvml_health.py, fake_nvml_events.py, NVLink topology.
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetGpuFabricInfo",
    "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceGetFieldValues",
    "nvmlEventSetCreate",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2",
    "nvmlEventSetWait",
    "nvmlEventSetFree",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetP2PStatus",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkRemotePciInfo",
]


@pytest.fixture
def nvml(gpu_state_dir: Path):
    fake_nvml.set_state_dir(gpu_state_dir)
    fake_nvml.nvmlInit()
    yield fake_nvml
    fake_nvml.nvmlShutdown()
    fake_nvml.set_state_dir(None)


def _holder_process() -> subprocess.Popen[bytes]:
    """A live process to hold GPU memory (a stand-in for a rank)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


@pytest.mark.parametrize("name", FAKED)
def test_every_faked_name_exists_in_pynvml_with_the_same_parameters(name):
    real = inspect.signature(getattr(pynvml, name))
    fake = inspect.signature(getattr(fake_nvml, name))
    assert list(fake.parameters) == list(real.parameters)
    for param in real.parameters.values():
        assert (fake.parameters[param.name].default is inspect.Parameter.empty) == (
            param.default is inspect.Parameter.empty
        )


def test_every_public_nvml_name_of_the_fake_is_faked_or_reexported_from_pynvml():
    for name in fake_nvml.__all__:
        if name == "set_state_dir" or name.startswith("Sim"):  # the simulation's own
            continue
        assert hasattr(pynvml, name), name
        if name.startswith("nvml") and callable(getattr(pynvml, name)):
            assert name in FAKED, f"{name}: add it to FAKED so its signature is compared"
    assert fake_nvml.NVMLError is pynvml.NVMLError


def test_calls_before_init_raise_the_real_uninitialized_error(gpu_state_dir):
    fake_nvml.set_state_dir(gpu_state_dir)
    with pytest.raises(pynvml.NVMLError_Uninitialized) as info:
        fake_nvml.nvmlDeviceGetCount()
    assert info.value.value == pynvml.NVML_ERROR_UNINITIALIZED
    fake_nvml.set_state_dir(None)


def test_init_without_a_state_dir_raises_driver_not_loaded(monkeypatch):
    monkeypatch.delenv("FAKE_GPU_STATE_DIR", raising=False)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        fake_nvml.nvmlInit()


def test_devices_answer_with_pynvml_shapes(nvml, gpu_state_dir):
    assert nvml.nvmlDeviceGetCount() == 8
    handle = nvml.nvmlDeviceGetHandleByIndex(5)
    uuid = nvml.nvmlDeviceGetUUID(handle)
    assert uuid == gpu_state.gpu_uuid(5)
    assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByUUID(uuid)) == uuid
    assert nvml.nvmlDeviceGetName(handle) == "NVIDIA H200"
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    assert isinstance(memory, pynvml.c_nvmlMemory_t)
    assert memory.total == memory.free + memory.used == gpu_state.DEFAULT_TOTAL_BYTES
    v2 = nvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert isinstance(v2, pynvml.c_nvmlMemory_v2_t)
    assert nvml.nvmlDeviceGetNumaNodeId(handle) == 1
    assert list(nvml.nvmlDeviceGetMemoryAffinity(handle, 1, 0)) == [0b10]
    assert nvml.nvmlDeviceGetComputeRunningProcesses(handle) == []
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(8)
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleByUUID("GPU-nope")


def test_a_live_holder_is_listed_with_its_memory(nvml, gpu_state_dir):
    holder = _holder_process()
    try:
        gpu_state.register_holder(gpu_state_dir, 2, 3 << 30, pid=holder.pid)
        handle = nvml.nvmlDeviceGetHandleByIndex(2)
        (proc,) = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        assert (proc.pid, proc.usedGpuMemory) == (holder.pid, 3 << 30)
        assert nvml.nvmlDeviceGetMemoryInfo(handle).used == (3 << 30) + (512 << 20)
    finally:
        holder.kill()
        holder.wait()


def test_memory_of_a_dead_holder_is_released_after_the_delay(nvml, gpu_state_dir):
    holder = _holder_process()
    gpu_state.register_holder(gpu_state_dir, 0, 1 << 30, pid=holder.pid, release_delay_s=60)
    holder.kill()
    holder.wait()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    dead_at = gpu_state.read_holdings(gpu_state_dir)[0]
    assert dead_at.listed  # within the delay: still used, PID still listed (a rank in D state)
    later = gpu_state.read_holdings(gpu_state_dir, now=time.time() + 61)
    assert later == ()
    assert nvml.nvmlDeviceGetComputeRunningProcesses(handle) == []
    assert nvml.nvmlDeviceGetMemoryInfo(handle).used == 512 << 20


def test_stuck_memory_stays_unlisted_until_reset(nvml, gpu_state_dir, monkeypatch):
    holder = _holder_process()
    gpu_state.register_holder(gpu_state_dir, 3, 7 << 30, pid=holder.pid, stuck=True)
    holder.kill()
    holder.wait()
    handle = nvml.nvmlDeviceGetHandleByIndex(3)
    wait_until(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle) == [], what="unlisted")
    assert nvml.nvmlDeviceGetMemoryInfo(handle).used == (7 << 30) + (512 << 20)
    monkeypatch.setenv("FAKE_GPU_STATE_DIR", str(gpu_state_dir))
    result = subprocess.run(
        [sys.executable, "-m", "supervisor.testing.fake_gpu_reset", "3"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout
    assert "was successfully reset" in result.stdout
    assert nvml.nvmlDeviceGetMemoryInfo(handle).used == 512 << 20


def test_reset_is_refused_while_a_live_process_holds_the_gpu(gpu_state_dir):
    holder = _holder_process()
    try:
        gpu_state.register_holder(gpu_state_dir, 1, 1 << 30, pid=holder.pid, stuck=True)
        code, message = reset(gpu_state_dir, gpu_state.gpu_uuid(1))
        assert code == EXIT_OTHER
        assert "In use by another client" in message
        assert gpu_state.live_holders(gpu_state_dir, 1) == (holder.pid,)
    finally:
        holder.kill()
        holder.wait()


def test_reset_of_an_unknown_gpu_or_without_driver_fails_like_nvidia_smi(gpu_state_dir):
    assert reset(gpu_state_dir, "9")[0] == 6
    assert reset(None, "0")[0] == 9


def test_a_recycled_pid_does_not_keep_the_memory(gpu_state_dir):
    """The holder file records the start time, so another process under that PID is not it."""
    path = gpu_state.register_holder(gpu_state_dir, 0, 1 << 30, pid=os.getpid())
    assert gpu_state.live_holders(gpu_state_dir, 0) == (os.getpid(),)
    data = json.loads(path.read_text())
    data["start_ticks"] -= 1  # as if this PID had been recycled since the registration
    gpu_state.write_json_atomic(path, data)
    assert gpu_state.live_holders(gpu_state_dir, 0) == ()
    assert gpu_state.read_holdings(gpu_state_dir) == ()  # dead, no delay: released


def test_ranks_register_on_base_gpu_id_plus_rank_times_step_and_release_on_death(
    start_fake_server, gpu_state_dir
):
    server = start_fake_server(
        ["--tp-size", "2", "--base-gpu-id", "2", "--gpu-id-step", "3"], state_dir=gpu_state_dir
    )
    wait_until(lambda: server.status() == 200, what="server up")
    held = {h.gpu_index: h.pid for h in gpu_state.read_holdings(gpu_state_dir)}
    ranks = server.titled()
    assert held == {
        2: ranks["sglang::scheduler_TP0"].pid,
        5: ranks["sglang::scheduler_TP1"].pid,
    }
    fake_nvml.set_state_dir(gpu_state_dir)
    sensor = open_gpu_sensor("nvml", module=fake_nvml)
    try:
        gpus = sensor.read_gpus()
        assert gpus is not None
        by_uuid = {g.uuid: g for g in gpus}
        gpu2 = by_uuid[gpu_state.gpu_uuid(2)]
        assert [p.pid for p in gpu2.processes] == [ranks["sglang::scheduler_TP0"].pid]
        assert gpu2.used_bytes > gpu2.total_bytes // 2
        assert gpu2.numa_node == 0
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)
        psutil.wait_procs(list(ranks.values()), timeout=10)
        wait_until(
            lambda: all(not g.processes for g in sensor.read_gpus() or ()), what="GPUs released"
        )
    finally:
        sensor.close()
        fake_nvml.set_state_dir(None)


def test_gpu_release_delay_holds_memory_after_the_ranks_die(start_fake_server, gpu_state_dir):
    server = start_fake_server(scenario={"gpu_release_delay_s": 60}, state_dir=gpu_state_dir)
    wait_until(lambda: server.status() == 200, what="server up")
    rank = server.titled()["sglang::scheduler"]
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=10)
    psutil.wait_procs([rank], timeout=10)
    (holding,) = gpu_state.read_holdings(gpu_state_dir)
    assert (holding.pid, holding.listed) == (rank.pid, True)


def test_hang_nvml_makes_calls_block(start_fake_server, gpu_state_dir):
    """The scenario writes the hang into the state dir; a caller must time out NVML calls."""
    server = start_fake_server(scenario={"hang_nvml_s": 30}, state_dir=gpu_state_dir)
    wait_until(lambda: gpu_state.nvml_hang_s(gpu_state_dir) == 30, what="hang knob written")
    code = "from supervisor.testing import fake_nvml; fake_nvml.nvmlInit(); print('answered')"
    env = dict(os.environ, FAKE_GPU_STATE_DIR=str(gpu_state_dir))
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", code], env=env, timeout=2, capture_output=True)
    gpu_state.set_nvml_hang(gpu_state_dir, None)
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        timeout=30,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.stdout.strip() == "answered"
    server.stop()


def test_open_sensor_backends(gpu_state_dir, monkeypatch):
    assert open_sensor("none").read_gpus() is None
    with pytest.raises(GpuBackendError, match="unknown GPU backend"):
        open_sensor("cuda")
    monkeypatch.delenv("FAKE_GPU_STATE_DIR", raising=False)
    fake_nvml.set_state_dir(None)
    with pytest.raises(GpuBackendError, match="no simulated GPUs"):
        open_sensor("sim")
    monkeypatch.setenv("FAKE_GPU_STATE_DIR", str(gpu_state_dir))
    sensor = open_sensor("sim")
    gpus = sensor.read_gpus()
    sensor.close()
    assert gpus is not None
    assert len(gpus) == 8


def test_auto_without_a_driver_is_none_and_nvml_says_why():
    """This machine has no NVIDIA driver: auto falls back to none, nvml explains."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("a real NVIDIA driver is present")
    assert open_gpu_sensor("auto").read_gpus() is None
    with pytest.raises(GpuBackendError, match="NVIDIA driver"):
        open_gpu_sensor("nvml")


def test_calls_after_the_last_shutdown_raise_uninitialized(gpu_state_dir):
    fake_nvml.set_state_dir(gpu_state_dir)
    fake_nvml.nvmlInit()
    fake_nvml.nvmlInit()
    fake_nvml.nvmlShutdown()
    assert fake_nvml.nvmlDeviceGetCount() == 8  # init is reference-counted, as in NVML
    fake_nvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake_nvml.nvmlDeviceGetCount()
    fake_nvml.set_state_dir(None)
