"""The state directory cannot be turned against root: another user's directory, one others can
write, or a path through another user's directory or link is refused naming owner and mode; a
symbolic link planted where one of our files belongs is refused or replaced, never followed;
what we create is 0700 (directories) and 0600 (files)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.adapters.private_dir import UnsafeDirectory, private_dir
from supervisor.core.measured import Deployment, Measurement, Record
from supervisor.errors import ConfigError
from supervisor.memory.incident import Incident
from supervisor.preflight.measurements import FILE_NAME as MEASURED_FILE
from supervisor.preflight.measurements import load_records, save_record
from supervisor.run.state import LOCK_FILE, STATE_FILE, RunState, StateStore

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the state directory that a planted link points at: it must stay as is."""
    target = tmp_path / "outside"
    target.write_text("precious\n")
    target.chmod(0o644)
    return target


def assert_untouched(target: Path) -> None:
    assert target.read_text() == "precious\n"
    assert mode_of(target) == 0o644


def test_what_the_store_creates_is_0700_and_0600(tmp_path: Path):
    store = StateStore(tmp_path / "parent" / "inst")
    store.ensure_writable()
    store.claim()
    store.save(RunState(instance="inst"))
    store.release()
    assert mode_of(tmp_path / "parent") == 0o755  # as systemd makes StateDirectory='s parents
    assert mode_of(store.dir) == 0o700
    assert mode_of(store.dir / LOCK_FILE) == 0o600
    assert mode_of(store.path) == 0o600


def test_a_lock_file_left_0644_by_an_earlier_release_becomes_0600(tmp_path: Path):
    (tmp_path / LOCK_FILE).write_text("123\n")
    (tmp_path / LOCK_FILE).chmod(0o644)
    store = StateStore(tmp_path)
    store.claim()
    store.release()
    assert mode_of(tmp_path / LOCK_FILE) == 0o600


def test_a_link_planted_at_the_lock_is_refused_and_its_target_untouched(
    tmp_path: Path, outside: Path
):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / LOCK_FILE).symlink_to(outside)
    store = StateStore(state_dir)
    store.ensure_writable()
    with pytest.raises(ConfigError, match=rf"{LOCK_FILE} is a symbolic link"):
        store.claim()
    assert_untouched(outside)


def test_a_fifo_at_the_lock_is_refused(tmp_path: Path):
    os.mkfifo(tmp_path / LOCK_FILE)
    with pytest.raises(ConfigError, match="is not a regular file"):
        StateStore(tmp_path).claim()


def test_a_link_planted_at_the_state_file_is_not_read_and_the_save_replaces_it(
    tmp_path: Path, outside: Path
):
    outside.write_text('{"restart_count": 7}')  # a valid state: it must not be taken for ours
    outside.chmod(0o644)
    store = StateStore(tmp_path / "state")
    store.ensure_writable()
    store.path.symlink_to(outside)
    with capture_logs() as logs:
        assert store.load() == RunState()
    assert logs[0]["event"] == "state_unreadable"
    assert "symbolic link" in logs[0]["error"]
    store.save(RunState(restart_count=1))
    assert not store.path.is_symlink()
    assert store.load().restart_count == 1
    assert outside.read_text() == '{"restart_count": 7}'


class FixedClock:
    def wall(self) -> float:
        return 1_800_000_000.0

    def monotonic(self) -> float:
        return 0.0


def test_a_link_planted_at_the_corrupt_files_name_is_replaced_not_followed(
    tmp_path: Path, outside: Path
):
    store = StateStore(tmp_path, clock=FixedClock())  # type: ignore[arg-type]
    store.path.write_text("{not json")
    kept = tmp_path / f"{STATE_FILE}.corrupt-1800000000"
    kept.symlink_to(outside)
    assert store.load() == RunState()
    assert kept.read_text() == "{not json"
    assert not kept.is_symlink()
    assert_untouched(outside)


@as_root
def test_a_state_dir_owned_by_another_user_is_refused_naming_owner_and_mode(tmp_path: Path):
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o755)
    os.chown(state_dir, NOBODY, -1)
    with pytest.raises(ConfigError) as refusal:
        StateStore(state_dir).ensure_writable()
    message = str(refusal.value)
    assert f"state directory {state_dir} is owned by" in message
    assert f"(uid {NOBODY}), mode 0755" in message
    assert f"must be owned by uid {os.geteuid()}" in message
    assert list(state_dir.iterdir()) == []  # nothing was written there


@pytest.mark.parametrize("mode", [0o777, 0o757, 0o775, 0o1777])
def test_a_state_dir_others_can_write_is_refused_naming_its_mode(tmp_path: Path, mode: int):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    state_dir.chmod(mode)
    with pytest.raises(ConfigError, match=rf"mode {mode:04o}: writable by its group or by others"):
        StateStore(state_dir).ensure_writable()
    assert list(state_dir.iterdir()) == []


@pytest.mark.parametrize("mode", [0o700, 0o750, 0o755, 0o2750])
def test_a_state_dir_as_systemd_makes_it_is_accepted_and_left_as_it_is(tmp_path: Path, mode: int):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    state_dir.chmod(mode)  # StateDirectory= (0755), StateDirectoryMode=0750, a group's 2750
    StateStore(state_dir).ensure_writable()
    assert mode_of(state_dir) == mode


@as_root
def test_a_state_dir_under_another_users_directory_is_refused(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    os.chown(home, NOBODY, -1)
    with pytest.raises(ConfigError, match=rf"lies under {home}, owned by .*uid {NOBODY}"):
        StateStore(home / "state").ensure_writable()
    assert not (home / "state").exists()


def test_a_state_dir_under_a_directory_others_can_write_is_refused_unless_sticky(tmp_path: Path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match=r"writable by its group or by others \(and not sticky\)"):
        StateStore(shared / "state").ensure_writable()
    shared.chmod(0o1777)  # a /tmp: what we make there, nobody else can rename or remove
    StateStore(shared / "state").ensure_writable()
    assert mode_of(shared / "state") == 0o700


@as_root
def test_in_a_sticky_tmp_a_directory_another_user_made_first_is_refused(tmp_path: Path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    (tmp / "state").mkdir(mode=0o700)
    os.chown(tmp / "state", NOBODY, -1)
    with pytest.raises(ConfigError, match=rf"is owned by .*uid {NOBODY}"):
        StateStore(tmp / "state").ensure_writable()


@as_root
def test_a_link_another_user_planted_on_the_path_is_not_followed(tmp_path: Path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (tmp / "state").symlink_to(mine)
    os.lchown(tmp / "state", NOBODY, NOBODY)
    with pytest.raises(ConfigError, match=rf"passes through the symbolic link {tmp / 'state'}"):
        StateStore(tmp / "state").ensure_writable()
    assert list(mine.iterdir()) == []


def test_a_state_dir_reached_through_our_own_link_is_its_target(tmp_path: Path):
    target = tmp_path / "disk" / "state"
    target.mkdir(parents=True)
    (tmp_path / "link").symlink_to("disk/state")  # relative, as `ln -s` makes them
    store = StateStore(tmp_path / "link")
    store.ensure_writable()
    store.save(RunState(restart_count=2))
    assert (target / STATE_FILE).is_file()
    assert private_dir(tmp_path / "link") == target


def test_a_state_dir_that_is_a_regular_file_says_so(tmp_path: Path):
    blocker = tmp_path / "state"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=rf"state directory {blocker} is a regular file, not a"):
        StateStore(blocker).ensure_writable()


def test_a_dangling_link_as_the_state_dir_says_so_and_creates_nothing(tmp_path: Path):
    link = tmp_path / "state"
    link.symlink_to(tmp_path / "gone" / "state")
    with pytest.raises(ConfigError, match=r"is a symbolic link .* does not exist"):
        StateStore(link).ensure_writable()
    assert not (tmp_path / "gone").exists()


def test_a_loop_of_links_as_the_state_dir_says_so(tmp_path: Path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(ConfigError, match=r"state directory .*/a is a loop of symbolic links"):
        StateStore(tmp_path / "a").ensure_writable()


def test_a_directory_made_by_someone_between_the_look_and_the_mkdir_is_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """mkdir's EEXIST is not taken for success: the winner's directory is checked like any."""
    real_mkdir = os.mkdir

    def racing(path: str | os.PathLike[str], mode: int = 0o777) -> None:
        real_mkdir(path, 0o777)  # the other one was first, with its own mode
        os.chmod(path, 0o777)
        real_mkdir(path, mode)  # ours: EEXIST

    monkeypatch.setattr(os, "mkdir", racing)
    with pytest.raises(UnsafeDirectory, match="mode 0777"):
        private_dir(tmp_path / "state")


def test_a_link_planted_at_an_incident_file_is_replaced_not_written_through(
    tmp_path: Path, outside: Path
):
    incident = Incident.create(tmp_path, "memory_kill", "a test", {"headroom_bytes": 1})
    assert incident is not None
    assert mode_of(incident.path) == 0o600
    incident.path.unlink()
    incident.path.symlink_to(outside)
    incident.record_next("tree_gone", elapsed_s=1.0)
    assert_untouched(outside)
    assert not incident.path.is_symlink()
    assert json.loads(incident.path.read_text())["next"][0]["step"] == "tree_gone"


def test_a_link_planted_at_the_measurements_is_not_read_and_the_save_replaces_it(
    tmp_path: Path, outside: Path
):
    (tmp_path / MEASURED_FILE).symlink_to(outside)
    records, problem = load_records(tmp_path)
    assert records == ()
    assert "symbolic link" in (problem or "")
    deployment = Deployment(
        model="m", tp_size=1, pp_size=1, gpu_name="", gpu_total_bytes=None, sglang_version="x"
    )
    save_record(
        tmp_path, Record(deployment=deployment, settings={}, measurement=Measurement(), at=1.0)
    )
    assert_untouched(outside)
    assert mode_of(tmp_path / MEASURED_FILE) == 0o600
    assert len(load_records(tmp_path)[0]) == 1
