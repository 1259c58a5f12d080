"""The pre-flight on a measured host (no planning facts): a fake /proc and /sys, a fake GPU
sensor, simulated GPUs through the CLI, and what it never imports (SGLang, torch, `run`'s
libraries)."""

from __future__ import annotations

import ast
import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.adapters.host import HostProbe
from supervisor.config import HostConfig, SupervisorConfig
from supervisor.core.readings import GpuProcess, GpuState
from supervisor.core.units import GB, GiB
from supervisor.preflight import run_preflight
from tests.fakes import FakeClock, ScriptedGpus
from tests.preflight.support import KIMI, KIMI_ARGS, SEED, run_json


def fake_gpus(gpus: tuple[GpuState, ...] | None) -> ScriptedGpus:
    return ScriptedGpus(FakeClock(), lambda _now: gpus)


def gpu(index: int, used: int = 0, node: int = 0, pids: tuple[int, ...] = ()) -> GpuState:
    return GpuState(
        index=index,
        uuid=f"GPU-{index}",
        name="NVIDIA RTX PRO 6000",
        total_bytes=96 * GiB,
        used_bytes=used,
        processes=tuple(GpuProcess(pid=p, used_bytes=1) for p in pids),
        numa_node=node,
    )


def fake_host(tmp_path: Path, cgroup: str = "0::/\n") -> HostProbe:
    proc, sys_root, cg = tmp_path / "proc", tmp_path / "sys", tmp_path / "cg"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(
        f"MemTotal: {449 * GB // 1024} kB\nMemAvailable: {445 * GB // 1024} kB\n"
    )
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "self" / "limits").write_text("Max locked memory  unlimited  unlimited  bytes\n")
    for node in (0, 1):
        d = sys_root / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        d.joinpath("meminfo").write_text(
            f"Node {node} MemTotal: 300000000 kB\nNode {node} MemFree: 250000000 kB\n"
        )
    cg.mkdir()
    (cg / "cgroup.controllers").write_text("memory\n")
    return HostProbe(proc_root=proc, sys_root=sys_root, cgroup_root=cg, shm_path=tmp_path)


def measured_config() -> SupervisorConfig:
    base = SupervisorConfig()
    server = dataclasses.replace(base.server, model_config=str(KIMI))
    pre = dataclasses.replace(base.preflight, weights_bytes=595 * GB)
    return dataclasses.replace(base, server=server, preflight=pre, host=HostConfig())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def with_numactl(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has a `numactl` (SGLang only looks it up)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    numactl = bin_dir / "numactl"
    numactl.write_text("#!/bin/sh\nexit 0\n")
    numactl.chmod(0o755)
    return {"PATH": str(bin_dir)}


def test_measured_box_reads_gpus_numa_and_local_checks(tmp_path):
    port = free_port()
    gpus = fake_gpus(tuple(gpu(i, used=GiB, node=i // 4) for i in range(8)))
    args = [*KIMI_ARGS, "--hicache-size", "48", "--host", "127.0.0.1", "--port", str(port)]
    report = run_preflight(
        measured_config(),
        args,
        gpu_sensor=gpus,
        probe=fake_host(tmp_path),
        env=with_numactl(tmp_path),
    )
    status = {c.name: c.status.value for c in report.checks}
    assert report.verdict == "fit", report.render_table()
    assert report.device_tokens_per_rank
    assert report.device_tokens_per_rank > 0
    assert status["numa_node0"] == status["numa_node1"] == "ok"
    assert status["port"] == status["gpu_holders"] == status["memlock"] == "ok"
    numa = next(c for c in report.checks if c.name == "numa")
    assert "numactl --membind" in numa.detail


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"PATH": "/nonexistent"}, "numactl is not on PATH"),
        ({"SGLANG_NUMA_BIND_V2": "0"}, "a preferred node"),
        ({"SGLANG_AUTO_NUMA_BIND": "0"}, "SGLANG_AUTO_NUMA_BIND=0"),
    ],
)
def test_per_node_fit_is_checked_only_when_sglang_membinds(tmp_path, env, why):
    gpus = fake_gpus(tuple(gpu(i, node=i // 4) for i in range(8)))
    args = [*KIMI_ARGS, "--hicache-size", "48"]
    environ = {**with_numactl(tmp_path), **env}
    report = run_preflight(
        measured_config(), args, gpu_sensor=gpus, probe=fake_host(tmp_path), env=environ
    )
    names = {c.name for c in report.checks}
    assert "numa_node0" not in names
    numa = next(c for c in report.checks if c.name == "numa")
    assert why in numa.detail


def test_numa_node_flag_maps_each_gpu_to_the_node_it_names(tmp_path):
    """--numa-node is indexed by GPU id and wins over what NVML reports."""
    gpus = fake_gpus(tuple(gpu(i, node=0) for i in range(8)))
    args = [*KIMI_ARGS, "--hicache-size", "48", "--numa-node", *["1"] * 8]
    report = run_preflight(
        measured_config(),
        args,
        gpu_sensor=gpus,
        probe=fake_host(tmp_path),
        env=with_numactl(tmp_path),
    )
    nodes = {n["node"]: n["ranks"] for n in report.numa}
    assert nodes == {0: 0, 1: 8}


def test_busy_gpu_bound_port_and_cgroup_garbage(tmp_path):
    gpus = fake_gpus(tuple(gpu(i, pids=(4242,) if i == 3 else ()) for i in range(8)))
    probe = fake_host(tmp_path, cgroup="0::/sub\n")
    (probe.cgroup_root / "sub").mkdir()
    (probe.cgroup_root / "sub" / "memory.max").write_text("garbage\n")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        args = [*KIMI_ARGS, "--hicache-size", "48", "--host", "127.0.0.1", "--port", str(port)]
        report = run_preflight(measured_config(), args, gpu_sensor=gpus, probe=probe, env={})
    checks = {c.name: c for c in report.checks}
    assert checks["cgroup"].status.value == "warn"
    assert checks["port"].status.value == "fail"
    assert checks["gpu_holders"].status.value == "fail"
    assert "4242" in checks["gpu_holders"].detail
    assert checks["host_memory"].status.value == "ok"
    assert report.verdict == "no-fit"


def test_too_few_gpus_and_hugepages_shortfall(tmp_path):
    gpus = fake_gpus(tuple(gpu(i) for i in range(4)))
    args = [*KIMI_ARGS, "--hicache-size", "48"]
    env = {"SGLANG_HUGEPAGE_SIZE": "1GB"}
    report = run_preflight(
        measured_config(), args, gpu_sensor=gpus, probe=fake_host(tmp_path), env=env
    )
    checks = {c.name: c.status.value for c in report.checks}
    assert checks["gpus"] == "fail"
    assert checks["hugepages"] == "fail"


def test_unreadable_numa_meminfo_is_a_warning_and_a_bad_hugepage_size_is_named(tmp_path):
    probe = fake_host(tmp_path)
    node1 = probe.sys_root / "devices" / "system" / "node" / "node1" / "meminfo"
    node1.write_text("nonsense\n")
    env = {"SGLANG_HUGEPAGE_SIZE": "huge"}
    args = [*KIMI_ARGS, "--hicache-size", "48"]
    report = run_preflight(
        measured_config(), args, gpu_sensor=fake_gpus(None), probe=probe, env=env
    )
    checks = {c.name: c for c in report.checks}
    assert checks["numa"].status.value == "warn"
    assert "unreadable" in checks["numa"].detail
    assert checks["hugepages"].status.value == "fail"
    assert "'huge'" in checks["hugepages"].detail
    assert checks["gpus"].status.value == "warn"


def test_simulated_gpus_give_the_device_pool(capsys, tmp_path, monkeypatch):
    from supervisor.testing.gpu_state import create_gpus

    create_gpus(tmp_path / "gpus", 8, total_bytes=97887 * 1024 * 1024)
    monkeypatch.setenv("FAKE_GPU_STATE_DIR", str(tmp_path / "gpus"))
    facts = ["--mem-available", "445GB", "--weights", "595GB", "--model-config", str(KIMI)]
    args = [*KIMI_ARGS, "--hicache-size", "48"]
    code, data = run_json(capsys, *facts, "--gpu-backend", "sim", "--", *args)
    assert code == 0
    assert data["gpu_memory_bytes"] == 97887 * 1024 * 1024
    assert data["device_tokens_per_rank"] > 100_000
    gpus = next(c for c in data["checks"] if c["name"] == "gpus")
    assert gpus["detail"] == "8 GPU(s) visible"


# What the pre-flight's answer never needs: SGLang and torch (the argv is read by the supervisor
# itself), `run`'s libraries, and importlib.metadata (the SGLang version comes from its
# dist-info directly). PyYAML only when SGLang's own `--config FILE.yaml` is in the argv.
NOT_ON_THE_PREFLIGHT_PATH = (
    "sglang",
    "torch",
    "structlog",
    "requests",
    "tenacity",
    "psutil",
    "pynvml",
    "yaml",
    "importlib.metadata",
)


def imported_by_preflight(*args: str) -> list[str]:
    """The modules of NOT_ON_THE_PREFLIGHT_PATH a fresh interpreter has after `preflight ARGS`."""
    code = (
        "import sys\n"
        "from supervisor.cli import main\n"
        "try:\n"
        f"    main(['preflight', '--json', *{list(args)!r}])\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print('IMPORTED', [m for m in {NOT_ON_THE_PREFLIGHT_PATH!r} if m in sys.modules])\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert '"checks"' in done.stdout, done.stderr  # a report, not an early exit
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("IMPORTED "), done.stderr
    return list(ast.literal_eval(last.removeprefix("IMPORTED ")))


def test_preflight_never_imports_sglang_torch_or_the_runs_libraries():
    assert imported_by_preflight("--config", str(SEED)) == []


def test_preflight_measuring_this_host_imports_none_of_them_either():
    facts = ["--gpu-backend", "none", "--weights", "595GB", "--model-config", str(KIMI)]
    assert imported_by_preflight(*facts, "--", *KIMI_ARGS, "--port", "39999") == []


def test_pyyaml_is_imported_only_for_sglangs_own_config_file(tmp_path):
    flags = tmp_path / "flags.yaml"
    flags.write_text("hicache-size: 48\n", encoding="utf-8")
    argv = ["--config", str(SEED), "--", *KIMI_ARGS, "--config", str(flags)]
    assert imported_by_preflight(*argv) == ["yaml"]


@pytest.mark.timeout(10)  # a regression blocks in open() on the FIFO: fail, never hang
def test_a_fifo_as_the_measurements_file_is_ignored_with_a_warning(tmp_path):
    from supervisor.preflight.measurements import FILE_NAME, load_records

    os.mkfifo(tmp_path / FILE_NAME)
    records, problem = load_records(tmp_path)
    assert records == ()
    assert problem is not None
    assert "not a regular file (a FIFO)" in problem
