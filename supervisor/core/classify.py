"""Classify a server death from its exit status, signal, log tail and what the supervisor saw.

Pure. The class decides what happens next (bad flags: never retried) and the hint tells the
operator what to change. Precedence: a component that killed the tree for its own reason
(watchdog: memory_kill) > SGLang's own words in the log > the kernel's OOM-kill counters > a
SIGBUS before ready (its hint names /dev/shm) > what the supervisor observed (rank state, health,
startup) > a generic "exited".

A SIGKILL alone says nothing about memory: SGLang's main process SIGKILLs itself after every
child failure (utils/common.py `kill_process_tree`, include_parent=True by default, called by
the SIGQUIT handlers of entrypoints/engine.py and managers/tokenizer_manager.py and by the
warm-up's failure path in entrypoints/http_server.py), so its status is signal 9 after an init
assert, a rank's death or a failed host-pool allocation alike. Only the kernel's own count names
the OOM killer: the tree cgroup's `oom_kill` (memory.events), else /proc/vmstat's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from supervisor.core.bounded import clip_line
from supervisor.core.log_phases import CRASH_MARKS, LogMark, MarkedLine, marks_in, read_mark

_SIGKILL = 9  # signal.SIGKILL on Linux; the core does not import the OS
_SIGBUS = 7  # signal.SIGBUS on Linux (x86-64 and arm64)
# A write into a tmpfs page that cannot be had is a SIGBUS, not an error: SGLang's queues and
# NCCL's buffers are ftruncated segments of /dev/shm, so a full one kills the rank that first
# writes into its segment (core/shm_space.py). A model file cut short under its mmap does the same.
_SIGBUS_HINT = (
    "a process died of SIGBUS (signal 7, 'Bus error') before ready: most often /dev/shm is "
    "full or too small for SGLang's queues and NCCL's buffers (`df -h /dev/shm`: remove what "
    "fills it, or enlarge it: docker --shm-size, the pod's /dev/shm emptyDir sizeLimit); else "
    "a model file changed or cut short while it was mapped"
)


class FailureKind(str, Enum):
    """Why the server died; the value is logged and stored in the state file."""

    BAD_FLAGS = "bad_flags"
    PORT_IN_USE = "port_in_use"
    GPU_OOM_AT_LOAD = "gpu_oom_at_load"
    KERNEL_OOM_KILLED = "kernel_oom_killed"
    RANK_CRASH = "rank_crash"
    RANK_ZOMBIE = "rank_zombie"
    RANK_STOPPED = "rank_stopped"
    HEALTH_TIMEOUT = "health_timeout"
    STARTUP_STALL = "startup_stall"
    STARTUP_TIMEOUT = "startup_timeout"
    EXITED_UNEXPECTEDLY = "exited_unexpectedly"
    MEMORY_KILL = "memory_kill"  # the watchdog killed the group before the host ran out
    GPU_DIRTY = "gpu_dirty"  # GPU memory stayed held after the tree was gone
    HEALTH_PATH_MISSING = "health_path_missing"  # the server answers 404 on run.health_path
    GPU_XID = "gpu_xid"  # a critical Xid / ECC error on a target GPU: group killed (core/xid.py)
    GPU_XID_FATAL = "gpu_xid_fatal"  # the same, and only a reboot or a drain brings it back
    # A node of the group failed (its supervisor is gone or not live); this node's ranks cannot
    # go on without it: its tree was killed (group/peer.py).
    PEER_LOST = "peer_lost"


_HINTS: dict[FailureKind, str] = {
    FailureKind.BAD_FLAGS: "SGLang rejected its arguments (exit 2); fix the flags, a restart "
    "cannot help",
    FailureKind.PORT_IN_USE: "the port is taken by another process; stop it or pick another --port",
    FailureKind.GPU_OOM_AT_LOAD: "GPU out of memory while loading: lower --mem-fraction-static "
    "(more room for activations and CUDA graphs) or --cuda-graph-max-bs; if the weights leave no "
    "room for the KV cache, use more GPUs (--tp-size)",
    FailureKind.KERNEL_OOM_KILLED: "killed by the kernel OOM killer (its oom_kill counter grew "
    "during the run; host memory ran out): lower --hicache-size, check `sglang-supervisor "
    "preflight` and `dmesg`",
    FailureKind.RANK_CRASH: "a scheduler rank died; the server log lines above say why",
    FailureKind.RANK_ZOMBIE: "a scheduler rank exited and was never reaped (zombie); the "
    "server cannot serve even if HTTP still answers",
    FailureKind.RANK_STOPPED: "a scheduler rank is stopped (state T: SIGSTOP or a debugger); "
    "the server cannot serve",
    FailureKind.HEALTH_TIMEOUT: "the health endpoint failed repeatedly; the server was "
    "unresponsive",
    FailureKind.STARTUP_STALL: "no load progress (memory or log output) within "
    "startup_stall_timeout: check model storage, network file systems and NCCL",
    FailureKind.STARTUP_TIMEOUT: "not ready within startup_timeout although it made progress; "
    "raise run.startup_timeout for very large models",
    FailureKind.EXITED_UNEXPECTEDLY: "the server exited without being asked to; the server log "
    "lines above say why",
    FailureKind.MEMORY_KILL: "killed by the watchdog before host memory ran out; the next "
    "launch may use a smaller --hicache-size",
    FailureKind.GPU_DIRTY: "GPU memory stayed held after the server was gone; the GPU needs a "
    "reset before SGLang can use it again",
    FailureKind.HEALTH_PATH_MISSING: "the server answers 404 on the health path: it does not "
    "exist there; set run.health_path (--health-path) to /health or /health_generate",
    FailureKind.GPU_XID: "a target GPU reported a critical Xid or an uncorrectable ECC error; "
    "the supervisor killed the server (the gpu_xid incident file has the details)",
    FailureKind.GPU_XID_FATAL: "only a node reboot or a drain clears this GPU error (the gpu_xid "
    "incident file has the details)",
    FailureKind.PEER_LOST: "the group's leader failed (its supervisor is gone or not live) and "
    "this node's ranks cannot go on without it; the leader's log says why",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class DeathContext:
    """What the supervisor knows beyond the exit status."""

    observed: FailureKind | None = None  # what the runner saw: a rank state, health, startup
    override: FailureKind | None = None  # a component killed the tree for this reason
    override_detail: str = ""
    was_ready: bool = False
    killed_by_us: bool = False  # the supervisor killed the tree before it exited by itself
    # The kernel's OOM kills during the run, None = unknown: the host's (/proc/vmstat oom_kill)
    # and the tree's own (its cgroup's memory.events oom_kill, which counts only its processes;
    # when known it decides, as the host's may be another cgroup's victim).
    oom_kills: int | None = None
    tree_oom_kills: int | None = None


class Classification(NamedTuple):
    kind: FailureKind
    hint: str


def describe_exit(exit_code: int | None, signal_number: int | None) -> str:
    """'exit status 1', 'killed by signal 9', or 'still running' for the log and reports."""
    if signal_number is not None:
        return f"killed by signal {signal_number}"
    if exit_code is not None:
        return f"exit status {exit_code}"
    return "still running"


def argparse_message(log_tail: Sequence[str]) -> str:
    """SGLang's own argparse message (usage + error lines) from the log tail, for the operator."""
    lines = [
        line for line in log_tail if (m := read_mark(line)) and m.mark is LogMark.ARGPARSE_ERROR
    ]
    return "\n".join(lines[-3:])


def classify(
    exit_code: int | None,
    signal_number: int | None,
    log_tail: Sequence[str],
    context: DeathContext,
) -> Classification:
    """Name the failure and give the operator a hint.

    `exit_code`/`signal_number` describe the server's main process (both None when the
    supervisor killed a live tree); `log_tail` is the last lines of its output, redacted.
    """
    if context.override is not None:
        detail = f": {context.override_detail}" if context.override_detail else ""
        return Classification(context.override, _HINTS[context.override] + detail)
    marks = marks_in(list(log_tail))
    kinds = {m.mark for m in marks}
    exited_by_itself = not context.killed_by_us and (
        exit_code is not None or signal_number is not None
    )
    # Only SGLang's argparse says "bad flags": a rank that died at init with status 2 ("Rank 0
    # scheduler died during initialization (exit code: 2)") is a crash, retried.
    if exited_by_itself and exit_code == 2 and LogMark.ARGPARSE_ERROR in kinds:
        message = argparse_message(log_tail)
        suffix = f": {message}" if message else ""
        return Classification(FailureKind.BAD_FLAGS, _HINTS[FailureKind.BAD_FLAGS] + suffix)
    if LogMark.PORT_IN_USE in kinds:
        return _plain(FailureKind.PORT_IN_USE)
    if LogMark.GPU_OOM in kinds and not context.was_ready:
        return _plain(FailureKind.GPU_OOM_AT_LOAD)
    if kernel_oom_killed(context):
        return _plain(FailureKind.KERNEL_OOM_KILLED)
    if LogMark.WARMUP_FAILED in kinds:
        hint = "SGLang's warm-up request failed and it killed its own tree (log lines above)"
        status = describe_exit(exit_code, signal_number)
        return Classification(FailureKind.EXITED_UNEXPECTEDLY, f"{hint} ({status})")
    if not context.was_ready and _died_of_sigbus(marks, exited_by_itself, signal_number):
        kind = context.observed or (
            FailureKind.RANK_CRASH if kinds & CRASH_MARKS else FailureKind.EXITED_UNEXPECTEDLY
        )
        return Classification(kind, f"{_SIGBUS_HINT} ({describe_exit(exit_code, signal_number)})")
    crashed = bool(kinds & CRASH_MARKS or LogMark.GPU_OOM in kinds)
    seen = context.observed or (FailureKind.RANK_CRASH if crashed else None)
    if exited_by_itself and killed_itself(signal_number, marks):
        hint = self_kill_hint(log_tail, context)
        return Classification(seen or FailureKind.EXITED_UNEXPECTEDLY, hint)
    if seen is not None:
        return _plain(seen)
    hint = _HINTS[FailureKind.EXITED_UNEXPECTEDLY]
    if kinds & {LogMark.HOST_MEMORY_REFUSED, LogMark.PINNING_FAILED}:
        hint = (
            "SGLang could not allocate or pin its host KV pool: lower --hicache-size "
            "(see `sglang-supervisor preflight`)"
        )
    elif exited_by_itself and signal_number == _SIGKILL:
        hint = _unexplained_sigkill_hint(context)
    status = describe_exit(exit_code, signal_number)
    return Classification(FailureKind.EXITED_UNEXPECTEDLY, f"{hint} ({status})")


def _plain(kind: FailureKind) -> Classification:
    return Classification(kind, _HINTS[kind])


def _died_of_sigbus(
    marks: Sequence[MarkedLine], exited_by_itself: bool, signal_number: int | None
) -> bool:
    """The main process, a rank (SGLang's "exit code: -7"), or faulthandler says SIGBUS."""
    if exited_by_itself and signal_number == _SIGBUS:
        return True
    return any(
        m.mark is LogMark.BUS_ERROR
        or (
            m.mark in (LogMark.RANK_DIED_AT_INIT, LogMark.SUBPROCESS_CRASHED)
            and m.exit_code == -_SIGBUS
        )
        for m in marks
    )


def kernel_oom_killed(context: DeathContext) -> bool:
    """The kernel says it OOM-killed: the tree's own count when known, else the host's. With
    neither, no: a SIGKILL, even a rank's "exit code: -9", is no evidence of the OOM killer."""
    if context.tree_oom_kills is not None:
        return context.tree_oom_kills > 0
    return context.oom_kills is not None and context.oom_kills > 0


# What SGLang's main process logs on its way to SIGKILLing itself after a child failed: the
# SubprocessWatchdog's "Subprocess … crashed with exit code …" (utils/watchdog.py, which then
# SIGQUITs itself), a SIGQUIT handler's line (entrypoints/engine.py, tokenizer_manager.py), and
# kill_process_tree's own line naming itself with include_parent=True (utils/common.py).
_SELF_KILL_MARKS = frozenset({LogMark.SUBPROCESS_CRASHED, LogMark.SIGQUIT, LogMark.KILLS_OWN_TREE})
# The child's failure, as SGLang's main process or the child itself logged it.
_CHILD_FAILURE_MARKS = frozenset(
    {LogMark.SCHEDULER_EXCEPTION, LogMark.RANK_DIED_AT_INIT, LogMark.SUBPROCESS_CRASHED}
)
_QUOTED_CHARS = 300


def killed_itself(signal_number: int | None, marks: Sequence[MarkedLine]) -> bool:
    """SGLang's main process died of its own SIGKILL after a child failed (its log says so)."""
    return signal_number == _SIGKILL and any(m.mark in _SELF_KILL_MARKS for m in marks)


def self_kill_hint(log_tail: Sequence[str], context: DeathContext) -> str:
    """Names SGLang's self-kill and quotes the child's failure and the last exception logged."""
    child = next(
        (line for line in log_tail if (m := read_mark(line)) and m.mark in _CHILD_FAILURE_MARKS),
        None,
    )
    error = next((line for line in reversed(log_tail) if _is_exception_line(line)), None)
    quoted = [clip_line(line.strip(), _QUOTED_CHARS) for line in (child, error) if line]
    said = f": {' / '.join(quoted)}" if quoted else ""
    return (
        "SGLang's main process killed its own tree after a child failed (kill_process_tree on "
        f"itself: the SIGKILL, status 137, is SGLang's own; {_kernel_said(context)}); the "
        f"server log lines above say why{said}"
    )


def _is_exception_line(line: str) -> bool:
    """The last line of a Python traceback: "RuntimeError: Found no NVIDIA driver on your …"."""
    name, sep, message = line.strip().partition(": ")
    dotted = name.replace(".", "").replace("_", "")
    return bool(sep and message and dotted.isalnum() and name.endswith(("Error", "Exception")))


def _kernel_said(context: DeathContext) -> str:
    if context.tree_oom_kills is None and context.oom_kills is None:
        return "the kernel's OOM-kill counters could not be read: check `dmesg` for an OOM kill"
    return "the kernel counted no OOM kill during the run"


def _unexplained_sigkill_hint(context: DeathContext) -> str:
    return (
        "the server's main process was SIGKILLed by neither the supervisor nor SGLang itself "
        f"(another process or an operator), and {_kernel_said(context)}"
    )
