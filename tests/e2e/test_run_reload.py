"""SIGHUP (`systemctl reload`) to the real `sglang-supervisor run`: a new health interval applies
to the same server (same PIDs), a bad config is refused and the run goes on, a new environment
with [run] restart_on_reload drains and relaunches the server; and the [hooks] run on `ready`
and on a fatal end."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from tests.e2e.run_support import Supervisor, supervisor

pytestmark = pytest.mark.slow


def config_of(tmp_path: Path) -> Path:
    (path,) = tmp_path.glob("run-*.toml")
    return path


def edit_config(tmp_path: Path, old: str, new: str) -> None:
    path = config_of(tmp_path)
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def reload(sup: Supervisor, event: str, count: int = 1) -> dict[str, object]:
    sup.signal(signal.SIGHUP)
    return sup.wait_event(event, count=count)


def test_a_sighup_applies_a_new_health_interval_to_the_same_server(
    tmp_path, free_port, simulated_process_guard
):
    with supervisor(tmp_path, free_port, simulated_process_guard) as sup:
        sup.wait_event("ready")
        before = sorted(sup.tree())
        edit_config(tmp_path, 'health_interval = "0.2s"', 'health_interval = "0.5s"')
        reloaded = reload(sup, "reloaded")
        assert reloaded["applied"] == ["run.health_interval"]
        assert reloaded["restart_server"] is False
        assert sorted(sup.tree()) == before  # not restarted
        assert sup.events("stopping") == []
        assert sup.events("unhealthy") == []
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0


def test_a_sighup_with_a_bad_config_is_refused_and_the_run_goes_on(
    tmp_path, free_port, simulated_process_guard
):
    with supervisor(tmp_path, free_port, simulated_process_guard) as sup:
        sup.wait_event("ready")
        before = sorted(sup.tree())
        edit_config(tmp_path, "failure_threshold = 3", "failure_threshold = 0")
        refused = reload(sup, "reload_refused")
        assert "run.failure_threshold must be at least 1" in str(refused["reason"])
        assert sup.proc.poll() is None
        assert sorted(sup.tree()) == before
        assert sup.events("reloaded") == []
        # Still listening: the file fixed, the next SIGHUP is taken.
        edit_config(tmp_path, "failure_threshold = 0", "failure_threshold = 4")
        assert reload(sup, "reloaded")["applied"] == ["run.failure_threshold"]
        assert sorted(sup.tree()) == before
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0


def _environ(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def test_restart_on_reload_relaunches_the_server_with_its_new_environment(
    tmp_path, free_port, simulated_process_guard
):
    overrides = {"run": {"restart_on_reload": True}}
    with supervisor(tmp_path, free_port, simulated_process_guard, overrides=overrides) as sup:
        sup.wait_event("ready")
        before = set(sup.schedulers().values())
        edit_config(
            tmp_path,
            'env = { HF_TOKEN = "hf_e2e_secret_token" }',
            'env = { HF_TOKEN = "hf_e2e_secret_token", SGLANG_E2E_RELOADED = "yes" }',
        )
        reloaded = reload(sup, "reloaded")
        assert reloaded["at_next_restart"] == ["server.env"]
        assert reloaded["restart_server"] is True
        sup.wait_event("ready", count=2)
        after = set(sup.schedulers().values())
        assert after
        assert not before & after
        assert all(b"SGLANG_E2E_RELOADED=yes" in _environ(pid) for pid in after)
        assert sup.events("stopping")[0]["reason"] == "reload"
        assert sup.events("restarting") == []  # not a failure
        assert sup.state()["restart_count"] == 0
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0


def _hook(tmp_path: Path, out: Path) -> str:
    script = tmp_path / "hook.py"
    script.write_text("import sys\nopen(sys.argv[1], 'w').write(' '.join(sys.argv[2:]))\n")
    return f"{sys.executable} {script} {out} {{instance}} {{kind}}"


def test_on_ready_and_on_fatal_hooks_run_with_their_fields(
    tmp_path, free_port, simulated_process_guard
):
    ready, fatal = tmp_path / "ready.txt", tmp_path / "fatal.txt"
    hooks = {"hooks": {"on_ready": _hook(tmp_path, ready), "timeout": "20s"}}
    with supervisor(tmp_path, free_port, simulated_process_guard, overrides=hooks) as sup:
        sup.wait_event("ready")
        done = sup.wait_event("hook_done")
        assert done["hook"] == "on_ready"
        name = sup.events("settings")[0]["instance"]
        assert ready.read_text() == f"{name} ready"
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
    refused = {
        "hooks": {"on_fatal": _hook(tmp_path, fatal), "timeout": "20s"},
        "preflight": {"reserve": "100000GB"},
    }
    second = tmp_path / "second"
    second.mkdir()
    with supervisor(second, free_port, simulated_process_guard, overrides=refused) as sup:
        assert sup.wait_exit() == 1  # the pre-flight refuses: the hook ran before the exit
        assert fatal.read_text().endswith(" no_fit")
        # The hook's outcome follows the fatal event: the run's last two lines.
        assert [e["event"] for e in sup.events()][-2:] == ["fatal", "hook_done"]
        assert sup.events("hook_done")[0]["hook"] == "on_fatal"
