"""run.launch: the server's command and environment, the pre-flight gate with --auto-size and
--force, and a command that cannot start."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.adapters.procfs import INSTANCE_ENV, RUN_ENV, SUPERVISOR_ENV
from supervisor.core.ledger import Reservation
from supervisor.core.sglang_args import parse_launch_args
from supervisor.errors import ConfigError, PreflightFailed
from supervisor.run.launch import (
    check_server_command,
    describe_settings,
    preflight_gate,
    resolve_gpu_backend,
    server_env,
    start_server,
)
from tests.fakes import FakeLauncher, FakeLedger
from tests.run.runner_support import ARGS, settings

BIG = ("--model-path", "m", "--tp", "2", "--enable-hicache", "--hicache-size", "300")


def test_a_command_that_cannot_run_is_bad_input_naming_the_path(tmp_path: Path):
    with pytest.raises(ConfigError, match="empty"):
        check_server_command(())
    with pytest.raises(ConfigError, match="not found on PATH"):
        check_server_command(("no-such-program-xyz",))
    with pytest.raises(ConfigError, match="no such file"):
        check_server_command((str(tmp_path / "missing"),))
    plain = tmp_path / "plain"
    plain.write_text("")
    with pytest.raises(ConfigError, match="not an executable file"):
        check_server_command((str(plain),))
    check_server_command(("sh",))


def test_the_server_environment_carries_the_markers_and_never_systemd_s_socket(tmp_path: Path):
    run_settings = settings(tmp_path)
    config = dataclasses.replace(
        run_settings.config,
        server=dataclasses.replace(run_settings.config.server, env={"HF_TOKEN": "hf_x"}),
    )
    run_settings = dataclasses.replace(run_settings, config=config)
    base = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "1", "PATH": "/bin"}
    env = server_env(run_settings, "run-9", supervisor_mark="1:2", base=base)
    assert "NOTIFY_SOCKET" not in env
    assert "WATCHDOG_USEC" not in env
    assert (env[INSTANCE_ENV], env[RUN_ENV], env[SUPERVISOR_ENV]) == ("unit", "run-9", "1:2")
    assert env["SGLANG_PYSPY_DUMP_BEFORE_CRASH"] == "0"
    assert env["HF_TOKEN"] == "hf_x"
    described = describe_settings(run_settings, parse_launch_args(ARGS))
    assert described["server_env"] == {"HF_TOKEN": "***"}
    assert described["gpus"] == [0, 1]


def test_auto_backend_is_resolved_without_loading_nvml():
    assert resolve_gpu_backend("sim") == "sim"
    assert resolve_gpu_backend("auto") in ("nvml", "none")


def test_the_gate_passes_a_fit_and_refuses_a_no_fit_with_the_table(tmp_path: Path):
    argv, report = preflight_gate(settings(tmp_path), ARGS, None)
    assert argv == ARGS
    assert report is not None
    assert report.fits
    with pytest.raises(PreflightFailed, match="--auto-size to launch with the largest") as err:
        preflight_gate(settings(tmp_path), BIG, None)
    assert "NO FIT" in str(err.value)


def test_auto_size_launches_the_largest_safe_size_and_force_launches_anyway(tmp_path: Path):
    with capture_logs() as logs:
        argv, report = preflight_gate(settings(tmp_path, auto_size=True), BIG, None)
    assert report is not None
    assert argv[-2:] == ("--hicache-size", str(report.max_hicache_size_gb))
    assert report.fits
    assert any(e["event"] == "auto_sized" for e in logs)
    with capture_logs() as logs:
        argv, report = preflight_gate(settings(tmp_path, force=True), BIG, None)
    assert argv == BIG
    assert report is not None
    assert not report.fits
    assert logs[-1]["event"] == "preflight_failed_forced"


def _unreadable_model(tmp_path: Path, *, force: bool):
    run_settings = settings(tmp_path, force=force)
    server = dataclasses.replace(run_settings.config.server, model_config=str(tmp_path / "nope"))
    return dataclasses.replace(
        run_settings, config=dataclasses.replace(run_settings.config, server=server)
    )


def test_force_also_launches_what_the_preflight_cannot_read(tmp_path: Path):
    with capture_logs() as logs:
        argv, report = preflight_gate(_unreadable_model(tmp_path, force=True), ARGS, None)
    assert (argv, report) == (ARGS, None)
    assert logs[0]["event"] == "preflight_skipped"
    with pytest.raises(ConfigError, match="does not exist"):
        preflight_gate(_unreadable_model(tmp_path, force=False), ARGS, None)


def test_a_command_that_fails_to_start_is_bad_input(tmp_path: Path):
    class Refusing(FakeLauncher):
        def start(self, *args, **kwargs):
            raise PermissionError(13, "Permission denied")

    with pytest.raises(ConfigError, match="cannot be executed: Permission denied"):
        start_server(Refusing(), settings(tmp_path), "r", ARGS, redact=str, supervisor_mark="1:1")


def test_auto_size_never_raises_the_size_nor_hides_a_failure_it_cannot_fix(tmp_path: Path):
    """64 heads and 8 KV heads cannot be split over TP 3: a smaller cache changes nothing, so
    the refusal names that check, and the launch keeps its 1 GB per rank."""
    argv = ("--model-path", "m", "--tp", "3", "--enable-hicache", "--hicache-size", "1")
    with capture_logs() as logs, pytest.raises(PreflightFailed) as err:
        preflight_gate(settings(tmp_path, auto_size=True), argv, None)
    message = str(err.value)
    assert "attention_heads failed (a smaller --hicache-size cannot fix attention_heads" in message
    assert "--auto-size to launch" not in message
    assert not any(e["event"] == "auto_sized" for e in logs)


def test_other_instances_starting_take_their_plan_off_the_budget_and_ours_is_recorded(
    tmp_path: Path,
):
    alone = FakeLedger()
    _argv, report = preflight_gate(settings(tmp_path), ARGS, None, alone)
    assert report is not None
    assert report.fits
    assert report.host_required_bytes
    assert alone.calls == [("set", report.host_required_bytes, 0)]
    starting = Reservation(
        instance="other", pid=1, start_ticks=1, planned_bytes=500 * 10**9, pinned_bytes=60 * 10**9
    )
    crowded = FakeLedger((starting,))
    with pytest.raises(PreflightFailed) as err:
        preflight_gate(settings(tmp_path), ARGS, None, crowded)
    assert "other instances starting (ledger)" in str(err.value)
    assert "440.0 GB planned and not yet pinned by other instances" in str(err.value)
    assert crowded.calls == [], "a refused launch reserves nothing"
