"""What the benchmarks share (not a test): ports, readiness, a crowd of idle host processes, a
cgroup for a server started outside `run`, and the summary of a list of numbers."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from supervisor.adapters.cgroup import (  # noqa: E402
    CgroupError,
    InstanceCgroups,
    ServerCgroup,
    discover,
)

MiB = 2**20
GB = 10**9


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_ok(port: int, path: str = "/health") -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def wait_for(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


@contextlib.contextmanager
def crowd(count: int) -> Iterator[None]:
    """`count` sleeping host processes (a busy GPU node runs 1-3 thousand PIDs), in a process
    group of their own that is killed at the end."""
    if count <= 0:
        yield
        return
    script = f"for i in $(seq {count}); do sleep 100000 & done; wait"
    shell = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    try:
        wait_for(lambda: _group_size(shell.pid) >= count, 120, f"{count} sleeping processes")
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)
        shell.wait(timeout=30)


def _group_size(pgid: int) -> int:
    size = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            size += int(fields[2]) == pgid
    return size


def host_process_count() -> int:
    return sum(1 for e in os.scandir("/proc") if e.name.isdigit())


@contextlib.contextmanager
def server_cgroup(enabled: bool) -> Iterator[ServerCgroup | None]:
    """A `server` group like `run` makes (this process stays where it is), or None."""
    if not enabled:
        yield None
        return
    try:
        groups = InstanceCgroups(discover(), f"bench-{uuid.uuid4().hex[:8]}")
        group = groups.create(move_self=False)
    except CgroupError as exc:
        raise SystemExit(f"no cgroup here: {exc}") from None
    try:
        yield group
    finally:
        group.empty_leftovers(30.0)
        groups.remove()


def spread(values: list[float]) -> dict[str, float | int | None]:
    """n, median, min, max and the interquartile range of `values`."""
    if not values:
        return {"n": 0, "median": None, "min": None, "max": None, "q1": None, "q3": None}
    ordered = sorted(values)
    quartiles = statistics.quantiles(ordered, n=4) if len(ordered) >= 2 else [ordered[0]] * 3
    return {
        "n": len(ordered),
        "median": statistics.median(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "q1": quartiles[0],
        "q3": quartiles[2],
    }


HOG = """
import mmap, sys, time
rate, cap, after = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
time.sleep(after)
t0 = time.monotonic(); done = 0; keep = []
while True:
    due = min(cap, int((time.monotonic() - t0) * rate))
    if due - done >= 1 << 20:
        m = mmap.mmap(-1, due - done, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        for off in range(0, due - done, 4096):
            m[off] = 1
        keep.append(m); done = due
    else:
        time.sleep(0.002)
"""


def read_meminfo_available() -> int:
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            if line.startswith(b"MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable")


def read_rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            total = 0
            for line in f:
                if line.startswith((b"RssAnon:", b"RssShmem:")):
                    total += int(line.split()[1]) * 1024
            return total
    except OSError:
        return None


def gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            return False
    return True
