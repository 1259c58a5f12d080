"""Which containment a run gets, and that failing to get a cgroup is a warning, never an error."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from supervisor.adapters.cgroup import CgroupError
from supervisor.run import containment
from supervisor.run.containment import contain, release


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
