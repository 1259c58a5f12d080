"""The server tree in a cgroup of its own: membership, memory, kill and "gone" from the kernel.

Layout, under the cgroup this process started in (P, from /proc/self/cgroup), per instance:

    P/sglang-supervisor.<instance>/supervisor   this process (v2: no processes in inner nodes)
    P/sglang-supervisor.<instance>/server       the server and every descendant, escapees too
    P/sglang-supervisor.<instance>/helpers/<n>  one operator's command (a hook, a GPU reset)
                                                and all it starts (adapters/command.py)

cgroup v2 gives `cgroup.procs` (membership), `cgroup.kill` (one atomic SIGKILL of the group,
Linux >= 5.14; else freeze, kill, thaw), `cgroup.events` (`populated 0` when the tree is gone,
with poll()) and `memory.pressure`. Memory comes from v2 `memory.stat` (anon + shmem) when the
memory controller can be enabled there (a pure-v2 host, a delegated subtree), else from a v1
`memory` group beside the v2 one (a hybrid host), else from /proc. A host with no v2 hierarchy,
or one where the groups cannot be made, stays in /proc mode (CgroupError says why).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from supervisor.adapters.cgroup_dirs import existing_dirs, pids_in, rmdir_group, subdirs

PREFIX = "sglang-supervisor."


class CgroupError(Exception):
    """No usable cgroup for the server tree; the message says why (the caller uses /proc)."""


@dataclass(frozen=True, slots=True)
class CgroupHost:
    """Where this process sits in the cgroup hierarchies."""

    v2_dir: Path  # this process's own v2 cgroup directory (P)
    memory_v1_dir: Path | None  # its v1 memory cgroup directory, on a hybrid host


def _mounts(mountinfo: str) -> list[tuple[str, str, str, str]]:
    """(mount root, mount point, fstype, super options) of each mount."""
    out = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if sep and len(fields) >= 5 and len(tail) >= 3:
            out.append((fields[3], fields[4].replace("\\040", " "), tail[0], tail[2]))
    return out


def _join(mount_point: str, mount_root: str, path: str) -> Path | None:
    if mount_root != "/" and path != mount_root and not path.startswith(mount_root + "/"):
        return None  # our cgroup is not visible under this mount
    relative = path[len(mount_root) :] if mount_root != "/" else path
    return Path(mount_point) / relative.lstrip("/")


def discover(proc_self: Path = Path("/proc/self")) -> CgroupHost:
    """This process's v2 cgroup (and v1 memory cgroup on a hybrid host).

    Raises:
        CgroupError: no cgroup v2 hierarchy is mounted, or this process is not visible in it.
    """
    try:
        mounts = _mounts((proc_self / "mountinfo").read_text(encoding="utf-8"))
        own = (proc_self / "cgroup").read_text(encoding="utf-8")
    except OSError as exc:
        raise CgroupError(f"cannot read /proc/self/cgroup or mountinfo: {exc}") from None
    paths: dict[str, str] = {}
    for line in own.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        key = "v2" if hierarchy == "0" and not controllers else controllers
        for name in key.split(","):
            paths[name] = path
    v2 = next(((r, p) for r, p, fs, _ in mounts if fs == "cgroup2"), None)
    if v2 is None or "v2" not in paths:
        raise CgroupError("no cgroup v2 hierarchy mounted (a cgroup v1 host)")
    v2_dir = _join(v2[1], v2[0], paths["v2"])
    if v2_dir is None or not v2_dir.is_dir():
        raise CgroupError(f"this process's cgroup {paths['v2']} is not under {v2[1]}")
    memory_dir = None
    memory = next(
        ((r, p) for r, p, fs, opts in mounts if fs == "cgroup" and "memory" in opts.split(",")),
        None,
    )
    if memory is not None and "memory" in paths:
        memory_dir = _join(memory[1], memory[0], paths["memory"])
    return CgroupHost(v2_dir=v2_dir, memory_v1_dir=memory_dir)


def _write(path: Path, text: str) -> None:
    """Write a cgroup control file.

    Raises:
        CgroupError: the kernel refused (EBUSY, EPERM, EACCES, ENOENT, ...), naming the file.
    """
    try:
        with open(path, "w", encoding="ascii") as fh:
            fh.write(text)
    except OSError as exc:
        raise CgroupError(f"writing {text.strip()!r} to {path}: {exc.strerror or exc}") from None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii")
    except OSError as exc:
        raise CgroupError(f"reading {path}: {exc.strerror or exc}") from None


def _keyed(path: Path) -> dict[str, str] | None:
    """A cgroup file of "key value" lines; None when unreadable."""
    try:
        text = path.read_text(encoding="ascii")
    except OSError:
        return None
    return dict(line.split(" ", 1) for line in text.splitlines() if " " in line)


def _flag(events: str, key: str) -> bool:
    for line in events.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return value.strip() == "1"
    return False


class Cgroup:
    """One cgroup v2 directory: who is in it, one kill of all of it, "empty" from the kernel."""

    def __init__(self, group: Path) -> None:
        self.group = group

    def pids(self) -> list[int]:
        return pids_in(self.group)

    def populated(self) -> bool:
        """Whether a live process is in it or below it (zombies do not count)."""
        try:
            return _flag(_read(self.group / "cgroup.events"), "populated")
        except CgroupError:
            return False  # removed under us: nothing can be left in it

    def kill(self) -> None:
        """SIGKILL every process of the group and of the groups below it, at once (escapees
        included: they are members).

        Raises:
            CgroupError: the group is gone or the kernel refused.
        """
        kill_file = self.group / "cgroup.kill"
        if kill_file.exists():
            _write(kill_file, "1")
            return
        # Before Linux 5.14: freeze so nothing forks between the read and the kills.
        _write(self.group / "cgroup.freeze", "1")
        try:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            _write(self.group / "cgroup.freeze", "0")

    def wait_empty(self, timeout_s: float) -> bool:
        """Block until `populated 0` (True) or the timeout (False): poll() on cgroup.events,
        which the kernel signals on every change, so nothing is polled on a timer."""
        deadline = time.monotonic() + timeout_s
        try:
            fd = os.open(self.group / "cgroup.events", os.O_RDONLY)
        except OSError:
            return True  # gone with its group
        try:
            poller = select.poll()
            poller.register(fd, select.POLLPRI | select.POLLERR)
            while True:
                events = os.pread(fd, 4096, 0).decode("ascii", "replace")
                if not _flag(events, "populated"):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                poller.poll(left * 1000)
        finally:
            os.close(fd)

    def remove(self) -> None:
        """rmdir the group; only an empty group can go, so call after its processes are gone.

        Raises:
            CgroupError: it is still populated, or the kernel refused.
        """
        try:
            rmdir_group(self.group)
        except OSError as exc:
            raise CgroupError(f"removing {self.group}: {exc.strerror}") from None


class ServerCgroup(Cgroup):
    """The `server` group of one instance (and its v1 memory twin on a hybrid host)."""

    def __init__(self, group: Path, memory_v1: Path | None, v2_memory: bool) -> None:
        super().__init__(group)
        self.memory_v1 = memory_v1
        self.v2_memory = v2_memory  # memory.stat of the v2 group itself is usable

    @property
    def mode(self) -> str:
        if self.v2_memory:
            return "cgroup v2"
        if self.memory_v1 is not None:
            return "cgroup v2 + v1 memory"
        return "cgroup v2, memory from /proc"

    @property
    def join_files(self) -> tuple[str, ...]:
        """The cgroup.procs files a new process writes "0" to, to enter the group(s)."""
        files = [str(self.group / "cgroup.procs")]
        if self.memory_v1 is not None:
            files.append(str(self.memory_v1 / "cgroup.procs"))
        return tuple(files)

    def charged_bytes(self) -> int | None:
        """anon + shmem of the whole tree (page cache of mapped weights is never counted);
        None when only /proc can tell."""
        if self.v2_memory:
            stat, keys = self.group / "memory.stat", ("anon", "shmem")
        elif self.memory_v1 is not None:
            stat, keys = self.memory_v1 / "memory.stat", ("total_rss", "total_shmem")
        else:
            return None
        values = _keyed(stat)
        return None if values is None else sum(int(values.get(k, "0")) for k in keys)

    def oom_kill_count(self) -> int | None:
        """The tree's processes the kernel OOM-killed (any OOM, the host's or a limit's) since
        the group was made: `oom_kill` of v2 memory.events or v1 memory.oom_control (Linux
        >= 4.13); None without a memory controller here."""
        if self.v2_memory:
            events = self.group / "memory.events"
        elif self.memory_v1 is not None:
            events = self.memory_v1 / "memory.oom_control"
        else:
            return None
        value = (_keyed(events) or {}).get("oom_kill", "").strip()
        return int(value) if value.isdigit() else None

    def pressure_file(self) -> Path:
        return self.group / "memory.pressure"

    def empty_leftovers(self, timeout_s: float = 10.0) -> list[int]:
        """Kill what an earlier supervisor of this instance left in the group (call while
        holding the instance's lock). Returns the PIDs found."""
        left = self.pids()
        if left:
            self.kill()
            self.wait_empty(timeout_s)
        return left

    def remove(self) -> None:
        """rmdir the group(s); only empty groups can go, so call after the tree is gone."""
        super().remove()
        if self.memory_v1 is not None:
            Cgroup(self.memory_v1).remove()


class InstanceCgroups:
    """Creates, enters and removes one instance's groups."""

    def __init__(self, host: CgroupHost, instance: str) -> None:
        self.host = host
        self.root = host.v2_dir / f"{PREFIX}{instance}"
        self.supervisor = self.root / "supervisor"
        self.server_dir = self.root / "server"
        # The operator's commands (hooks, GPU resets), one leaf each (adapters/command.py).
        self.helpers_dir = self.root / "helpers"
        self.memory_v1 = (
            host.memory_v1_dir / f"{PREFIX}{instance}.server" if host.memory_v1_dir else None
        )
        self._moved = False

    def create(self, *, move_self: bool, memory_max_bytes: int | None = None) -> ServerCgroup:
        """Make the groups (an existing one is reused), optionally move this process into its
        leaf, and enable what this host allows.

        Raises:
            CgroupError: a group could not be made or entered (the caller falls back to /proc
                and calls `remove`).
        """
        for path in (self.root, self.supervisor, self.server_dir, self.helpers_dir):
            try:
                path.mkdir(exist_ok=True)
            except OSError as exc:
                raise CgroupError(f"creating {path}: {exc.strerror or exc}") from None
        if move_self:
            _write(self.supervisor / "cgroup.procs", str(os.getpid()))
            self._moved = True
        v2_memory = self._enable_v2_memory()
        if v2_memory:
            with contextlib.suppress(CgroupError):  # an old kernel without it: not fatal
                _write(self.server_dir / "memory.oom.group", "1")
            if memory_max_bytes is not None:
                _write(self.server_dir / "memory.max", str(memory_max_bytes))
        memory_v1 = None
        if not v2_memory and self.memory_v1 is not None:
            try:
                self.memory_v1.mkdir(exist_ok=True)
                memory_v1 = self.memory_v1
            except OSError:
                memory_v1 = None  # no v1 memory group we may create: /proc gives the memory
        return ServerCgroup(self.server_dir, memory_v1, v2_memory)

    def _enable_v2_memory(self) -> bool:
        """+memory in P's and our root's subtree_control, where the controller is offered."""
        try:
            offered = _read(self.host.v2_dir / "cgroup.controllers").split()
        except CgroupError:
            return False
        if "memory" not in offered:
            return False  # a hybrid host: memory is a v1 controller there
        try:
            for node in (self.host.v2_dir, self.root):
                enabled = _read(node / "cgroup.subtree_control").split()
                if "memory" not in enabled:
                    _write(node / "cgroup.subtree_control", "+memory")
        except CgroupError:
            return False  # P still holds other processes (v2's no-internal-process rule)
        return (self.server_dir / "memory.stat").exists()

    def empty_helpers(self, timeout_s: float) -> list[int]:
        """Kill whatever runs in the helpers' groups (a hook or a reset command still running,
        or one a crashed supervisor of this instance left) and remove their leaves. Returns the
        PIDs found; a leaf whose processes did not die in time (D state) stays.

        Raises:
            CgroupError: the kill was refused.
        """
        if not self.helpers_dir.is_dir():
            return []
        leaves = [Cgroup(path) for path in subdirs(self.helpers_dir)]
        found = [pid for leaf in leaves for pid in leaf.pids()]
        if found:
            helpers = Cgroup(self.helpers_dir)
            helpers.kill()  # one write kills every leaf below
            helpers.wait_empty(timeout_s)
        for leaf in leaves:
            with contextlib.suppress(CgroupError):
                leaf.remove()
        return found

    def remove(self) -> list[str]:
        """Leave our leaf and rmdir every group made here; what could not go is returned."""
        problems = []
        if self._moved:
            try:
                _write(self.host.v2_dir / "cgroup.procs", str(os.getpid()))
                self._moved = False
            except CgroupError as exc:
                problems.append(str(exc))
        leaves = subdirs(self.helpers_dir)  # empty by now: their commands were killed
        groups = (self.helpers_dir, self.server_dir, self.supervisor, self.root, self.memory_v1)
        for path in existing_dirs((*leaves, *groups)):
            try:
                rmdir_group(path)
            except OSError as exc:
                problems.append(f"{path}: {exc.strerror}")
        return problems
