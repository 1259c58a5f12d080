"""The host-wide reservation ledger between real processes: a `run` that is still loading holds
its plan there, another pre-flight on the host counts it, and the entry goes at ready or stop."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.run_support import MODEL_CONFIG, ROOT, supervisor

pytestmark = pytest.mark.slow


def entries(ledger_dir: Path) -> list[dict[str, object]]:
    path = ledger_dir / "ledger.json"
    if not path.exists():
        return []
    found: list[dict[str, object]] = json.loads(path.read_text())["reservations"]
    return found


def preflight_checks(ledger_dir: Path, tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "neighbour.toml"
    config.write_text(f'[preflight]\nledger_dir = "{ledger_dir}"\n[run]\nname = "neighbour"\n')
    argv = [sys.executable, "-m", "supervisor", "preflight", "--json", "--config", str(config)]
    argv += ["--model-config", str(MODEL_CONFIG), "--gpu-backend", "none"]
    argv += ["--gpus", "2", "--gpu-memory", "80GiB", "--", "--model-path", "m", "--tp", "2"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    return {c["name"]: c["detail"] for c in json.loads(done.stdout)["checks"]}


def test_a_loading_instance_is_counted_by_another_preflight_until_it_stops(
    tmp_path, free_port, simulated_process_guard
):
    state_dir = tmp_path / "state"
    ledger_dir = state_dir / "ledger"
    scenario = {"startup_s": 120.0}  # loads until the test stops it
    # A plan well above what the simulated tree really holds (tens of MiB of interpreters):
    # with the shrunk default overheads the tree "pins" its whole plan at the first reading and
    # has nothing outstanding for a neighbour to count.
    plan = {"preflight": {"per_rank_overhead": "1GiB"}}
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario=scenario,
        state_dir=state_dir,
        overrides=plan,
    ) as sup:
        sup.wait_event("loading")
        [mine] = entries(ledger_dir)
        assert mine["pid"] == sup.proc.pid
        assert isinstance(mine["planned_bytes"], int)
        assert mine["planned_bytes"] > 0
        checks = preflight_checks(ledger_dir, tmp_path)
        assert "planned and not yet pinned by other instances" in checks["ledger"]
        assert str(mine["instance"]) in checks["ledger"]
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
    assert entries(ledger_dir) == []
    assert "ledger" not in preflight_checks(ledger_dir, tmp_path)


def test_the_entry_goes_once_the_server_is_ready(tmp_path, free_port, simulated_process_guard):
    state_dir = tmp_path / "state"
    with supervisor(tmp_path, free_port, simulated_process_guard, state_dir=state_dir) as sup:
        sup.wait_event("ready")
        assert entries(state_dir / "ledger") == []
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
