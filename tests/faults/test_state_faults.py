"""Faults of the state directory and its disk: a damaged or odd state file never stops a start,
a full disk never ends a run that serves, a directory that cannot be used is exit 2."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from supervisor.run.state import STATE_FILE
from tests.e2e.run_support import Supervisor
from tests.faults.support import assert_invariants, faulted, recovered, refused

pytestmark = pytest.mark.slow


def non_utf8(state_dir: Path) -> None:
    (state_dir / STATE_FILE).write_bytes(b'{"run_id": "\xff\xfe", "restart_count": 1}')


def fifo(state_dir: Path) -> None:
    os.mkfifo(state_dir / STATE_FILE)


def directory(state_dir: Path) -> None:
    (state_dir / STATE_FILE).mkdir()


def truncated(state_dir: Path) -> None:
    (state_dir / STATE_FILE).write_text('{"run_id": "abc", "restart_co')


DAMAGE: dict[str, Callable[[Path], None]] = {
    "state.json not UTF-8": non_utf8,
    "state.json a FIFO": fifo,
    "state.json a directory": directory,
    "state.json cut short": truncated,
}


def kill_rank(sup: Supervisor) -> None:
    sup.wait_event("ready")
    os.kill(sup.schedulers()["sglang::scheduler_TP1"], signal.SIGKILL)


@pytest.mark.parametrize("name", list(DAMAGE))
def test_a_damaged_state_file_never_stops_a_start_nor_a_restart(
    name: str, tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    DAMAGE[name](state_dir)
    with faulted(tmp_path, free_port, simulated_process_guard, state_dir=state_dir) as sup:
        kill_rank(sup)
        recovered(sup)
    assert_invariants(tmp_path, sup, shm_record)


def a_regular_file(state_dir: Path) -> None:
    state_dir.write_text("not a directory")


def a_dangling_link(state_dir: Path) -> None:
    state_dir.symlink_to(state_dir.parent / "gone" / "state")


def a_loop_of_links(state_dir: Path) -> None:
    state_dir.symlink_to(state_dir.parent / "loop")
    (state_dir.parent / "loop").symlink_to(state_dir)


def writable_by_all(state_dir: Path) -> None:
    state_dir.mkdir()
    state_dir.chmod(0o777)


def writable_by_others(state_dir: Path) -> None:
    state_dir.mkdir()
    state_dir.chmod(0o757)


def another_users(state_dir: Path) -> None:
    state_dir.mkdir(mode=0o755)
    os.chown(state_dir, 65534, -1)


UNUSABLE: dict[str, tuple[Callable[[Path], None], str]] = {
    "a regular file": (a_regular_file, "is a regular file, not a directory"),
    "a dangling link": (a_dangling_link, "to a directory that does not exist"),
    "a loop of links": (a_loop_of_links, "is a loop of symbolic links"),
    "mode 0777": (writable_by_all, "mode 0777: writable by its group or by others"),
    "mode 0757": (writable_by_others, "mode 0757: writable by its group or by others"),
    "owned by uid 65534": (another_users, "(uid 65534), mode 0755: it must be owned by uid"),
}


@pytest.mark.parametrize("name", list(UNUSABLE))
def test_a_state_directory_that_cannot_be_trusted_is_exit_2_saying_what_it_is(
    name: str, tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    make, message = UNUSABLE[name]
    if name == "owned by uid 65534" and os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    state_dir = tmp_path / "state"
    make(state_dir)
    with faulted(tmp_path, free_port, simulated_process_guard, state_dir=state_dir) as sup:
        fatal = refused(sup, 2, message)
    assert f"state directory {state_dir} " in fatal["reason"]
    assert not sup.events("launching"), "nothing starts"
    assert_invariants(tmp_path, sup, shm_record)


def test_a_link_planted_at_the_lock_is_exit_2_and_its_target_untouched(
    tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    target = tmp_path / "precious"
    target.write_text("root must not truncate this\n")
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "supervisor.lock").symlink_to(target)
    with faulted(tmp_path, free_port, simulated_process_guard, state_dir=state_dir) as sup:
        refused(sup, 2, "supervisor.lock is a symbolic link")
    assert target.read_text() == "root must not truncate this\n"
    assert_invariants(tmp_path, sup, shm_record)


def test_a_second_supervisor_of_the_same_state_is_exit_2_naming_the_first(
    tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    state_dir = tmp_path / "state"
    elsewhere = tmp_path / "second"
    elsewhere.mkdir()
    with faulted(tmp_path, free_port, simulated_process_guard, state_dir=state_dir) as first:
        first.wait_event("ready")
        # Its own marker, matching no process: its teardown must not kill the first one's.
        with faulted(elsewhere, free_port, "no-such-marker", state_dir=state_dir) as second:
            refused(second, 2, f"pid {first.proc.pid}")
        assert first.proc.poll() is None, "the first one serves on"
        recovered(first, ready_count=1)
    assert_invariants(tmp_path, first, shm_record)


def _fill(fd: int) -> int:
    """Write until the disk is full; the errno that stopped it (0: never full)."""
    for _ in range(1024):  # bounded: 256 KiB in 4 KiB blocks, with room to spare
        try:
            os.write(fd, b"\0" * 4096)
        except OSError as exc:
            return exc.errno or 0
    return 0


@contextlib.contextmanager
def full_tmpfs(path: Path) -> Iterator[None]:
    """A 256 KiB tmpfs at `path`, filled up: every write then fails with ENOSPC. Mounted 0700:
    a tmpfs's root is 1777 by default, which no state directory may be."""
    path.mkdir()
    options = "size=256k,mode=0700"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    try:
        fd = os.open(path / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            assert _fill(fd) == errno.ENOSPC
        finally:
            os.close(fd)
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_full_disk_under_the_state_directory_never_ends_a_serving_run(
    tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    state_dir = tmp_path / "state"
    with (
        full_tmpfs(state_dir),
        faulted(tmp_path, free_port, simulated_process_guard, state_dir=state_dir) as sup,
    ):
        kill_rank(sup)  # the restart decision writes the state: ENOSPC there too
        recovered(sup)
        assert sup.events("state_not_saved")
    assert_invariants(tmp_path, sup, shm_record)
