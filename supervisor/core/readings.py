"""Value objects for what the adapters measure: host memory, processes, GPUs. Bytes and seconds."""

from __future__ import annotations

from dataclasses import dataclass

_FROZEN = {"frozen": True, "slots": True, "kw_only": True}


@dataclass(**_FROZEN)
class HostMemory:
    """/proc/meminfo plus the tightest memory-limited cgroup around the server, if any."""

    total_bytes: int
    available_bytes: int
    cgroup_headroom_bytes: int | None = None  # None: no memory limit found (or unreadable)

    @property
    def usable_bytes(self) -> int:
        """What can still be allocated: MemAvailable, capped by cgroup headroom."""
        if self.cgroup_headroom_bytes is None:
            return self.available_bytes
        return min(self.available_bytes, self.cgroup_headroom_bytes)


@dataclass(**_FROZEN)
class NumaNodeMemory:
    """One NUMA node's free memory (/sys/devices/system/node/nodeN/meminfo)."""

    node: int
    total_bytes: int
    available_bytes: int


@dataclass(**_FROZEN)
class ProcessInfo:
    """One process of the server tree, from /proc/PID/{stat,status,cmdline}."""

    pid: int
    ppid: int
    pgid: int
    state: str  # one letter as in /proc/PID/stat: R S D Z T t I X
    title: str  # the command line as ps shows it (SGLang ranks: "sglang::scheduler_TP0")
    rss_anon_bytes: int = 0
    rss_shmem_bytes: int = 0  # pinned host KV pools show here (docs/sglang.md, host pools)
    rss_file_bytes: int = 0  # mmapped weights: reclaimable, never a reason to act
    threads: int = 1
    start_ticks: int = 0  # clock ticks since boot: with the PID, names one process (no reuse)
    exit_status: int | None = None  # a zombie's wait status (/proc/PID/stat field 52)

    @property
    def charged_bytes(self) -> int:
        """Memory the watchdog charges to the process: anon + shmem, never file pages."""
        return self.rss_anon_bytes + self.rss_shmem_bytes

    @property
    def is_zombie(self) -> bool:
        return self.state == "Z"

    @property
    def is_stopped(self) -> bool:
        return self.state in ("T", "t")


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How the server's main process ended: exit code or terminating signal."""

    exit_code: int | None
    signal_number: int | None

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitStatus:
        """Popen's returncode: negative for a signal."""
        if returncode < 0:
            return cls(exit_code=None, signal_number=-returncode)
        return cls(exit_code=returncode, signal_number=None)


@dataclass(**_FROZEN)
class GpuProcess:
    """A compute process NVML lists on a GPU."""

    pid: int
    used_bytes: int | None  # None: NVML did not say (unified memory, containers)


@dataclass(**_FROZEN)
class GpuState:
    """One GPU as NVML sees it, keyed by UUID (indexes move with CUDA_VISIBLE_DEVICES)."""

    index: int
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    processes: tuple[GpuProcess, ...] = ()
    numa_node: int | None = None

    @property
    def free_bytes(self) -> int:
        return max(0, self.total_bytes - self.used_bytes)
