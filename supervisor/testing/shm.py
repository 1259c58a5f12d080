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

- managers/load_snapshot.py `ShmLoadSnapshotWriter`: the first scheduler of each attention group
  at PP stage 0 (managers/scheduler.py `init_ipc_channels`) creates, as it starts,
  sglang_loads_<instance id>_<blake2s>.shm (12 B + 16 KiB per DP rank; the instance id is
  server_args.py's uuid4().hex[:12], one per server) and maps it; SGLang never unlinks it, not
  even at a clean exit, and it is no SharedMemory, so no resource tracker knows it.

- tqdm's write lock behind the weight loading bar (progress_bar.py, drawn by the first rank of
  node 0): a named semaphore sem.mp-<8 chars>, recorded once made (its name is random).

FAKE_SGLANG_SHM_RECORD: a file to which every simulated process appends, before creating it, the
name of each segment it makes (one per line): a test bed's own bookkeeping, so that tests can
remove what a killed server left, knowing it was theirs. Not read by anything else.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import multiprocessing
import multiprocessing.util
import os
import struct
import uuid
from multiprocessing.shared_memory import SharedMemory
from multiprocessing.synchronize import SemLock
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
# managers/load_snapshot.py: HEADER_STRUCT "<4sHHI" (magic SLNS, version 2, DP ranks, slot
# size), then a 16 KiB slot per DP rank.
LOADS_PREFIX = "sglang_loads_"
LOADS_HEADER = struct.Struct("<4sHHI")
LOADS_SLOT_BYTES = 16 * 1024

# The segments this process created and still owns (unlinked on a clean exit).
_owned: list[SharedMemory] = []
_locks: list[object] = []  # semaphores kept for the process's life


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
    """A clean exit: every segment this process still owns is unlinked (ShmRingBuffer.__del__),
    and its semaphores' finalizers run, as the interpreter's exit runs them (sem_unlink)."""
    for segment in list(_owned):
        release(segment)
    if _locks:
        run_finalizers = getattr(multiprocessing.util, "_run_finalizers")  # noqa: B009
        run_finalizers(0)
        _locks.clear()


def make_write_lock() -> None:
    """tqdm's write lock (tqdm/std.py `TqdmDefaultWriteLock`: a multiprocessing RLock, made when
    the first bar is): in a "spawn" process it is a named semaphore, /dev/shm/sem.mp-<8 chars>,
    registered with the resource tracker and unlinked only by its finalizer at a clean exit or by
    the tracker (multiprocessing/synchronize.py `SemLock`). A SIGKILLed tree leaks it."""
    # Its name is random: recorded as SemLock picks it, before sem_open makes the file, so a
    # SIGKILL in between leaves nothing the test bed does not know of.
    make_name = getattr(SemLock, "_make_name")  # noqa: B009 (private, not in the stubs)

    def recorded_name() -> str:
        name = str(make_name())
        record("sem." + name.lstrip("/"))
        return name

    setattr(SemLock, "_make_name", staticmethod(recorded_name))  # noqa: B010
    try:
        _locks.append(multiprocessing.get_context("spawn").RLock())
    finally:
        setattr(SemLock, "_make_name", staticmethod(make_name))  # noqa: B010


def new_instance_id() -> str:
    """A server's instance id as SGLang makes it (server_args.py PortArgs.init_new)."""
    return uuid.uuid4().hex[:12]


def load_snapshot(instance_id: str, slot: int | None, dp_ranks: int) -> tuple[str, int, int] | None:
    """What a rank writing DP slot `slot` (None: no writer) gets to `write_load_snapshot`: the
    path (managers/load_snapshot.py `shm_path_for(port_args.instance_id)`), DP ranks, slot."""
    if slot is None:
        return None
    digest = hashlib.blake2s(instance_id.encode(), digest_size=4).hexdigest()
    return (str(SHM_DIR / f"{LOADS_PREFIX}{instance_id}_{digest}.shm"), dp_ranks, slot)


def write_load_snapshot(path: str, dp_ranks: int, slot: int) -> mmap.mmap:
    """`ShmLoadSnapshotWriter`: open(O_CREAT, 0600), size it for every DP rank, map it, write
    the header and an empty slot. Kept mapped for the process's life and never unlinked."""
    record(Path(path).name)
    size = LOADS_HEADER.size + dp_ranks * LOADS_SLOT_BYTES
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        region = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
    finally:
        os.close(fd)
    LOADS_HEADER.pack_into(region, 0, b"SLNS", 2, dp_ranks, LOADS_SLOT_BYTES)
    region[LOADS_HEADER.size + slot * LOADS_SLOT_BYTES] = 0
    return region


def nodecheck_then_mq(mq_size: int | None) -> None:
    """A group writer's GroupCoordinator init: in_the_same_node_as's 128-byte probe (unlinked
    after the barrier), then, with readers on this node, the MessageQueue's ring buffer."""
    release(create(make_shm_name("nodecheck"), NODECHECK_BYTES))
    if mq_size is not None:
        create(make_shm_name("mq"), mq_size)
