"""Which /dev/shm segments a dead server tree of ours left behind.

SGLang names its POSIX shared-memory segments after the process that creates them
(sglang/srt/utils/stale_shm_cleanup.py `make_shm_name`: "sgl_shm_<kind>_<pid>_<rand>", e.g. the
MessageQueue ring buffers of distributed/device_communicators/shm_broadcast.py; and
"multi_tokenizer_args_<pid>"). Only a clean exit unlinks them: the SIGKILL of a whole tree skips
every unlink path and the segments stay, pinned in RAM, until someone removes them (SGLang's own
sweep runs only in its CI).

A segment is ours to remove when its creator PID was a process of our tree, seen alive with
its start time, that process is gone now (a live PID with another start time is a reused PID:
ours is gone), and the segment is no older than that process (a segment left by an earlier
process with the same PID is not ours).

A rank that dies within a second of its start may never be seen: /proc is scanned once a tick,
and a scheduler that fails at init is gone before the next one. Its segment is removed too when
its creator PID names no process at all now and the segment was made while our tree lived (no
earlier than its first member's start). Such a segment could belong to another server's rank
that died at the same time; removing it is harmless, as SGLang opens a ring buffer by name only
while its creator lives, and a tree whose rank died is being torn down anyway.

Two families carry no PID. SGLang's load snapshot, `sglang_loads_<instance>_<hash>.shm`
(managers/load_snapshot.py `shm_path_for`: the instance id is server_args.py's
`uuid4().hex[:12]`, the hash its 4-byte blake2s), is made by the first scheduler of each
attention group as it starts and is never unlinked, not even at a clean exit. Python's
multiprocessing semaphores, `sem.mp-<8 chars>` (multiprocessing/synchronize.py `SemLock`; a lock
made in a "spawn" process is unlinked only by its finalizer or the resource tracker, both lost
when the tree is SIGKILLed), are made by libraries in SGLang's processes (tqdm's write lock, for
one). Such a file is ours to remove when it was made while our tree lived and no process holds
it now (open or mapped: the writer and every reader of the snapshot map it for their whole life,
and so does every user of a semaphore). A file whose holders cannot all be read is kept.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

SGL_SHM_PREFIX = "sgl_shm_"
MULTI_TOKENIZER_PREFIX = "multi_tokenizer_args_"
_LOADS_NAME = re.compile(r"sglang_loads_([A-Za-z0-9._-]+)_([0-9a-f]{8})\.shm")
# multiprocessing/synchronize.py: "/mp-" + 8 of tempfile's name characters; glibc adds "sem.".
_SEMAPHORE_NAME = re.compile(r"sem\.mp-[a-z0-9_]{8}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    name: str
    size_bytes: int
    made_at_s: float  # epoch seconds; no later than its creation (min of mtime and ctime)


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    """A process of our tree as it was seen alive."""

    pid: int
    start_ticks: int
    started_at_s: float  # epoch seconds; no later than its real start


def creator_pid(name: str) -> int | None:
    """The PID a segment's name carries; None for a name SGLang does not stamp."""
    if name.startswith(SGL_SHM_PREFIX):
        parts = name.split("_")  # sgl, shm, <kind...>, <pid>, <rand>: the kind may hold "_"
        text = parts[-2] if len(parts) >= 4 else ""
    elif name.startswith(MULTI_TOKENIZER_PREFIX):
        text = name[len(MULTI_TOKENIZER_PREFIX) :]
    else:
        return None
    if not text.isdigit():
        return None
    pid = int(text)
    return pid if pid > 0 else None


def is_unstamped(name: str) -> bool:
    """A file SGLang's tree makes without a PID in its name: the load snapshot (its hash
    checked, as shm_path_for makes it) or a multiprocessing semaphore."""
    if _SEMAPHORE_NAME.fullmatch(name):
        return True
    loads = _LOADS_NAME.fullmatch(name)
    if loads is None:
        return False
    instance, digest = loads.groups()
    return hashlib.blake2s(instance.encode(), digest_size=4).hexdigest() == digest


def is_candidate(name: str) -> bool:
    """A name `left_by` may judge (the adapter lists only these)."""
    return creator_pid(name) is not None or is_unstamped(name)


def left_by(
    segments: Iterable[Segment],
    members: Mapping[int, Member],
    is_alive: Callable[[int, int], bool],
    exists: Callable[[int], bool] | None = None,
    is_held: Callable[[str], bool] | None = None,
) -> tuple[Segment, ...]:
    """The segments made by a member of our tree that is dead now (is_alive(pid, ticks)), and,
    given `exists(pid)`, those made during the tree's life by a PID that is no process now; given
    `is_held(name)`, the unstamped files made during the tree's life that nobody holds."""
    tree_started_at_s = min((m.started_at_s for m in members.values()), default=None)
    out = []
    for segment in segments:
        pid = creator_pid(segment.name)
        if pid is None:
            if (
                is_unstamped(segment.name)
                and is_held is not None
                and tree_started_at_s is not None
                and segment.made_at_s >= tree_started_at_s
                and not is_held(segment.name)
            ):
                out.append(segment)
            continue
        member = members.get(pid)
        if member is None:
            if exists is None or tree_started_at_s is None or exists(pid):
                continue
            if segment.made_at_s < tree_started_at_s:
                continue
        elif is_alive(member.pid, member.start_ticks) or segment.made_at_s < member.started_at_s:
            continue
        out.append(segment)
    return tuple(out)
