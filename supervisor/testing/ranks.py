"""The simulated server's child processes: schedulers (one per local rank) and the detokenizer.

Started by fake_sglang as `multiprocessing` spawn children, like SGLang's. Each asks for SIGKILL
when its parent dies, titles itself like SGLang, "loads", allocates its pools as touched memory,
registers its GPU memory, then answers health pings and plays its part of the scenario.
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

from supervisor.testing import gpu_state
from supervisor.testing.scenario import Scenario

PAGE_BYTES = mmap.PAGESIZE
_PR_SET_PDEATHSIG = 1
# How often a rank looks at its pipe and its scenario timers; bounds every reaction time.
_TICK_S = 0.02


@dataclass(frozen=True, slots=True, kw_only=True)
class RankSpec:
    """Everything a child needs, picklable (spawn children share no memory with the parent)."""

    kind: str  # "scheduler" | "detokenizer"
    title: str
    log_prefix: str
    rank: int  # local rank index (0..local_ranks-1); -1 for the detokenizer
    gpu_index: int
    parent_pid: int
    scenario: Scenario
    state_dir: str | None
    pool_real_bytes: int
    pool_tokens: int
    pool_gb: float
    attention_kind: str
    runtime_real_bytes: int
    gpu_used_bytes: int
    gpu_total_bytes: int
    device_tokens: int
    kv_gb: float


def log(prefix: str, message: str) -> None:
    """One SGLang-style log line on stderr, flushed (the supervisor reads it through a pipe)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    head = f"[{stamp} {prefix}]" if prefix else f"[{stamp}]"
    sys.stderr.write(f"{head} {message}\n")
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


def _wait_or_shutdown(conn: Connection, seconds: float) -> None:
    """Sleep `seconds` while still obeying a shutdown sent meanwhile (graceful exit)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if conn.poll(min(left, _TICK_S)):
            _handle(conn)


def _handle(conn: Connection) -> None:
    try:
        message = conn.recv()
    except (EOFError, OSError):
        os._exit(0)  # the parent is gone: nothing left to serve
    if message == "shutdown":
        os._exit(0)
    if isinstance(message, tuple) and message[0] == "ping":
        try:
            conn.send(("pong", message[1]))
        except OSError:
            os._exit(0)


def run_child(spec: RankSpec, conn: Connection) -> None:
    """Entry point of every simulated child process."""
    die_with_parent(spec.parent_pid)
    set_title(spec.title)
    # SGLang's children leave SIGTERM/SIGINT to the main process, which drains and takes them down.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if spec.kind == "detokenizer":
        conn.send(("ready", os.getpid()))
        while True:
            if conn.poll(1.0):
                _handle(conn)
    _run_scheduler(spec, conn)


def _run_scheduler(spec: RankSpec, conn: Connection) -> None:
    scenario = spec.scenario
    p = spec.log_prefix
    log(p, f"Load weight begin. avail mem={spec.gpu_total_bytes / 2**30:.2f} GB")
    if scenario.exit_code_on_start is not None and spec.rank == 0:
        _wait_or_shutdown(conn, scenario.startup_s / 2)
        log(p, "Scheduler hit an exception: RuntimeError: simulated failure during load")
        sys.exit(scenario.exit_code_on_start)
    _wait_or_shutdown(conn, scenario.startup_s)
    state_dir = Path(spec.state_dir) if spec.state_dir else None
    if state_dir is not None:
        gpu_state.register_holder(
            state_dir,
            spec.gpu_index,
            spec.gpu_used_bytes,
            release_delay_s=scenario.gpu_release_delay_s,
            stuck=scenario.gpu_stuck,
        )
    log(p, "Load weight end. type=FakeForCausalLM, dtype=torch.bfloat16")
    runtime = touch_memory(spec.runtime_real_bytes, shared=False)
    half = spec.kv_gb / 2
    log(
        p,
        f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {spec.device_tokens}, "
        f"K size: {half:.2f} GB, V size: {half:.2f} GB",
    )
    pool = None
    if spec.pool_real_bytes > 0:
        log(
            p,
            f"Allocating {spec.attention_kind.upper()} hierarchical KV host pool: "
            f"{spec.pool_tokens} tokens, {spec.pool_gb:.2f} GB host memory.",
        )
        pool = touch_memory(spec.pool_real_bytes, shared=True)
    conn.send(("ready", os.getpid()))
    _serve(spec, conn, keep=(runtime, pool))


def _serve(spec: RankSpec, conn: Connection, keep: tuple[object, ...]) -> None:
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
    while True:
        if conn.poll(_TICK_S):
            _handle(conn)
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


def _crash(spec: RankSpec, sig: int | None, exit_code: int | None) -> None:
    if sig is not None:
        os.kill(os.getpid(), sig)
        time.sleep(1.0)  # a caught or ignored signal: fall through to a plain exit
        os._exit(128 + sig)
    log(spec.log_prefix, "Scheduler hit an exception: RuntimeError: simulated crash")
    # SGLang's scheduler tells its parent with SIGQUIT (docs/sglang.md §3.1).
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
