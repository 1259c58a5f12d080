"""Whether a directory may hold root's files: the rule behind the state directory's check.

Root follows the paths it is given. A directory another user can write lets that user plant a
symbolic link where root is about to create or truncate a file (`supervisor.lock` pointing at
/etc/shadow), or swap the whole directory for one of theirs. So the path is walked from `/`,
each symbolic link on it followed by hand, and:

- every directory on the way is owned by root or by us, and is not writable by its group or
  by others unless it is sticky (/tmp: there nobody may rename or remove what another made);
- every symbolic link on the way is owned by root or by us: in a sticky /tmp anyone may plant
  one before us (the kernel's fs.protected_symlinks refuses to follow it too, where it is on);
- the state directory itself is owned by us (the effective uid) and not writable by group or
  others. systemd's StateDirectory= makes it 0755, or what StateDirectoryMode= says (the unit
  sets 0750): both pass; a 0777 or 0757 one, or one owned by another user, does not.

Nothing but us and root can then add, rename or remove anything under the state directory,
which is what makes the names opened there trustworthy; O_NOFOLLOW on each of those opens is
the second line (supervisor/atomic_file.py).

Pure: the adapter (supervisor/adapters/private_dir.py) reads each component with lstat and asks.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# The permission bits that matter here (stat's S_IWGRP, S_IWOTH, S_ISVTX).
GROUP_WRITE = 0o020
OTHER_WRITE = 0o002
STICKY = 0o1000
ROOT_UID = 0
# The kernel's own limit on links followed in one path (ELOOP beyond it).
MAX_LINKS = 40
# What the supervisor creates: the state directory 0700 (nobody else reads root's state), the
# directories above it 0755 (as systemd's StateDirectory= makes the parents).
STATE_DIR_MODE = 0o700
PARENT_DIR_MODE = 0o755


class Role(str, Enum):
    """Where on the path a component stands."""

    ABOVE = "above"  # a directory on the way to the state directory
    LINK = "link"  # a symbolic link on the way (or the state directory's own name)
    STATE_DIR = "state_dir"  # the state directory itself, links resolved


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One component of the path as lstat saw it."""

    path: str
    uid: int
    owner: str  # the user name, or the uid when it has none
    mode: int  # the permission bits with the sticky bit (st_mode & 0o7777)


def owner_and_mode(entry: Entry, *, mode: bool = True) -> str:
    """'owned by nobody (uid 65534), mode 0757' (a link's mode is always 0777: left out)."""
    uid = f"uid {entry.uid}"
    who = uid if entry.owner == str(entry.uid) else f"{entry.owner} ({uid})"
    return f"owned by {who}, mode {entry.mode:04o}" if mode else f"owned by {who}"


def problem(entry: Entry, role: Role, euid: int) -> str | None:
    """Why `entry` makes the state directory unsafe for us (`euid`), or None."""
    trusted = entry.uid in (ROOT_UID, euid)
    writable_by_others = bool(entry.mode & (GROUP_WRITE | OTHER_WRITE))
    if role is Role.STATE_DIR:
        if entry.uid != euid:
            return (
                f"is {owner_and_mode(entry)}: it must be owned by uid {euid}, the user the "
                "supervisor runs as (chown it, or choose another)"
            )
        if writable_by_others:
            return (
                f"is {owner_and_mode(entry)}: writable by its group or by others, who could put "
                "a link where the supervisor writes; chmod 0700 or 0750 it"
            )
        return None
    if role is Role.LINK:
        if trusted:
            return None
        return (
            f"passes through the symbolic link {entry.path}, {owner_and_mode(entry, mode=False)}: "
            f"only a link of root's or of uid {euid} is followed"
        )
    if not trusted:
        return (
            f"lies under {entry.path}, {owner_and_mode(entry)}: its owner could swap the "
            f"directories below it; only root or uid {euid} may own the directories above"
        )
    if writable_by_others and not entry.mode & STICKY:
        return (
            f"lies under {entry.path}, {owner_and_mode(entry)}: writable by its group or by "
            "others (and not sticky), who could swap the directories below it"
        )
    return None
