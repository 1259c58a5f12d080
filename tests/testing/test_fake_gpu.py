"""`python -m supervisor.testing.fake_gpu` (create, reset, list), its `fake_gpu_reset` alias, and
what the simulation says when FAKE_GPU_STATE_DIR holds no simulated GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pynvml
import pytest

from supervisor.testing import fake_nvml, gpu_state
from tests.testing.support import fake_gpu, fake_server_env, run_fake_to_exit, run_gpu_tool

HINT = "python -m supervisor.testing.fake_gpu create 8 --dir"


@pytest.fixture
def holder() -> Iterator[subprocess.Popen[bytes]]:
    """A live process to hold GPU memory (a stand-in for a rank)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_create_writes_the_gpus_and_list_shows_them(tmp_path):
    state_dir = tmp_path / "gpus"
    made = fake_gpu(
        "create", "4", "--dir", str(state_dir), "--numa-nodes", "2", "--total-bytes", "80GiB"
    )
    assert made.returncode == 0, made.stderr
    gpus = gpu_state.read_gpus(state_dir)
    assert [(g.index, g.numa_node, g.total_bytes) for g in gpus] == [
        (i, i // 2, 80 << 30) for i in range(4)
    ]
    assert f"GPU 3: NVIDIA H200 (UUID: {gpu_state.gpu_uuid(3)})" in made.stdout
    listed = fake_gpu("list", "--json", state_dir=state_dir)  # the dir from the environment
    assert listed.returncode == 0, listed.stderr
    described = json.loads(listed.stdout)
    assert [g["uuid"] for g in described["gpus"]] == [g.uuid for g in gpus]
    assert all(g["used_bytes"] == gpu_state.DEFAULT_BASELINE_USED_BYTES for g in described["gpus"])
    assert all(g["holders"] == [] for g in described["gpus"])


def test_create_takes_the_dir_from_the_environment(tmp_path):
    made = fake_gpu("create", "2", state_dir=tmp_path / "env-gpus")
    assert made.returncode == 0, made.stderr
    assert len(gpu_state.read_gpus(tmp_path / "env-gpus")) == 2


def test_list_shows_live_holders_and_stuck_memory_until_a_reset(tmp_path, holder):
    state_dir = tmp_path / "gpus"
    gpu_state.create_gpus(state_dir, 4)
    gpu_state.register_holder(state_dir, 3, 3 << 30, pid=holder.pid, stuck=True)
    listed = fake_gpu("list", "--dir", str(state_dir))
    assert f"    pid {holder.pid}: 3072 MiB\n" in listed.stdout
    assert "3584 MiB used" in listed.stdout
    refused = fake_gpu("reset", "3", "--dir", str(state_dir))
    assert refused.returncode == 255
    assert "In use by another client" in refused.stdout
    holder.kill()
    holder.wait()
    listed = fake_gpu("list", "--dir", str(state_dir))
    assert "    no pid: 3072 MiB (stuck until reset 3)\n" in listed.stdout
    done = fake_gpu("reset", gpu_state.gpu_uuid(3), "--dir", str(state_dir))
    assert (done.returncode, done.stdout) == (
        0,
        "GPU 00000000:48:00.0 was successfully reset.\nAll done.\n",
    )
    assert json.loads(fake_gpu("list", "--json", state_dir=state_dir).stdout)["gpus"][3] == {
        "index": 3,
        "uuid": gpu_state.gpu_uuid(3),
        "name": gpu_state.DEFAULT_NAME,
        "numa_node": 0,
        "total_bytes": gpu_state.DEFAULT_TOTAL_BYTES,
        "used_bytes": gpu_state.DEFAULT_BASELINE_USED_BYTES,
        "holders": [],
        "nvlink_group": None,
        "per_gpu_reset": True,
        "faults": [],
    }


@pytest.mark.parametrize(
    ("device", "dir_kind", "code", "says"),
    [
        ("1", "gpus", 0, "was successfully reset."),
        ("9", "gpus", 6, "No devices were found"),
        ("GPU-nope", "gpus", 6, "No devices were found"),
        ("1", "empty", 9, "couldn't communicate with the NVIDIA driver"),
        ("1", "missing", 9, "couldn't communicate with the NVIDIA driver"),
    ],
)
def test_reset_and_its_alias_answer_alike(tmp_path, device, dir_kind, code, says):
    state_dir = tmp_path / dir_kind
    if dir_kind == "gpus":
        gpu_state.create_gpus(state_dir, 2)
    elif dir_kind == "empty":
        state_dir.mkdir()
    new = fake_gpu("reset", device, "--dir", str(state_dir))
    alias = run_gpu_tool(
        "supervisor.testing.fake_gpu_reset", "-r", "-i", device, state_dir=state_dir
    )
    assert (new.returncode, new.stdout) == (alias.returncode, alias.stdout)
    assert new.returncode == code
    assert says in new.stdout
    if code == 9:  # nvidia-smi's words, and on stderr what is really wrong
        assert f"{HINT} {state_dir}`" in new.stderr
        assert new.stderr == alias.stderr


def test_the_alias_without_a_state_dir_is_a_host_without_a_driver():
    alias = run_gpu_tool("supervisor.testing.fake_gpu_reset", "0")
    assert alias.returncode == 9
    assert "FAKE_GPU_STATE_DIR is not set" in alias.stderr
    assert run_gpu_tool("supervisor.testing.fake_gpu_reset").returncode == 2


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["bogus"], "invalid choice: 'bogus'"),
        (["create"], "the following arguments are required: N"),
        (["create", "x", "--dir", "{d}"], "argument N: not an integer: 'x'"),
        (["create", "-1", "--dir", "{d}"], "N: must be at least 0: -1"),
        (["create", "2", "--dir", "{d}", "--total-bytes", "lots"], "not a size: 'lots'"),
        (["create", "2", "--dir", "{d}", "--numa-nodes", "0"], "must be at least 1: 0"),
        (["create", "2"], "create: no state dir: pass --dir DIR or set FAKE_GPU_STATE_DIR"),
        (["list"], "list: no state dir"),
        (["reset", "0"], "reset: no state dir"),
        (["list", "--dir", "{d}/missing"], f"does not exist; create simulated GPUs with `{HINT}"),
    ],
)
def test_bad_input_exits_2_with_a_message_and_no_traceback(tmp_path, args, says):
    result = fake_gpu(*(a.replace("{d}", str(tmp_path)) for a in args))
    assert result.returncode == 2
    assert says in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "missing").exists()


def test_create_over_a_file_exits_2(tmp_path):
    (tmp_path / "taken").write_text("")
    result = fake_gpu("create", "2", "--dir", str(tmp_path / "taken"))
    assert result.returncode == 2
    assert "cannot create" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("dir_kind", "says"),
    [
        ("empty", "holds no gpus.json"),
        ("missing", "does not exist"),
        ("corrupt", "has an unreadable gpus.json"),
    ],
)
def test_the_server_refuses_a_state_dir_without_gpus_before_starting(tmp_path, dir_kind, says):
    state_dir = tmp_path / dir_kind
    if dir_kind != "missing":
        state_dir.mkdir()
    if dir_kind == "corrupt":
        (state_dir / gpu_state.GPUS_FILE).write_text("{")
    result = run_fake_to_exit(
        ["--model-path", "m", "--tp-size", "2"], fake_server_env(None, state_dir=state_dir)
    )
    assert result.returncode == 2
    assert result.stderr.startswith("fake_sglang: FAKE_GPU_STATE_DIR: simulated GPU state dir")
    assert says in result.stderr
    assert f"{HINT} {state_dir}`" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    # Nothing started: no rank registered a holding, no directory appeared.
    assert not (state_dir / gpu_state.HOLDERS_DIR).exists()


@pytest.fixture
def sim_nvml() -> Iterator[None]:
    yield
    fake_nvml.set_state_dir(None)


@pytest.mark.parametrize("dir_kind", ["empty", "missing", "unset"])
def test_nvml_init_without_gpus_raises_driver_not_loaded_saying_why(
    tmp_path, monkeypatch, sim_nvml, dir_kind
):
    monkeypatch.delenv("FAKE_GPU_STATE_DIR", raising=False)
    state_dir = tmp_path / dir_kind
    if dir_kind == "empty":
        state_dir.mkdir()
    if dir_kind != "unset":
        monkeypatch.setenv("FAKE_GPU_STATE_DIR", str(state_dir))
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded) as info:
        fake_nvml.nvmlInit()
    assert info.value.value == pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert isinstance(info.value, pynvml.NVMLError)
    text = str(info.value)
    assert text.startswith("Driver Not Loaded: ")
    assert "python -m supervisor.testing.fake_gpu create 8 --dir" in text
    if dir_kind == "unset":
        assert "FAKE_GPU_STATE_DIR is not set" in text
    else:
        assert str(state_dir) in text


def test_gpus_vanishing_under_an_initialised_nvml_raise_driver_not_loaded(tmp_path, sim_nvml):
    state_dir = tmp_path / "gpus"
    gpu_state.create_gpus(state_dir, 2)
    fake_nvml.set_state_dir(state_dir)
    fake_nvml.nvmlInit()
    try:
        assert fake_nvml.nvmlDeviceGetCount() == 2
        (state_dir / gpu_state.GPUS_FILE).unlink()
        with pytest.raises(pynvml.NVMLError_DriverNotLoaded, match=r"holds no gpus\.json"):
            fake_nvml.nvmlDeviceGetCount()
    finally:
        fake_nvml.nvmlShutdown()
