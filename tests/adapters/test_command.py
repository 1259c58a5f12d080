"""adapters.command: an operator's command runs contained and bounded. At its timeout, at its
end and at `kill` everything it started dies with it (a `setsid` child, a plain child), in its
cgroup leaf (removed after) or, in /proc mode, found by its mark; only the end of its output is
kept; a pipe held by an escaped writer never holds the caller; `close` refuses new commands."""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.adapters.cgroup import CgroupError, InstanceCgroups, discover
from supervisor.adapters.command import HELPER_ENV, CommandRunner
from supervisor.adapters.procfs import INSTANCE_ENV, SUPERVISOR_ENV
from supervisor.testing.procs import alive
from tests.cgroups import remove_instance_cgroups
from tests.waiting import wait_until

# A plain child and a `setsid` one, their PIDs written to $1, then the command hangs: shell and
# sleep start in milliseconds, far inside the timeouts below even on a loaded machine.
HUNG = 'sleep 300 & p=$!; setsid sleep 300 & echo "$p $!" > "$0"; echo started; exec sleep 300'
# The same children, but the command itself ends at once: it leaves them running.
LEAVES = 'sleep 300 & p=$!; setsid sleep 300 & echo "$p $!" > "$0"; echo done'


def children(pid_file: Path) -> list[int]:
    return [int(word) for word in pid_file.read_text().split()]


@pytest.fixture
def cgroups() -> Iterator[InstanceCgroups]:
    """The instance's groups made for real (root, cgroup v2), removed after the test."""
    if os.geteuid() != 0:
        pytest.skip("cgroups are made by root here")
    try:
        host = discover()
    except CgroupError as exc:
        pytest.skip(f"no cgroup v2 here: {exc}")
    instance = f"unit-{uuid.uuid4().hex[:8]}"
    groups = InstanceCgroups(host, instance)
    groups.create(move_self=False)
    try:
        yield groups
    finally:
        remove_instance_cgroups(instance)


def test_output_and_exit_status_are_kept_and_only_the_end_of_a_long_output():
    runner = CommandRunner()
    code = "import sys; sys.stdout.write('x' * 100000 + 'END'); sys.exit(3)"
    result = runner.run([sys.executable, "-c", code], timeout_s=30, output_bytes=10)
    assert (result.returncode, result.ok) == (3, False)
    assert result.output == "x" * 7 + "END"
    assert result.output_cut_bytes == 100000 - 7


def test_the_environment_is_marked_and_systemds_variables_are_left_out(monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("WATCHDOG_USEC", "60000000")
    runner = CommandRunner(instance="qwen")
    names = ("NOTIFY_SOCKET", "WATCHDOG_USEC")
    code = (
        f"import os; print(sorted(k for k in {names!r} if k in os.environ), "
        f"*(os.environ[k] for k in {(HELPER_ENV, INSTANCE_ENV, SUPERVISOR_ENV)!r}))"
    )
    result = runner.run([sys.executable, "-c", code], timeout_s=30, output_bytes=1000)
    assert result.ok
    assert result.output.split() == ["[]", f"{runner.mark}/1", "qwen", runner.mark]


def test_a_program_that_cannot_start_is_an_error_not_an_exception(tmp_path):
    result = CommandRunner().run([str(tmp_path / "nope")], timeout_s=30, output_bytes=100)
    assert not result.ok
    assert "No such file" in result.error


def test_in_proc_mode_a_hung_command_is_killed_at_its_timeout_with_its_setsid_child(tmp_path):
    pids = tmp_path / "pids"
    result = CommandRunner().run(["sh", "-c", HUNG, str(pids)], timeout_s=2.0, output_bytes=100)
    assert result.timed_out
    assert not result.ok
    assert result.output.strip() == "started"
    plain, own_session = children(pids)
    assert sorted(result.left_pids) == sorted([plain, own_session])
    assert not alive(plain)
    assert not alive(own_session)


def test_in_proc_mode_what_a_finished_command_left_running_is_killed(tmp_path):
    pids = tmp_path / "pids"
    result = CommandRunner().run(["sh", "-c", LEAVES, str(pids)], timeout_s=30, output_bytes=100)
    assert result.ok
    assert result.output.strip() == "done"
    assert sorted(result.left_pids) == sorted(children(pids))
    assert not any(alive(pid) for pid in children(pids))


def test_in_its_cgroup_a_hung_command_is_killed_whole_and_every_group_can_be_removed(
    tmp_path, cgroups: InstanceCgroups
):
    pids = tmp_path / "pids"
    runner = CommandRunner(helpers_dir=cgroups.helpers_dir)
    result = runner.run(["sh", "-c", HUNG, str(pids)], timeout_s=2.0, output_bytes=100)
    assert result.timed_out
    assert not any(alive(pid) for pid in children(pids))
    assert len(result.left_pids) == 2
    assert not [p for p in cgroups.helpers_dir.iterdir() if p.is_dir()]  # its leaf is gone
    assert cgroups.remove() == []
    assert not cgroups.root.exists()


def test_in_its_cgroup_a_child_that_cleared_its_mark_is_killed_too(
    tmp_path, cgroups: InstanceCgroups
):
    pids = tmp_path / "pids"
    script = 'setsid env -i sleep 300 & echo "$!" > "$0"; echo done'
    runner = CommandRunner(helpers_dir=cgroups.helpers_dir)
    result = runner.run(["sh", "-c", script, str(pids)], timeout_s=30, output_bytes=100)
    assert result.ok
    assert not any(alive(pid) for pid in children(pids))
    assert cgroups.remove() == []


def test_an_escaped_writer_holding_the_pipe_never_holds_the_caller(tmp_path):
    """/proc mode: a child that cleared its environment and left the group cannot be found,
    but the caller still gets its result once the drain time is over."""
    pids, fifo = tmp_path / "pids", tmp_path / "fifo"
    os.mkfifo(fifo)
    # The command ends only once its child runs without the mark (it says so through the fifo).
    script = (
        'setsid env -i sh -c \'echo $$ > "$0"; sleep 300; echo late\' "$1" & '
        'read pid < "$1"; echo "$pid" > "$0"; echo done'
    )
    result = CommandRunner().run(
        ["sh", "-c", script, str(pids), str(fifo)], timeout_s=30, output_bytes=100
    )
    escaped = children(pids)
    try:
        assert result.ok
        assert result.output.strip() == "done"
        assert result.left_pids == ()
    finally:
        for pid in escaped:  # a session of its own: the shell and its sleep
            os.killpg(pid, 9)


def test_kill_ends_a_running_command_and_close_refuses_new_ones(tmp_path):
    pids = tmp_path / "pids"
    runner = CommandRunner()
    command = runner.start(["sh", "-c", HUNG, str(pids)], timeout_s=300, output_bytes=100)
    results = []
    waiter = threading.Thread(target=lambda: results.append(command.wait()))
    waiter.start()
    wait_until(lambda: pids.exists() and pids.read_text().strip(), timeout_s=30, what="children")
    killed = runner.close()
    waiter.join(timeout=30)
    assert [(r.killed, r.timed_out) for r in results] == [(True, False)]
    assert not any(alive(pid) for pid in children(pids))
    assert killed == ()  # the command's own kill found them all; the sweep had none left
    refused = runner.run(["true"], timeout_s=30, output_bytes=100)
    assert "stopping" in refused.error
