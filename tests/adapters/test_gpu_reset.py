"""adapters.gpu_reset: the reset command template, run without a shell, with a timeout at
which it dies with all it started; `close` (a stop) kills the resets running."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from supervisor.adapters.gpu_reset import CommandGpuResetter, check_reset_command, reset_argv
from supervisor.core.gpu_release import ResetOutcome
from supervisor.testing.procs import alive
from tests.waiting import wait_until


def test_index_and_uuid_are_filled_into_each_word_without_a_shell():
    argv = reset_argv("nvidia-smi --gpu-reset -i {index} --note '{uuid}; rm -rf /'", 3, "GPU-a")
    assert argv == ["nvidia-smi", "--gpu-reset", "-i", "3", "--note", "GPU-a; rm -rf /"]


def test_indices_is_the_whole_peer_set_and_the_gpu_alone_without_one():
    assert reset_argv("nvidia-smi -r -i {indices}", 1, "GPU-1", (0, 1, 2, 3)) == [
        "nvidia-smi",
        "-r",
        "-i",
        "0,1,2,3",
    ]
    assert reset_argv("nvidia-smi -r -i {indices}", 1, "GPU-1") == ["nvidia-smi", "-r", "-i", "1"]


def test_a_peer_set_is_one_command():
    template = f"{sys.executable} -c 'import sys; print(\"reset\", sys.argv[1:])' {{indices}}"
    outcome = CommandGpuResetter(template, timeout_s=30).reset(2, "GPU-2", (2, 3))
    assert outcome.ok
    assert "reset ['2,3']" in outcome.detail


def test_a_successful_command_is_ok_and_its_output_kept():
    template = (
        f"{sys.executable} -c 'import sys; print(\"reset\", sys.argv[1:])' {{index}} {{uuid}}"
    )
    outcome = CommandGpuResetter(template, timeout_s=30).reset(2, "GPU-x")
    assert outcome.ok
    assert "reset ['2', 'GPU-x']" in outcome.detail


def test_a_failing_command_reports_its_exit_status_and_output():
    template = f"{sys.executable} -c 'import sys; print(\"in use\"); sys.exit(3)'"
    outcome = CommandGpuResetter(template, timeout_s=30).reset(0, "GPU-0")
    assert not outcome.ok
    assert "exited 3" in outcome.detail
    assert "in use" in outcome.detail


# A reset that hangs, with a plain child and a `setsid` one (their PIDs written to the file).
HUNG = 'sleep 300 & p=$!; setsid sleep 300 & echo "$p $!" > "$0"; exec sleep 300'


def test_a_hanging_command_times_out_and_its_children_setsid_included_die_with_it(tmp_path):
    pids = tmp_path / "pids"
    template = f"sh -c '{HUNG}' {pids}"
    outcome = CommandGpuResetter(template, timeout_s=2.0).reset(0, "GPU-0")
    assert not outcome.ok
    assert "timed out after 2 s" in outcome.detail
    assert not [pid for pid in map(int, pids.read_text().split()) if alive(pid)]


def test_close_kills_the_resets_running_and_refuses_new_ones(tmp_path):
    pids = tmp_path / "pids"
    resetter = CommandGpuResetter(f"sh -c '{HUNG}' {pids}", timeout_s=300)
    outcomes: list[ResetOutcome] = []
    worker = threading.Thread(target=lambda: outcomes.append(resetter.reset(0, "GPU-0")))
    worker.start()
    wait_until(lambda: pids.exists() and pids.read_text().strip(), timeout_s=30, what="children")
    resetter.close()
    worker.join(timeout=30)
    assert [o.ok for o in outcomes] == [False]
    assert "the supervisor is stopping" in outcomes[0].detail
    assert not [pid for pid in map(int, pids.read_text().split()) if alive(pid)]
    assert "not run" in resetter.reset(1, "GPU-1").detail


def test_a_missing_program_is_a_failed_outcome_not_an_exception(tmp_path: Path):
    outcome = CommandGpuResetter(str(tmp_path / "nope") + " {index}").reset(0, "GPU-0")
    assert not outcome.ok


def test_check_reset_command_names_missing_and_non_executable_programs(tmp_path: Path):
    script = tmp_path / "reset.sh"
    script.write_text("#!/bin/sh\n")
    assert "is not executable" in (check_reset_command(f"{script} {{index}}") or "")
    script.chmod(0o755)
    assert check_reset_command(f"{script} {{index}}") is None
    assert "does not exist" in (check_reset_command(f"{tmp_path}/missing") or "")
    assert "not found on PATH" in (check_reset_command("no-such-reset-tool-xyz -i {index}") or "")
    assert check_reset_command("") is None
    assert check_reset_command(f"{sys.executable} -m supervisor.testing.fake_gpu_reset") is None
