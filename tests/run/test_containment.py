"""Which containment a run gets, and that failing to get a cgroup is a warning, never an error."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from supervisor.adapters.cgroup import CgroupError
from supervisor.run import containment
from supervisor.run.containment import contain, release
from tests.cgroups import remove_instance_cgroups


def test_off_means_proc_and_says_so():
    with capture_logs() as logs:
        got = contain("unit", "off")
    assert (got.mode, got.server, got.reason) == ("/proc", None, "cgroup = off")
    assert logs[0]["mode"] == "/proc"
    release(got)  # nothing to release


def test_no_cgroup_to_be_had_falls_back_to_proc_with_the_reason(monkeypatch: pytest.MonkeyPatch):
    def refuse() -> None:
        raise CgroupError("no cgroup v2 hierarchy mounted (a cgroup v1 host)")

    monkeypatch.setattr(containment, "discover", refuse)
    with capture_logs() as logs:
        got = contain("unit", "auto")
    assert got.mode == "/proc"
    assert got.reason is not None
    assert "cgroup v1 host" in got.reason
    assert logs[0]["log_level"] == "warning"


def test_a_group_that_cannot_be_made_falls_back_to_proc(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """mkdir refused (here ENOTDIR; EPERM for a user without delegation): /proc mode."""
    from supervisor.adapters.cgroup import CgroupHost

    not_a_dir = tmp_path / "cg"
    not_a_dir.write_text("")
    monkeypatch.setattr(containment, "discover", lambda: CgroupHost(not_a_dir, None))
    with capture_logs() as logs:
        got = contain("unit", "auto")
    assert got.mode == "/proc"
    assert got.reason is not None
    assert "creating" in got.reason
    assert logs[-1]["mode"] == "/proc"


def real_cgroups_or_skip() -> None:
    import os

    from supervisor.adapters.cgroup import discover

    if os.geteuid() != 0:
        pytest.skip("cgroups are made by root here")
    try:
        discover()
    except CgroupError as exc:
        pytest.skip(f"no cgroup v2 here: {exc}")


def test_a_leftover_is_killed_at_the_next_start_and_everything_removed_at_the_end():
    import subprocess
    import sys
    import uuid

    real_cgroups_or_skip()
    instance = f"unit-{uuid.uuid4().hex[:8]}"
    first = contain(instance, "auto", move_self=False)
    assert first.server is not None
    files = first.server.join_files

    def join() -> None:
        for path in files:
            with open(path, "w") as fh:
                fh.write("0")

    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=join)
    try:
        # A crashed supervisor's group, found by the next start of the same instance.
        with capture_logs() as logs:
            again = contain(instance, "auto", move_self=False)
        assert again.leftovers == [left.pid]
        assert left.wait(timeout=10) == -9
        assert any(e["event"] == "cgroup_leftovers_killed" for e in logs)
        release(again)
        assert again.groups is not None
        assert not again.groups.root.exists()
    finally:
        if left.poll() is None:
            left.kill()
            left.wait()
        remove_instance_cgroups(instance)  # a failed assertion above must not leave them


def test_a_helper_left_running_is_killed_at_the_next_start_and_at_the_end():
    """A hook or reset command a crashed supervisor left in its helpers' leaf."""
    import subprocess
    import sys
    import uuid

    real_cgroups_or_skip()
    instance = f"unit-{uuid.uuid4().hex[:8]}"
    first = contain(instance, "auto", move_self=False)
    assert first.helpers_dir is not None
    leaf = first.helpers_dir / "1"
    started: list[subprocess.Popen[bytes]] = []

    def in_leaf() -> subprocess.Popen[bytes]:
        leaf.mkdir()

        def join() -> None:
            with open(leaf / "cgroup.procs", "w") as fh:
                fh.write("0")

        started.append(
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=join)
        )
        return started[-1]

    try:
        left = in_leaf()
        again = contain(instance, "auto", move_self=False)
        assert again.leftovers == [left.pid]
        assert left.wait(timeout=10) == -9
        assert not leaf.exists()
        still = in_leaf()  # running when the supervisor ends
        release(again)
        assert still.wait(timeout=10) == -9
        assert again.groups is not None
        assert not again.groups.root.exists()
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        remove_instance_cgroups(instance)
