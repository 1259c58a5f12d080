"""The server tree's user and groups ([server] user / group): looked up once before the first
launch, switched to in the forked child before exec (server_process._child_setup).

The supervisor itself keeps root: a GPU reset, the cgroups and the kill of the whole tree need
it; SGLang, which runs the model's own code with --trust-remote-code, does not.
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import grp
import os
import pwd
import signal
from collections.abc import Collection, Mapping

from supervisor.errors import ConfigError

# The devices CUDA opens (nvidiactl, nvidia-uvm, nvidia0, ...). Where they are not open to all,
# their group (video, or the distribution's own) is what the user needs.
NVIDIA_DEVICES = "/dev/nvidia*"
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Credentials:
    """Who the server runs as: uid, primary gid, supplementary groups, and its home."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    # Variables the config's [server] env sets itself: never replaced by the user's.
    kept_env: frozenset[str] = frozenset()

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """The server's environment as that user's: HOME, USER and LOGNAME (caches such as
        Hugging Face's, Triton's and FlashInfer's live under HOME) unless [server] env set them."""
        own = {"HOME": self.home, "USER": self.user, "LOGNAME": self.user}
        return {**env, **{k: v for k, v in own.items() if k not in self.kept_env}}

    def apply(self, parent_pid: int) -> None:
        """In the forked child before exec: groups, then the gid, the uid last (after it none
        of the others may change). The kernel clears PDEATHSIG on a change of credentials
        (prctl(2)), so it is asked for again, and the parent checked again."""
        os.setgroups(list(self.groups))
        os.setresgid(self.gid, self.gid, self.gid)
        os.setresuid(self.uid, self.uid, self.uid)
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the supervisor died meanwhile: nobody to watch
            os._exit(1)


def resolve_credentials(
    user: str | None,
    group: str | None,
    *,
    kept_env: Collection[str] = (),
    devices: str = NVIDIA_DEVICES,
) -> Credentials | None:
    """The credentials [server] user / group name (None: the server runs as the supervisor).

    Raises:
        ConfigError: an unknown user or group (the key named), a group without a user, or a
            switch that needs root while the supervisor is not root.
    """
    if not user:
        if group:
            raise ConfigError(
                f"config key server.group ({group!r}) needs server.user: the group of a server "
                "that runs as root would change nothing that matters"
            )
        return None
    account = _user(user)
    gid = _group(group) if group else account.pw_gid
    own = os.getgrouplist(account.pw_name, gid)
    groups = tuple(sorted({*own, *_device_groups(devices)}))
    if os.geteuid() != 0 and (account.pw_uid, gid) != (os.geteuid(), os.getegid()):
        raise ConfigError(
            f"config key server.user: running the server as {account.pw_name!r} needs root "
            f"(this supervisor runs as uid {os.geteuid()})"
        )
    return Credentials(
        user=account.pw_name,
        uid=account.pw_uid,
        gid=gid,
        groups=groups,
        home=account.pw_dir,
        kept_env=frozenset(kept_env),
    )


def _user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        raise ConfigError(f"config key server.user: no such user {name!r} on this host") from None


def _group(name: str) -> int:
    try:
        return (grp.getgrgid(int(name)) if name.isdigit() else grp.getgrnam(name)).gr_gid
    except KeyError:
        raise ConfigError(f"config key server.group: no such group {name!r} on this host") from None


def _device_groups(pattern: str) -> set[int]:
    """The groups owning the GPU device files; never root's group, which would open far more
    than the devices."""
    found = set()
    for path in glob.glob(pattern):
        try:
            gid = os.stat(path).st_gid
        except OSError:
            continue  # vanished (a driver reload): nothing to add
        if gid != 0:
            found.add(gid)
    return found
