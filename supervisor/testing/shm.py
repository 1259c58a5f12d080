"""The simulated server's /dev/shm segments: SGLang's names, its creators, its stale sweep.

Imitated (paths under sglang/srt/):
- utils/stale_shm_cleanup.py `make_shm_name(kind)`: "sgl_shm_<kind>_<pid>_<rand>", pid =
  os.getpid() of the creating process, rand = uuid4().hex[:8]. Kinds in 0.5.23: "mq"
  (distributed/device_communicators/shm_broadcast.py `ShmRingBuffer`, the writer of a group's
  MessageQueue broadcaster), "nodecheck" (distributed/parallel_state.py `in_the_same_node_as`,
  128 bytes, unlinked by its creator after the group's barrier), "mm" (managers/mm_utils.py,
  multimodal tensors: not simulated). Segments are multiprocessing.shared_memory.SharedMemory
  (create=True), so the creator's resource tracker knows them too (below).
- `ShmRingBuffer.__del__`: the creator closes and unlinks its segment when the scheduler ends
  after a ShutdownReq (its clean exit). A SIGKILL skips that and leaks the segment.
- `_creator_pid` / `cleanup_stale_shm`: the sweep's rule, transcribed in `creator_pid` and
  `sweep_stale`. SGLang 0.5.23 never calls it from the server: its CI runs the module by path
  (SGLANG_IS_IN_CI=true) before a job. The simulation sweeps only when the scenario asks
  (`shm_sweep`), and only the pid-stamped families: SGLang also unlinks "sglang_loads_",
  "cuda.shm.", "nccl-" and "sem.loky-" files unconditionally ("safe only because the sweep runs
  at CI job start right after killall.py"), which on a shared test host would destroy other
  jobs' segments; the simulation never makes such files.

Python's resource tracker (a child of the main process, shared by every spawn child) unlinks
what its processes registered and never unlinked once the last of them has exited, unless it is
killed too: a SIGKILL to the main process alone therefore loses nothing (the children follow by
PDEATHSIG, then the tracker cleans up and warns "There appear to be N leaked shared_memory
objects"); a SIGKILL to the whole tree (kill_process_tree, a process group, a cgroup) leaks.

FAKE_SGLANG_SHM_RECORD: a file to which every simulated process appends, before creating it, the
name of each segment it makes (one per line): a test bed's own bookkeeping, so that tests can
remove what a killed server left, knowing it was theirs. Not read by anything else.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path

SHM_DIR = Path("/dev/shm")
SGL_SHM_PREFIX = "sgl_shm"
MULTI_TOKENIZER_PREFIX = "multi_tokenizer_args_"
RECORD_ENV = "FAKE_SGLANG_SHM_RECORD"
# shm_broadcast.py: GroupCoordinator's MessageQueue.create_from_process_group(cpu_group, 1 << 22,
# 6): ShmRingBuffer of (max_chunk_bytes + 1 + n_local_reader) * max_chunks bytes.
MQ_MAX_CHUNK_BYTES = 1 << 22
MQ_MAX_CHUNKS = 6
NODECHECK_BYTES = 128

# The segments this process created and still owns (unlinked on a clean exit).
_owned: list[SharedMemory] = []


def make_shm_name(kind: str, pid: int | None = None) -> str:
    """SGLang's pid-stamped name: sgl_shm_<kind>_<pid>_<rand> (pid: the creating process)."""
    pid = os.getpid() if pid is None else pid
    return f"{SGL_SHM_PREFIX}_{kind}_{pid}_{uuid.uuid4().hex[:8]}"


def mq_bytes(local_readers: int) -> int:
    """The size SGLang gives a broadcaster's ring buffer with `local_readers` same-node readers."""
    return (MQ_MAX_CHUNK_BYTES + 1 + local_readers) * MQ_MAX_CHUNKS


def creator_pid(filename: str) -> int | None:
    """The creator PID a /dev/shm name carries, by `_creator_pid`'s rule; None: not pid-stamped."""
    pid = None
    if filename.startswith(f"{SGL_SHM_PREFIX}_"):
        parts = filename.split("_")  # sgl_shm_<kind>_<pid>_<rand>: the pid is second to last
        if len(parts) >= 4:
            try:
                pid = int(parts[-2])
            except ValueError:
                return None
    elif filename.startswith(MULTI_TOKENIZER_PREFIX):
        try:
            pid = int(filename.rsplit("_", 1)[-1])
        except ValueError:
            return None
    if pid is not None and pid <= 0:
        return None  # os.kill(0 or -1, 0) would probe process groups, not a process
    return pid


def pid_alive(pid: int) -> bool:
    """`_pid_alive`: os.kill(pid, 0). A zombie and a recycled PID both count as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def sweep_stale(directory: Path = SHM_DIR) -> tuple[int, int]:
    """`cleanup_stale_shm` for the pid-stamped families: unlink each file whose creator PID is
    neither this process nor alive. Best effort, never raises. Returns (files removed, bytes)."""
    removed = freed = 0
    try:
        entries = list(directory.iterdir())
    except OSError:
        return 0, 0
    for entry in entries:
        pid = creator_pid(entry.name)
        if pid is None or pid == os.getpid() or pid_alive(pid):
            continue
        try:
            size = entry.stat().st_size
            entry.unlink()
        except OSError:
            continue  # raced with another cleaner, or not ours to remove
        removed += 1
        freed += size
    return removed, freed


def record(name: str) -> None:
    """Append `name` to $FAKE_SGLANG_SHM_RECORD (the test bed's bookkeeping), when set."""
    path = os.environ.get(RECORD_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:  # one short O_APPEND write per line
            f.write(f"{name}\n")


def create(name: str, size: int) -> SharedMemory:
    """Create, touch and own a segment (SharedMemory registers it with the resource tracker)."""
    record(name)
    segment = SharedMemory(name=name, create=True, size=max(1, size))
    buf = segment.buf
    assert buf is not None  # None only after close()
    # SGLang zeroes the ring's metadata, then writes chunks as it broadcasts: here every (scaled)
    # page is made resident at once.
    buf[:] = b"\0" * len(buf)
    _owned.append(segment)
    return segment


def release(segment: SharedMemory) -> None:
    """close() and unlink(), as the creator does; a segment already swept is not an error."""
    segment.close()
    with contextlib.suppress(FileNotFoundError):
        segment.unlink()
    if segment in _owned:
        _owned.remove(segment)


def release_owned() -> None:
    """A clean exit: every segment this process still owns is unlinked (ShmRingBuffer.__del__)."""
    for segment in list(_owned):
        release(segment)


def nodecheck_then_mq(mq_size: int | None) -> None:
    """A group writer's GroupCoordinator init: in_the_same_node_as's 128-byte probe (unlinked
    after the barrier), then, with readers on this node, the MessageQueue's ring buffer."""
    release(create(make_shm_name("nodecheck"), NODECHECK_BYTES))
    if mq_size is not None:
        create(make_shm_name("mq"), mq_size)
