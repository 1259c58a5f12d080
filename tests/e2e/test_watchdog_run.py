"""`sglang-supervisor run` with the watchdog on and simulated GPUs: a leaking rank gets the whole
group killed and the server relaunched; a GPU that stays dirty after a failed reset ends the run
with exit code 6 and no relaunch."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.cgroups import remove_instance_cgroups
from tests.e2e.run_support import CONTAINMENT, MODEL_CONFIG, ROOT, SERVER_COMMAND, marked_pids
from tests.testing.support import fake_server_env
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

MiB = 2**20

# Real bytes, no scaling: the pre-flight's overheads are set to what a simulated 2-rank tree
# really uses (~65 MiB of Python), so budget + margin sits 16 MiB above it.
CONFIG = """
[server]
model_config = "{model_config}"

[preflight]
reserve = "0B"
ledger_dir = "{state_dir}/ledger"
per_rank_overhead = "20MiB"
main_overhead = "30MiB"

[run]
name = "{name}"
state_dir = "{state_dir}"
cgroup = "{cgroup}"
health_interval = "0.3s"
health_timeout = "2s"
stop_grace = "5s"
backoff_initial = "0.1s"
backoff_max = "0.2s"

[watchdog]
tree_margin_percent = 0.0
tree_margin = "16MiB"
# The host levels stay far below anything a shared test machine reaches.
warn = "3MiB"
terminate = "2MiB"
kill = "1MiB"
warn_percent = 0.0
terminate_percent = 0.0
kill_percent = 0.0

[gpu]
backend = "sim"
release_timeout = "1s"
reset_command = "{reset}"
"""


_WHY = ("cause", "failure", "reason", "hint", "restart_count")


class Run:
    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path, state_dir: Path) -> None:
        self.proc = proc
        self.log_path = log_path
        self.state_dir = state_dir

    def events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("event") == name:
                    out.append(event)
        return out

    def story(self) -> str:
        """The run's events in order, with why each failure happened: a failed assertion's text."""
        lines = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("event") != "server_output":
                    why = {k: event[k] for k in _WHY if k in event}
                    lines.append(f"{event.get('event')} {why}" if why else str(event.get("event")))
        return "\n".join(lines)

    def wait_event(self, name: str, count: int = 1, timeout_s: float = 60) -> dict[str, Any]:
        found: list[dict[str, Any]] = wait_until(
            lambda: ev if len(ev := self.events(name)) >= count else [],
            timeout_s=timeout_s,
            what=f"{count} {name} event(s); log tail "
            f"{self.log_path.read_text(errors='replace')[-800:]!r}",
        )
        return found[count - 1]


@contextlib.contextmanager
def supervised(
    tmp_path: Path,
    port: int,
    marker: str,
    gpus: Path,
    scenario: Mapping[str, Any],
    reset: str,
) -> Iterator[Run]:
    state_dir = tmp_path / "state"
    config = tmp_path / "wd.toml"
    # One instance name per test: a supervisor starting kills every live process carrying its
    # instance's marker as a leftover, so two suites on one machine must never share a name.
    name = f"wd-{uuid.uuid4().hex[:10]}"
    text = CONFIG.format(
        model_config=MODEL_CONFIG, state_dir=state_dir, reset=reset, name=name, cgroup=CONTAINMENT
    )
    config.write_text(text)
    env = fake_server_env(scenario, state_dir=gpus)
    log_path = tmp_path / "supervisor.log"
    argv = [sys.executable, "-m", "supervisor", "run", "--config", str(config)]
    argv += ["--server-command", SERVER_COMMAND, "--log-format", "json", "--"]
    argv += ["--model-path", "fake/model", "--port", str(port), "--tp", "2"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    passed = False
    try:
        yield Run(proc, log_path, state_dir)
        passed = True
    finally:
        exited_itself = proc.poll() is not None and proc.returncode != -signal.SIGKILL
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        for pid in marked_pids(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        left = remove_instance_cgroups(name)
        if left and passed and exited_itself:
            raise AssertionError(f"the supervisor left cgroups behind (removed now): {left}")


def test_a_leaking_rank_gets_the_whole_group_killed_and_the_server_relaunched(
    tmp_path: Path,
    free_port: int,
    simulated_process_guard: str,
    make_gpu_state: Callable[..., Path],
):
    gpus = make_gpu_state(2)
    scenario = {
        "startup_s": 0.1,
        "leak": {"rank": 1, "bytes_per_s": 32 * MiB, "after_s": 1.5, "max_bytes": 48 * MiB},
        "gpu_release_delay_s": 0.3,
    }
    reset = f"{sys.executable} -m supervisor.testing.fake_gpu_reset {{index}}"
    with supervised(tmp_path, free_port, simulated_process_guard, gpus, scenario, reset) as run:
        limits = run.wait_event("watchdog_limits")
        assert limits["tree_kill_bytes"] == limits["tree_budget_bytes"] + 16 * MiB
        run.wait_event("ready")
        killed = run.wait_event("server_killed")
        assert killed["cause"] == "memory_kill"
        assert len(killed["pids"]) >= 4  # main, both ranks, detokenizer: the whole group
        failed = run.wait_event("server_failed")
        assert failed["failure"] == "memory_kill"
        # The watchdog charged the tree before the kill line; nothing ran past it.
        incident_path = Path(run.wait_event("incident_written")["path"])
        incident = json.loads(incident_path.read_text())
        peak = max(t["tree_charged_bytes"] for t in incident["ticks"])
        assert peak < limits["tree_kill_bytes"]
        assert incident["decision"]["tree_growth_bytes_per_s"] > 0
        # GPUs released, then the same server comes back (no hierarchical cache: same size).
        run.wait_event("gpu_release_done")
        run.wait_event("hicache_not_shrunk")
        run.wait_event("ready", count=2)
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(timeout=60) == 0
    assert not marked_pids(simulated_process_guard)


def test_a_gpu_still_dirty_after_a_failed_reset_ends_the_run_with_exit_6(
    tmp_path: Path,
    free_port: int,
    simulated_process_guard: str,
    make_gpu_state: Callable[..., Path],
):
    gpus = make_gpu_state(2)
    scenario: dict[str, Any] = {
        "startup_s": 0.1,
        "crash": {"rank": 0, "after_s": 0.5, "exit_code": 1},
        "gpu_stuck": True,
    }
    broken_reset = f"{sys.executable} -m supervisor.testing.fake_gpu_reset 99"
    with supervised(
        tmp_path, free_port, simulated_process_guard, gpus, scenario, broken_reset
    ) as run:
        assert run.proc.wait(timeout=90) == 6
        assert len(run.events("launching")) == 1, run.story()
        failed = run.events("gpu_release_failed")
        assert failed
        assert "reset failed" in failed[0]["reason"]
        assert list(run.state_dir.glob("incident-*-gpu_unrecoverable-*.json"))
    assert not marked_pids(simulated_process_guard)
