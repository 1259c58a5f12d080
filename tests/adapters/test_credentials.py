"""[server] user / group: looked up before the launch (unknown names refused, naming the key),
and a real child started as `nobody`, seen from /proc with its uid, gid and groups (the groups
of the GPU device files included), its HOME, and its parent-death signal armed again."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from supervisor.adapters.credentials import resolve_credentials
from supervisor.adapters.server_process import ServerProcess
from supervisor.core.events import STOP_REQUESTED
from supervisor.errors import ConfigError
from tests.waiting import wait_until

DEVICE_GID = 4242  # a group no account on the test machine belongs to
NOBODY = pwd.getpwnam("nobody")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


@pytest.fixture
def devices(tmp_path: Path) -> str:
    """Stand-ins for /dev/nvidia*: one owned by a GPU group, one by root's group."""
    gpu = tmp_path / "nvidia0"
    ctl = tmp_path / "nvidiactl"
    gpu.touch()
    ctl.touch()
    if os.geteuid() == 0:
        os.chown(gpu, 0, DEVICE_GID)
    return str(tmp_path / "nvidia*")


def test_no_user_means_the_server_runs_as_the_supervisor():
    assert resolve_credentials(None, None) is None
    assert resolve_credentials("", None) is None


@pytest.mark.parametrize(
    ("user", "group", "key"),
    [
        ("no-such-user-xyz", None, "server.user"),
        ("nobody", "no-such-group-xyz", "server.group"),
        ("999999", None, "server.user"),
        (None, "nogroup", "server.group"),
    ],
)
def test_unknown_names_and_a_group_alone_are_refused_naming_the_key(user, group, key):
    with pytest.raises(ConfigError, match=key):
        resolve_credentials(user, group)


@needs_root
def test_the_user_gets_its_own_groups_and_the_gpu_device_groups_but_never_root_s(devices):
    creds = resolve_credentials("nobody", None, devices=devices)
    assert creds is not None
    assert (creds.user, creds.uid, creds.gid) == ("nobody", NOBODY.pw_uid, NOBODY.pw_gid)
    assert creds.groups == tuple(sorted({NOBODY.pw_gid, DEVICE_GID}))
    assert 0 not in creds.groups  # nvidiactl is root's: its group is not handed out
    by_number = resolve_credentials(str(NOBODY.pw_uid), str(NOBODY.pw_gid), devices=devices)
    assert by_number is not None
    assert (by_number.uid, by_number.gid) == (NOBODY.pw_uid, NOBODY.pw_gid)


@needs_root
def test_home_user_and_logname_follow_the_user_unless_server_env_set_them():
    creds = resolve_credentials("nobody", None, kept_env={"HOME"}, devices="/nonexistent*")
    assert creds is not None
    env = creds.environment({"HOME": "/data/hf-home", "USER": "root", "PATH": "/usr/bin"})
    assert env == {
        "HOME": "/data/hf-home",
        "USER": "nobody",
        "LOGNAME": "nobody",
        "PATH": "/usr/bin",
    }


@pytest.mark.skipif(os.geteuid() == 0, reason="run as root here: the switch is allowed")
def test_switching_users_without_root_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"server\.user.*needs root"):
        resolve_credentials("nobody", None)


CHILD = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
sig = ctypes.c_int(-1)
libc.prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
print(f"pdeathsig={sig.value} home={os.environ.get('HOME')} user={os.environ.get('USER')}",
      flush=True)
time.sleep(60)
"""


def _status(pid: int) -> dict[str, list[int]]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "Gid", "Groups"):
            fields[key] = [int(v) for v in value.split()]
    return fields


@needs_root
@pytest.mark.skipif(not os.access("/usr/bin/python3", os.X_OK), reason="no /usr/bin/python3")
def test_a_child_started_as_nobody_runs_with_its_uid_gid_and_groups(devices):
    creds = resolve_credentials("nobody", None, devices=devices)
    assert creds is not None
    lines: list[str] = []
    server = ServerProcess.start(
        # /usr/bin/python3: the test's own interpreter may sit where nobody cannot read.
        ["/usr/bin/python3", "-c", CHILD],
        {**os.environ, "HOME": "/root"},
        run_id="run-credentials",
        sink=lines.append,
        redact=lambda line: line,
        oom_score_adj=500,
        credentials=creds,
    )
    try:
        wait_until(lambda: lines, timeout_s=20, what="the child's first line")
        status = _status(server.pid)
        assert status["Uid"] == [NOBODY.pw_uid] * 4  # real, effective, saved, file system
        assert status["Gid"] == [NOBODY.pw_gid] * 4
        assert sorted(status["Groups"]) == sorted({NOBODY.pw_gid, DEVICE_GID})
        # Set after the switch (the kernel clears it on a change of credentials), HOME is
        # nobody's, and the root-only writes before the switch still happened.
        assert lines[0] == f"pdeathsig=9 home={NOBODY.pw_dir} user=nobody"
        assert Path(f"/proc/{server.pid}/oom_score_adj").read_text().strip() == "500"
    finally:
        server.kill_all(STOP_REQUESTED)
        wait_until(lambda: not server.remaining(), timeout_s=10, what="child gone")
        server.pump.join(5)
        server.close()
