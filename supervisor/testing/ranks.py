"""The simulated schedulers (one per local rank), and what every simulated child shares.

Started as `multiprocessing` spawn children, like SGLang's, by the main process or by the DP
controller (supervisor/testing/children.py). A scheduler asks for SIGKILL when its parent dies,
titles itself, "loads" (logging and registering its GPU memory stage by stage, as
model_executor/model_runner.py and the KV pool do), allocates its host pool as touched memory,
then answers health pings and plays its part of the scenario. It installs no signal handler
(managers/scheduler.py `run_scheduler_process` installs none): SIGTERM kills it (-15), SIGINT
raises KeyboardInterrupt, which multiprocessing turns into exit code 1.

With a torch world (rendezvous.py: --dist-init-addr, or a gate) the rank joins it before its
broadcasters are made (distributed/bootstrap.py `init_parallel_runtime`), waits at the gate
(gate.py) before the weights load, exits on rank 0's ShutdownReq relayed over the communicator,
and, once the communicator broke, hangs after nccl_timeout_s: it stops answering its main
process (a collective waiting on a dead peer) and never exits by itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from supervisor.testing import gpu_state, memlog, shm
from supervisor.testing.progress_bar import load_shards
from supervisor.testing.rendezvous import Communicator, RendezvousError, World
from supervisor.testing.scenario import Scenario, injected_value

PAGE_BYTES = mmap.PAGESIZE
_PR_SET_PDEATHSIG = 1
# How often a rank looks at its pipe and its scenario timers; bounds every reaction time.
_TICK_S = 0.02


@dataclass(frozen=True, slots=True, kw_only=True)
class RankSpec:
    """Everything a scheduler needs, picklable (spawn children share no memory with the parent)."""

    title: str
    log_prefix: str
    rank: int  # index among this node's schedulers, as scenario keys count them
    gpu_index: int
    parent_pid: int
    scenario: Scenario
    state_dir: str | None
    pool_real_bytes: int
    runtime_real_bytes: int
    gpu_total_bytes: int
    memory: memlog.MemoryPlan
    # One per broadcaster group this rank writes: its ring buffer's real size in /dev/shm, or
    # None when no reader shares the node (then only the transient nodecheck segment).
    broadcasts: tuple[int | None, ...] = ()
    draws_shard_bar: bool = False  # the first rank of node 0 (SGLang's global rank 0)
    world: World | None = None  # None: no rendezvous (no --dist-init-addr, no gate)
    loads: tuple[str, int, int] | None = None  # load snapshot it writes: (path, DP ranks, slot)


def log(prefix: str, message: str) -> None:
    """One SGLang-style log line on stderr, flushed (the supervisor reads it through a pipe).

    `prefix` is SGLang's logger prefix as configure_logger gets it (" TP0", " DP1 TP1", "" for
    the main process), giving "[%(asctime)s{prefix}] %(message)s" (utils/common.py).
    """
    _write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{prefix}] {message}")


def log_uvicorn(level: str, message: str) -> None:
    """A line through uvicorn's logger as SGLang formats it: "[%(asctime)s] %(levelprefix)s
    %(message)s" (utils/common.py `set_uvicorn_logging_configs`; uvicorn pads "INFO:" to 9)."""
    levelprefix = f"{level}:".ljust(9)
    _write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {levelprefix} {message}")


def _write(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def die_with_parent(parent_pid: int) -> None:
    """PR_SET_PDEATHSIG=SIGKILL, then re-check the parent: it may have died before the prctl."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def set_title(title: str) -> None:
    """setproctitle as SGLang does; SPT_NOENV keeps /proc/PID/environ readable (test markers)."""
    os.environ["SPT_NOENV"] = "1"
    import setproctitle

    setproctitle.setproctitle(title)


def run_init_subprocess(lifetime_s: float) -> None:
    """A subprocess run while the scheduler initialises (utils/common.py `parse_lscpu_topology`
    runs lscpu on CPU, nvidia-smi on GPUs): forked after the title is set, the child carries the
    scheduler's title until it execs; here it keeps it for `lifetime_s`, then exits 0. The
    scheduler waits for it (subprocess.run), so it reaps it at once."""
    child = os.fork()
    if child == 0:
        try:
            time.sleep(lifetime_s)
        finally:
            os._exit(0)
    os.waitpid(child, 0)


def touch_memory(size: int, *, shared: bool) -> mmap.mmap:
    """Map `size` bytes of anonymous memory and write every page so it is resident.

    Shared (MAP_SHARED|MAP_ANONYMOUS) pages count as RssShmem and leave MemAvailable, as SGLang's
    pinned host pool does (docs/sglang.md §1.7); private ones count as RssAnon.
    """
    size = max(PAGE_BYTES, -(-size // PAGE_BYTES) * PAGE_BYTES)
    flags = (mmap.MAP_SHARED if shared else mmap.MAP_PRIVATE) | mmap.MAP_ANONYMOUS
    region = mmap.mmap(-1, size, flags=flags)
    for offset in range(0, size, PAGE_BYTES):
        region[offset] = 1
    return region


def handle_message(
    conn: Connection, *, obeys_shutdown: bool, comm: Communicator | None = None
) -> None:
    """One message from the parent: answer a ping; a ShutdownReq ends the process with 0."""
    try:
        message = conn.recv()
    except (EOFError, OSError):
        os._exit(0)  # the parent is gone: nothing left to serve
    if message == "shutdown" and obeys_shutdown:
        if comm is not None and comm.world.rank == 0:
            comm.broadcast("shutdown")  # recv_requests: rank 0 broadcasts it to the others
        # scheduler.py handle_shutdown: the event loop ends, run_scheduler_process returns, and
        # the interpreter's exit runs ShmRingBuffer.__del__ (its segment unlinked).
        shm.release_owned()
        os._exit(0)
    if isinstance(message, tuple) and message[0] == "ping":
        try:
            conn.send(("pong", message[1]))
        except OSError:
            os._exit(0)


def _wait(conn: Connection, seconds: float, comm: Communicator | None = None) -> None:
    """Sleep `seconds` while still answering the parent (a ShutdownReq meanwhile ends us)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        _check_world(comm)
        if conn.poll(min(left, _TICK_S)):
            handle_message(conn, obeys_shutdown=True, comm=comm)


def _check_world(comm: Communicator | None) -> None:
    """Leave on a relayed ShutdownReq; hang for good once a broken communicator timed out."""
    if comm is None:
        return
    if comm.shutdown.is_set():
        shm.release_owned()
        os._exit(0)
    if comm.hung():
        while True:  # stuck in a collective: no pong, no exit; SIGKILL or PDEATHSIG end it
            time.sleep(1.0)


def _join_world(spec: RankSpec, conn: Connection) -> Communicator | None:
    """init_distributed_environment; its exception is the scheduler's (run_scheduler_process):
    logged, SIGQUIT to the parent, and the process function returns."""
    if spec.world is None:
        return None
    try:
        return Communicator.join(spec.world, lambda seconds: _wait(conn, seconds))
    except RendezvousError as exc:
        frame = 'File "sglang/srt/distributed/parallel_state.py", in init_distributed_environment'
        error = str(exc)
    except ValueError as exc:  # NetworkAddress.parse(--dist-init-addr)
        frame, error = 'File "sglang/srt/utils/network.py", in parse', f"ValueError: {exc}"
    log(
        spec.log_prefix,
        f"Scheduler hit an exception: Traceback (most recent call last):\n  {frame}\n{error}",
    )
    with contextlib.suppress(ProcessLookupError):
        os.kill(spec.parent_pid, signal.SIGQUIT)
    # The function returns (exit 0) while the parent's handler kills the tree: wait for that kill,
    # so that the parent's SIGQUIT path, not a dead rank, decides how the launch ends.
    deadline = time.monotonic() + 10.0
    while os.getppid() == spec.parent_pid and time.monotonic() < deadline:
        time.sleep(_TICK_S)
    os._exit(0)


class _Gpu:
    """This rank's share of its simulated GPU, registered stage by stage as SGLang fills it."""

    def __init__(self, spec: RankSpec) -> None:
        self.spec = spec
        self.state_dir = Path(spec.state_dir) if spec.state_dir else None
        self.held = 0

    def hold(self, extra: int) -> None:
        self.held += extra
        if self.state_dir is not None:
            gpu_state.register_holder(
                self.state_dir,
                self.spec.gpu_index,
                self.held,
                release_delay_s=self.spec.scenario.gpu_release_delay_s,
                stuck=self.spec.scenario.gpu_stuck,
            )

    def free(self) -> int:
        return memlog.gpu_free_bytes(
            self.state_dir, self.spec.gpu_index, self.spec.gpu_total_bytes, self.held
        )


def run_scheduler(spec: RankSpec, conn: Connection) -> None:
    """Entry point of a simulated scheduler: load, report ready, serve."""
    die_with_parent(spec.parent_pid)
    set_title(spec.title)
    scenario, plan, p = spec.scenario, spec.memory, spec.log_prefix
    if scenario.init_fork_s is not None:
        run_init_subprocess(scenario.init_fork_s)
    loads = shm.write_load_snapshot(*spec.loads) if spec.loads is not None else None
    gpu = _Gpu(spec)
    if plan.cuda_context_bytes:
        gpu.hold(plan.cuda_context_bytes)  # torch's CUDA context, before the first measurement
    comm = _join_world(spec, conn)
    for mq_size in spec.broadcasts:  # init_torch_distributed, before the weights load
        shm.nodecheck_then_mq(mq_size)
    if comm is not None:
        from supervisor.testing import gate  # imports this module: not at the top

        gate.wait_for_gate(comm, p, lambda seconds: _wait(conn, seconds, comm))
    log(p, memlog.load_begin(gpu.free()))
    began = time.monotonic()
    if scenario.exit_code_on_start is not None and spec.rank == 0:
        _wait(conn, scenario.startup_s / 2, comm)
        os._exit(scenario.exit_code_on_start)  # dies outside Python's handlers (no SIGQUIT)
    if spec.draws_shard_bar:  # torch.distributed rank 0 (weight_utils.py enable_tqdm)
        shm.make_write_lock()
        load_shards(scenario.weight_shards, scenario.startup_s, lambda s: _wait(conn, s, comm))
    else:
        _wait(conn, scenario.startup_s, comm)
    gpu.hold(plan.weights_bytes)
    log(p, memlog.load_end(plan, time.monotonic() - began, gpu.free()))
    runtime = touch_memory(spec.runtime_real_bytes, shared=False)
    gpu.hold(plan.device_bytes())
    for line in memlog.kv_allocated_lines(plan):
        log(p, line)
    log(p, memlog.pool_end(gpu.free()))
    for line in memlog.host_pool_lines(plan):
        log(p, line)
    pool = touch_memory(spec.pool_real_bytes, shared=True) if spec.pool_real_bytes > 0 else None
    _check_world(comm)
    conn.send(("ready", os.getpid()))
    _serve(spec, conn, keep=(runtime, pool, loads), comm=comm)


def _serve(
    spec: RankSpec, conn: Connection, keep: tuple[object, ...], comm: Communicator | None
) -> None:
    """The rank's event loop: answer pings and fire the scenario's timed events.

    `keep` holds the rank's pools: mapped and resident for as long as this frame lives.
    """
    scenario = spec.scenario
    up_at = time.monotonic()
    leaked: list[mmap.mmap] = []
    leaked_bytes = 0
    orphan_proc: subprocess.Popen[bytes] | None = None
    orphan_due = scenario.orphan is not None and scenario.orphan.rank == spec.rank
    hang_due = scenario.hang is not None and scenario.hang.rank == spec.rank
    fault = scenario.gpu_fault if spec.state_dir else None
    fault_due = fault is not None and fault.rank == spec.rank
    while True:
        _check_world(comm)
        if conn.poll(_TICK_S):
            handle_message(conn, obeys_shutdown=True, comm=comm)
        age_s = time.monotonic() - up_at
        crash = scenario.crash
        if crash is not None and crash.rank == spec.rank and age_s >= crash.after_s:
            _crash(spec, crash.signal, crash.exit_code)
        zombie = scenario.zombie
        if zombie is not None and zombie.rank == spec.rank and age_s >= zombie.after_s:
            os._exit(0)  # the main process never reaps this rank: it stays Z
        if hang_due and scenario.hang is not None and age_s >= scenario.hang.after_s:
            hang_due = False
            os.kill(os.getpid(), signal.SIGSTOP)  # state T until someone sends SIGCONT/KILL
        leak = scenario.leak
        if leak is not None and leak.rank == spec.rank and age_s >= leak.after_s:
            due = min(leak.max_bytes, int((age_s - leak.after_s) * leak.bytes_per_s))
            if due - leaked_bytes >= PAGE_BYTES:
                leaked.append(touch_memory(due - leaked_bytes, shared=leak.kind == "shmem"))
                leaked_bytes = due
        if orphan_due and scenario.orphan is not None and age_s >= scenario.orphan.after_s:
            orphan_due = False
            orphan_proc = _start_orphan(spec)
        if orphan_proc is not None and orphan_proc.poll() is not None:
            orphan_proc = None  # reaped: the double-fork middle process, or an orphan that ended
        if fault_due and fault is not None and age_s >= fault.after_s:
            fault_due = False  # the driver's view changes; the rank itself carries on
            # Imported here: it brings pynvml, megabytes in every rank that never injects, and
            # the e2e watchdog tests budget the simulated tree's real memory to a few MiB.
            from supervisor.testing import gpu_faults

            gpu_faults.inject(
                Path(str(spec.state_dir)), spec.gpu_index, fault.kind, injected_value(fault)
            )


def _crash(spec: RankSpec, sig: int | None, exit_code: int | None) -> None:
    if sig is not None:
        os.kill(os.getpid(), sig)
        time.sleep(1.0)  # a caught or ignored signal: fall through to a plain exit
        os._exit(128 + sig)
    # scheduler.py run_scheduler_process: the exception is logged and the parent gets SIGQUIT.
    log(spec.log_prefix, "Scheduler hit an exception: RuntimeError: simulated crash")
    with contextlib.suppress(ProcessLookupError):
        os.kill(spec.parent_pid, signal.SIGQUIT)
    os._exit(exit_code if exit_code is not None else 1)


def _start_orphan(spec: RankSpec) -> subprocess.Popen[bytes]:
    orphan = spec.scenario.orphan
    assert orphan is not None
    gpu = str(spec.gpu_index) if orphan.holds_gpu and spec.state_dir else "-1"
    args = [
        sys.executable,
        "-m",
        "supervisor.testing.orphan",
        orphan.kind,
        gpu,
        str(orphan.gpu_bytes),
        str(orphan.lifetime_s),
        orphan.title,
    ]
    return subprocess.Popen(args, start_new_session=orphan.kind == "setsid")
