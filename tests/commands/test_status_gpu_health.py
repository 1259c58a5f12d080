"""`sglang-supervisor status` shows the last GPU health gate, GPU by GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.commands.test_status_cmd import LAUNCH, run_cli, status_of
from tests.core.test_gpu_health_visible import gate_event


def test_status_shows_each_gpus_verdict_at_the_last_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    status_of(tmp_path, gate_event(), *LAUNCH, {"event": "ready"})
    assert run_cli(["status", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "GPU health" in out
    assert "GPU 0 ok; GPU 1 fail (a row remap is pending: needs a reset)" in out
