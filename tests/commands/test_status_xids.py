"""`sglang-supervisor status` shows the Xids the driver reported, per GPU (from `gpu_event`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.adapters.status_file import STATUS_FILE
from tests.commands.test_status_cmd import LAUNCH, run_cli, status_of


def xid(gpu: int, code: int) -> dict[str, object]:
    return {"event": "gpu_event", "gpu": gpu, "kind": "xid", "xid": code, "decision": "log"}


def test_xids_per_gpu_in_the_text_and_the_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    dbe = {"event": "gpu_event", "gpu": 1, "kind": "dbe", "xid": None, "decision": "reset"}
    status_of(tmp_path, *LAUNCH, xid(10, 13), xid(1, 79), xid(10, 13), dbe, xid(2, 31))
    run_cli(["status", "--state-dir", str(tmp_path)])
    out = capsys.readouterr().out
    (line,) = [row for row in out.splitlines() if "GPU Xids" in row]
    assert (
        line.split("GPU Xids", 1)[1].strip()
        == "GPU 1: Xid 79 ×1; GPU 2: Xid 31 ×1; GPU 10: Xid 13 ×2"
    )
    run_cli(["status", "--state-dir", str(tmp_path), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["gpu_xids"] == {"10": {"13": 2}, "1": {"79": 1}, "2": {"31": 1}}
    assert json.loads((tmp_path / STATUS_FILE).read_text())["gpu_xids"] == data["gpu_xids"]


def test_no_xids_no_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    status_of(tmp_path, *LAUNCH)
    run_cli(["status", "--state-dir", str(tmp_path)])
    assert "GPU Xids" not in capsys.readouterr().out
