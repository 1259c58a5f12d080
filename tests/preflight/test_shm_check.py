"""The pre-flight on this box reads /dev/shm's free space: a full /dev/shm of normal size refuses
the launch (exit 1 under `run`), naming /dev/shm, what is free and what the launch needs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.core.checks import Check, FitReport, Status
from supervisor.preflight import run_preflight
from tests.preflight.support import KIMI_ARGS
from tests.preflight.test_measured import fake_gpus, fake_host, gpu, measured_config


def statvfs_of(size_bytes: int, free_bytes: int) -> os.statvfs_result:
    block = 4096
    blocks, free = size_bytes // block, free_bytes // block
    return os.statvfs_result((block, block, blocks, free, free, 1000, 900, 900, 0, 255, 0))


def shm_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free_bytes: int
) -> tuple[FitReport, Check]:
    real = os.statvfs
    shm = tmp_path / "shm"
    shm.mkdir()

    def statvfs(path: str | os.PathLike[str]) -> os.statvfs_result:
        return statvfs_of(16 << 30, free_bytes) if Path(path) == shm else real(path)

    monkeypatch.setattr(os, "statvfs", statvfs)
    probe = fake_host(tmp_path)
    probe.shm_path = shm
    report = run_preflight(
        measured_config(),
        [*KIMI_ARGS, "--hicache-size", "48"],
        gpu_sensor=fake_gpus(tuple(gpu(i, node=i // 4) for i in range(8))),
        probe=probe,
        env={"PATH": "/nonexistent"},
    )
    return report, next(c for c in report.checks if c.name == "shm")


def test_a_full_dev_shm_of_normal_size_refuses_the_launch(tmp_path, monkeypatch):
    report, check = shm_check(tmp_path, monkeypatch, free_bytes=0)
    assert check.status is Status.FAIL
    assert report.verdict == "no-fit"
    assert "/dev/shm has 0.0 MiB free (0 B) of 16,384.0 MiB" in check.detail
    assert "SGLang's own segments need 24.0 MiB" in check.detail  # TP8's broadcast queue
    assert "shm" in report.render_table()


def test_an_empty_dev_shm_passes(tmp_path, monkeypatch):
    _report, check = shm_check(tmp_path, monkeypatch, free_bytes=16 << 30)
    assert check.status is Status.OK, check.detail
    assert "needs about 248.0 MiB" in check.detail  # 24 MiB + 8 x 7 pairs x 4 MiB
