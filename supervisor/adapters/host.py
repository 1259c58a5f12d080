"""Host facts for the pre-flight from /proc, /sys and the cgroup tree (roots injectable for tests).

MemAvailable, cgroup v1/v2 headroom over all ancestors, NUMA node meminfo, RLIMIT_MEMLOCK,
/dev/shm's size and free space, hugepages, whether a port is bound, which processes hold
/dev/nvidia*, and the filesystem a directory is on.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from supervisor.core.units import KiB

# socket and core.readings (its dataclasses) are imported by the reads that need them: a
# pre-flight planning another box from given facts reads nothing here.
if TYPE_CHECKING:
    from supervisor.core.host_consumers import StorageDir
    from supervisor.core.readings import HostMemory, NumaNodeMemory
    from supervisor.core.shm_space import ShmSpace

# cgroup v1 reports "no limit" as a page-rounded LONG_MAX (9223372036854771712).
_V1_UNLIMITED = 1 << 62


class HostReadError(OSError):
    """A host fact could not be read; the message says which file and why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CgroupReading:
    """Tightest memory headroom over the process's cgroup and its ancestors."""

    headroom_bytes: int | None  # None: no limit anywhere
    limited_by: str | None = None  # the cgroup directory with the tightest limit
    warning: str | None = None  # set when the tree could not be read (budget then ignores it)


@dataclass(frozen=True, slots=True, kw_only=True)
class Hugepages:
    """One hugepage size: pages free and the page size."""

    page_bytes: int
    total_pages: int
    free_pages: int

    @property
    def free_bytes(self) -> int:
        return self.page_bytes * self.free_pages


_CAP_IPC_LOCK = 14  # linux/capability.h


def _kv_file(path: Path) -> dict[str, int]:
    """Parse `key value [kB]` lines (meminfo, memory.stat); kB values become bytes."""
    out: dict[str, int] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.replace(":", " ").split()
        if parts and parts[0] == "Node" and len(parts) >= 2:
            parts = parts[2:]  # "Node 0 MemFree: 123 kB" in /sys/.../nodeN/meminfo
        if len(parts) < 2:
            continue
        try:
            value = int(parts[1])
        except ValueError:
            continue
        if len(parts) >= 3 and parts[2].lower() == "kb":
            value *= KiB
        out[parts[0]] = value
    return out


def _read_int(path: Path) -> int | None:
    """An integer file such as memory.max; None for "max" (no limit)."""
    text = path.read_text(encoding="utf-8").strip()
    if text == "max":
        return None
    return int(text)


class HostProbe:
    """Reads host facts under injectable roots (earlyoom's procdir_path idea)."""

    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        sys_root: Path = Path("/sys"),
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        shm_path: Path = Path("/dev/shm"),
    ) -> None:
        self.proc_root = proc_root
        self.sys_root = sys_root
        self.cgroup_root = cgroup_root
        self.shm_path = shm_path

    def read_meminfo(self) -> HostMemory:
        """MemTotal and MemAvailable from /proc/meminfo.

        Raises:
            HostReadError: the file is missing or lacks MemAvailable (kernel < 3.14).
        """
        from supervisor.core.readings import HostMemory

        path = self.proc_root / "meminfo"
        try:
            fields = _kv_file(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise HostReadError(f"cannot read {path}: {exc}") from None
        if "MemAvailable" not in fields or "MemTotal" not in fields:
            raise HostReadError(f"{path} lacks MemTotal/MemAvailable")
        return HostMemory(total_bytes=fields["MemTotal"], available_bytes=fields["MemAvailable"])

    def read_hugepages(self) -> tuple[Hugepages, ...]:
        """Every configured hugepage size (/sys/kernel/mm/hugepages); empty when none."""
        base = self.sys_root / "kernel" / "mm" / "hugepages"
        out: list[Hugepages] = []
        with contextlib.suppress(OSError):
            for entry in sorted(base.iterdir()):
                name = entry.name  # hugepages-2048kB
                if not name.startswith("hugepages-") or not name.endswith("kB"):
                    continue
                try:
                    size_kib = int(name[len("hugepages-") : -2])
                    total = _read_int(entry / "nr_hugepages") or 0
                    free = _read_int(entry / "free_hugepages") or 0
                except (OSError, ValueError):
                    continue
                out.append(Hugepages(page_bytes=size_kib * KiB, total_pages=total, free_pages=free))
        return tuple(out)

    def _cgroup_paths(self, pid: str) -> tuple[str | None, str | None]:
        """(v2 path, v1 memory path) of the process from /proc/PID/cgroup."""
        v2: str | None = None
        v1: str | None = None
        text = (self.proc_root / pid / "cgroup").read_text(encoding="utf-8")
        for line in text.splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            hierarchy, controllers, path = parts
            if hierarchy == "0" and controllers == "":
                v2 = path
            elif "memory" in controllers.split(","):
                v1 = path
        return v2, v1

    @staticmethod
    def _ancestors(root: Path, rel: str) -> list[Path]:
        """The cgroup directory and every ancestor up to the root, deepest first."""
        parts = [p for p in rel.strip("/").split("/") if p]
        dirs = [root.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
        return [d for d in dirs if d.is_dir()]

    def read_cgroup_headroom(self, pid: str = "self") -> CgroupReading:
        """Headroom = limit − (usage − file pages), the minimum over all ancestors (docs/sglang.md
        §1.6).

        v2: min(memory.max, memory.high) − (memory.current − active_file − inactive_file);
        v1: memory.limit_in_bytes − (memory.usage_in_bytes − total_{active,inactive}_file).
        An unreadable tree degrades to a warning and no limit.
        """
        try:
            v2, v1 = self._cgroup_paths(pid)
            best: tuple[int, str] | None = None
            if v2 is not None and (self.cgroup_root / "cgroup.controllers").exists():
                for d in self._ancestors(self.cgroup_root, v2):
                    limits = [
                        _read_int(d / name)
                        for name in ("memory.max", "memory.high")
                        if (d / name).exists()
                    ]
                    finite = [x for x in limits if x is not None]
                    if not finite:
                        continue
                    stat = _kv_file(d / "memory.stat")
                    used = _read_int(d / "memory.current") or 0
                    used -= stat.get("active_file", 0) + stat.get("inactive_file", 0)
                    room = min(finite) - max(0, used)
                    if best is None or room < best[0]:
                        best = (room, str(d))
            elif v1 is not None:
                mem_root = self.cgroup_root / "memory"
                for d in self._ancestors(mem_root, v1):
                    if not (d / "memory.limit_in_bytes").exists():
                        continue
                    limit = _read_int(d / "memory.limit_in_bytes")
                    if limit is None or limit >= _V1_UNLIMITED:
                        continue
                    stat = _kv_file(d / "memory.stat")
                    used = _read_int(d / "memory.usage_in_bytes") or 0
                    used -= stat.get("total_active_file", 0) + stat.get("total_inactive_file", 0)
                    room = limit - max(0, used)
                    if best is None or room < best[0]:
                        best = (room, str(d))
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            return CgroupReading(
                headroom_bytes=None, warning=f"cgroup memory limits unreadable ({exc})"
            )
        if best is None:
            return CgroupReading(headroom_bytes=None)
        return CgroupReading(headroom_bytes=max(0, best[0]), limited_by=best[1])

    def read_numa_nodes(self) -> tuple[NumaNodeMemory, ...]:
        """Per-node memory from /sys/devices/system/node/nodeN/meminfo.

        Node meminfo has no MemAvailable; free + file pages + reclaimable slab approximates it
        the way the kernel's si_mem_available() does for the whole machine.

        Raises:
            HostReadError: a node directory exists but its meminfo cannot be parsed.
        """
        from supervisor.core.readings import NumaNodeMemory

        base = self.sys_root / "devices" / "system" / "node"
        nodes: list[NumaNodeMemory] = []
        try:
            entries = sorted(base.iterdir())
        except OSError:
            return ()
        for entry in entries:
            suffix = entry.name[len("node") :]
            if not entry.name.startswith("node") or not suffix.isdigit():
                continue
            try:
                fields = _kv_file(entry / "meminfo")
            except (OSError, UnicodeDecodeError) as exc:
                raise HostReadError(f"cannot read {entry / 'meminfo'}: {exc}") from None
            if "MemTotal" not in fields or "MemFree" not in fields:
                raise HostReadError(f"{entry / 'meminfo'} lacks MemTotal/MemFree")
            available = fields["MemFree"] + fields.get("Active(file)", 0)
            available += fields.get("Inactive(file)", 0) + fields.get("SReclaimable", 0)
            nodes.append(
                NumaNodeMemory(
                    node=int(suffix), total_bytes=fields["MemTotal"], available_bytes=available
                )
            )
        return tuple(nodes)

    def read_memlock_limit(self, pid: str = "self") -> int | None:
        """Soft RLIMIT_MEMLOCK in bytes from /proc/PID/limits; None when unlimited.

        Raises:
            HostReadError: the limits file is unreadable or lacks the line.
        """
        path = self.proc_root / pid / "limits"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise HostReadError(f"cannot read {path}: {exc.strerror or exc}") from None
        for line in text.splitlines():
            if line.startswith("Max locked memory"):
                soft = line[len("Max locked memory") :].split()[0]
                return None if soft == "unlimited" else int(soft)
        raise HostReadError(f"{path} has no 'Max locked memory' line")

    def has_ipc_lock(self, pid: str = "self") -> bool:
        """CAP_IPC_LOCK in the effective set (a pod's `capabilities.add: [IPC_LOCK]`): pinning
        is then not bounded by RLIMIT_MEMLOCK. False when the status file is unreadable."""
        try:
            text = (self.proc_root / pid / "status").read_text(encoding="utf-8")
        except OSError:
            return False
        for line in text.splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> _CAP_IPC_LOCK & 1)
        return False

    def read_shm(self) -> ShmSpace | None:
        """/dev/shm's size and free space (SGLang's queues and NCCL's buffers live there).
        Free is f_bavail: a full /dev/shm is as big as an empty one."""
        from supervisor.core.shm_space import ShmSpace

        try:
            st = os.statvfs(self.shm_path)
        except OSError:
            return None
        return ShmSpace(size_bytes=st.f_frsize * st.f_blocks, free_bytes=st.f_frsize * st.f_bavail)

    def read_filesystem(self, path: str) -> StorageDir:
        """The filesystem type and free space where `path` is or would be created (its nearest
        existing ancestor), from mountinfo's longest matching mount point; unknown: None."""
        from supervisor.core.host_consumers import StorageDir

        existing = Path(os.path.abspath(path))
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        free: int | None = None
        with contextlib.suppress(OSError):
            st = os.statvfs(existing)
            free = st.f_frsize * st.f_bavail
        return StorageDir(path=path, fs_type=self._fs_type(existing), free_bytes=free)

    def _fs_type(self, path: Path) -> str | None:
        try:
            lines = (self.proc_root / "self" / "mountinfo").read_text().splitlines()
            resolved = str(path.resolve())
        except OSError:
            return None
        best, fs_type = -1, None
        for line in lines:
            left, sep, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if not sep or len(fields) < 5 or not tail:
                continue
            mount = fields[4].replace("\\040", " ")
            inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > best:  # later mounts over the same point win on ties
                best, fs_type = len(mount), tail[0]
            elif inside and len(mount) == best:
                fs_type = tail[0]
        return fs_type

    def read_device_holders(self, exclude_pid: int | None = None) -> dict[int, frozenset[str]]:
        """PIDs holding /dev/nvidia* open, with the device paths (unreadable PIDs are skipped)."""
        holders: dict[int, frozenset[str]] = {}
        try:
            pids = [p for p in os.listdir(self.proc_root) if p.isdigit()]
        except OSError:
            return holders
        for pid_text in pids:
            pid = int(pid_text)
            if pid == exclude_pid:
                continue
            fd_dir = self.proc_root / pid_text / "fd"
            try:
                fds = os.listdir(fd_dir)
            except OSError:
                continue  # gone, or another user's process
            devices: set[str] = set()
            for fd in fds:
                try:
                    target = os.readlink(fd_dir / fd)
                except OSError:
                    continue
                if target.startswith("/dev/nvidia"):
                    devices.add(target)
            if devices:
                holders[pid] = frozenset(devices)
        return holders


def is_port_bound(host: str, port: int) -> bool:
    """True when something already listens on host:port (a bind attempt fails with EADDRINUSE)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return False
    for family, socktype, proto, _name, addr in infos:
        with socket.socket(family, socktype, proto) as sock:
            # uvicorn sets SO_REUSEADDR too, so TIME_WAIT leftovers do not count as bound.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(addr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False
