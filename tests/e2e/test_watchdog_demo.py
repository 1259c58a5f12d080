"""`sglang-supervisor demo` end to end, then a supervisor restart on the demo's state: the shrunk
--hicache-size survives it, and `reset-state` clears it."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.commands.demo import instance_name
from tests.cgroups import instance_cgroups, remove_instance_cgroups
from tests.e2e.run_support import ROOT, marked_pids
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def _run_demo() -> tuple[int, str, Path]:
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "demo", "--keep"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    kept = re.search(r"Files kept in (\S+)", done.stdout)
    assert kept, done.stdout + done.stderr
    return done.returncode, done.stdout, Path(kept.group(1))


def test_demo_tells_the_whole_story_and_the_override_survives_a_restart(
    simulated_process_guard: str, tmp_path: Path
):
    code, out, workdir = _run_demo()
    try:
        assert code == 0, out
        assert "pre-flight REFUSES" in out
        assert "safe --hicache-size 49" in out
        assert "WATCHDOG: killed the whole group" in out
        assert "GPU 3 reset" in out
        assert "restart smaller: --hicache-size 49 -> 36" in out
        assert "server launching: 8 ranks, --hicache-size 36" in out
        assert "stopped cleanly" in out
        assert not marked_pids(simulated_process_guard), "the demo left processes behind"
        assert not instance_cgroups(instance_name(workdir)), "the demo left cgroups behind"

        state_dir = workdir / "state"
        state = json.loads((state_dir / "state.json").read_text())
        assert state["hicache_size_override_gb"] == 36
        incidents = sorted(state_dir.glob("incident-*-memory_kill-*.json"))
        assert len(incidents) == 1
        incident = json.loads(incidents[0].read_text())
        for key in (
            "decision",
            "thresholds",
            "ticks",
            "meminfo",
            "pressure_memory",
            "top_processes",
            "gpu_snapshot",
            "server_log_tail",
        ):
            assert key in incident, key
        assert incident["top_processes"][0]["title"] == "sglang::scheduler_TP5"
        steps = [s["step"] for s in incident["next"]]
        # tree_gone comes from the watchdog's thread, the rest from the run loop, in this order.
        assert "tree_gone" in steps
        loop_steps = [s for s in steps if s != "tree_gone"]
        assert loop_steps[:2] == ["classified", "restart_smaller"]
        assert "gpu_release" in steps
        assert "relaunched" in steps
        release = next(s for s in incident["next"] if s["step"] == "gpu_release")
        assert release["reset_gpus"] == [3]

        _restart_on_the_same_state(workdir, tmp_path)

        cleared = subprocess.run(
            [sys.executable, "-m", "supervisor", "reset-state", "--state-dir", str(state_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            check=False,
        )
        assert cleared.returncode == 0, cleared.stderr
        assert "cleared --hicache-size override 36 GB" in cleared.stdout
        assert (
            json.loads((state_dir / "state.json").read_text())["hicache_size_override_gb"] is None
        )
    finally:
        import shutil

        remove_instance_cgroups(instance_name(workdir))
        shutil.rmtree(workdir, ignore_errors=True)


def _restart_on_the_same_state(workdir: Path, tmp_path: Path) -> None:
    """A fresh `sglang-supervisor run` with the demo's config and state: launches with 36."""
    log_path = tmp_path / "restart.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "supervisor",
                "run",
                "--config",
                str(workdir / "demo.toml"),
                "--log-format",
                "json",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=_env_for(workdir),
        )
    try:

        def events(name: str) -> list[dict[str, object]]:
            out = []
            for line in log_path.read_text(errors="replace").splitlines():
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if event.get("event") == name:
                    out.append(event)
            return out

        applied = wait_until(
            lambda: events("hicache_override_applied"),
            timeout_s=60,
            what="override applied at the restart",
        )
        assert applied[0]["hicache_size_gb"] == 36
        wait_until(lambda: events("ready"), timeout_s=60, what="restarted server ready")
        launching = events("launching")[0]
        argv = launching["argv"]
        assert isinstance(argv, list)
        assert argv[argv.index("--hicache-size") + 1] == "36"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _env_for(workdir: Path) -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["FAKE_GPU_STATE_DIR"] = str(workdir / "gpus")
    return env
