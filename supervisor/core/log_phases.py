"""Recognise SGLang's log lines that mark a load phase or a crash (docs/sglang.md §4.1).

Pure substring matching on one line; SGLang refactors fast, so only stable phrases are used and
an unknown line is simply not a mark. Used for load progress, log events and failure classes.
Every line the server prints may pass through here: each pattern runs in time linear in the
line (the shape core/redact.py describes), a gap between two phrases is bounded or found with
str.find, never with an unbounded `.*` that would rescan the line from every start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class LogMark(str, Enum):
    """What a line says about the server, when it says anything."""

    MEMORY_BASELINE = "memory_baseline"  # pre-load GPU baseline taken
    WEIGHTS_LOAD_BEGIN = "weights_load_begin"
    WEIGHTS_LOADED = "weights_loaded"
    KV_CACHE_ALLOCATED = "kv_cache_allocated"
    HOST_POOL_ALLOCATED = "host_pool_allocated"
    HICACHE_AUTO_SIZED = "hicache_auto_sized"
    GRAPH_CAPTURE_BEGIN = "graph_capture_begin"  # "Capture target decode CUDA graph begin."
    GRAPH_CAPTURE_END = "graph_capture_end"
    READY = "ready"  # warm-up passed
    # Failures
    HOST_MEMORY_REFUSED = "host_memory_refused"  # SGLang's own host-memory check (§1.6)
    PINNING_FAILED = "pinning_failed"
    GPU_OOM = "gpu_oom"
    PORT_IN_USE = "port_in_use"
    ARGPARSE_ERROR = "argparse_error"
    SCHEDULER_EXCEPTION = "scheduler_exception"
    SUBPROCESS_CRASHED = "subprocess_crashed"
    RANK_DIED_AT_INIT = "rank_died_at_init"
    SIGQUIT = "sigquit"
    WARMUP_FAILED = "warmup_failed"  # SGLang's warm-up request failed; it killed its own tree
    # utils/common.py kill_process_tree's first line, called by a process on itself with
    # include_parent=True: it SIGKILLs its descendants and then itself (status -9, rc 137).
    KILLS_OWN_TREE = "kills_own_tree"
    BUS_ERROR = "bus_error"  # a process died of SIGBUS (Python's faulthandler said so)


CRASH_MARKS = frozenset(
    {
        LogMark.SCHEDULER_EXCEPTION,
        LogMark.SUBPROCESS_CRASHED,
        LogMark.RANK_DIED_AT_INIT,
        LogMark.SIGQUIT,
    }
)
LOAD_MARKS = frozenset(
    {
        LogMark.MEMORY_BASELINE,
        LogMark.WEIGHTS_LOAD_BEGIN,
        LogMark.WEIGHTS_LOADED,
        LogMark.KV_CACHE_ALLOCATED,
        LogMark.HOST_POOL_ALLOCATED,
        LogMark.HICACHE_AUTO_SIZED,
        LogMark.GRAPH_CAPTURE_BEGIN,
        LogMark.GRAPH_CAPTURE_END,
        LogMark.READY,
    }
)


@dataclass(frozen=True, slots=True)
class Phrase:
    """A lower-cased substring that marks a line, and who prints it: SGLang's own phrases are
    checked against every release by tests/contract; torch's and the OS's are not SGLang's."""

    text: str
    mark: LogMark
    origin: str = "sglang"  # sglang | torch | python | os


# Checked in order; the first match wins.
PHRASES: tuple[Phrase, ...] = (
    Phrase("memory baseline taken", LogMark.MEMORY_BASELINE),
    Phrase("load weight begin", LogMark.WEIGHTS_LOAD_BEGIN),
    Phrase("load weight end", LogMark.WEIGHTS_LOADED),
    Phrase("kv cache is allocated", LogMark.KV_CACHE_ALLOCATED),
    Phrase("hicache auto-sizing: ratio", LogMark.HICACHE_AUTO_SIZED),
    Phrase("the server is fired up and ready to roll", LogMark.READY),
    Phrase("not enough host memory available", LogMark.HOST_MEMORY_REFUSED),
    Phrase("cudahostregister failed", LogMark.PINNING_FAILED),
    Phrase("hiphostmalloc of", LogMark.PINNING_FAILED),
    Phrase("cuda out of memory", LogMark.GPU_OOM, "torch"),
    Phrase("outofmemoryerror", LogMark.GPU_OOM, "torch"),
    Phrase("loaded weights leave no gpu memory", LogMark.GPU_OOM),
    Phrase("not enough memory. please try to increase --mem-fraction-static", LogMark.GPU_OOM),
    Phrase("address already in use", LogMark.PORT_IN_USE, "os"),
    Phrase("[errno 98]", LogMark.PORT_IN_USE, "os"),
    Phrase("scheduler hit an exception", LogMark.SCHEDULER_EXCEPTION),
    Phrase("scheduler died during initialization", LogMark.RANK_DIED_AT_INIT),
    # The running phase's handler (tokenizer_manager.py) and the launch phase's (engine.py).
    Phrase("sigquit received", LogMark.SIGQUIT),
    Phrase("received sigquit from a child process", LogMark.SIGQUIT),
    Phrase("initialization failed. warmup error", LogMark.WARMUP_FAILED),
    # faulthandler's first line on SIGBUS; SGLang's schedulers enable it
    # (srt/managers/scheduler.py line 6295, in configure_scheduler_process).
    Phrase("fatal python error: bus error", LogMark.BUS_ERROR, "python"),
)
# "Allocating … hierarchical KV host pool: N tokens, X GB host memory." (found with str.find)
_HOST_POOL_WORDS = ("allocating ", "host pool")
# "Subprocess scheduler_3 (pid=…) crashed with exit code -9"
_SUBPROCESS_CRASH = re.compile(r"subprocess \S+ \(pid=\d+\) crashed with exit code", re.IGNORECASE)
# "kill_process_tree called: parent_pid=P, include_parent=True, pid=P" (utils/common.py
# kill_process_tree, line 2523 in 0.5.23): the same P twice is a process killing its own tree.
_KILL_OWN_TREE = re.compile(
    r"kill_process_tree called: parent_pid=(\d+), include_parent=True, pid=(\d+)"
)
# argparse: "launch_server.py: error: unrecognized arguments: --foo" / "error: argument --tp-size"
_ARGPARSE = re.compile(r"(^usage: )|(: error: (unrecognized arguments|argument |the following))")
_EXIT_CODE = re.compile(r"exit code:? *(-?\d+)", re.IGNORECASE)
# model_runner_components/cuda_graph_setup.py: "Capture {role} {decode|verify|prefill} CUDA graph
# begin. backend=…" and "… end. elapsed=…"; the speculative workers' draft graphs alike.
# The role and stage between "Capture" and "graph" are a few words: the gap is bounded.
_GRAPH_CAPTURE = re.compile(r"\bcapture [\w -]{0,80}?graph (begin|end)\.", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class MarkedLine:
    mark: LogMark
    exit_code: int | None = None  # for rank deaths: the rank's exit code when the line gives it


def read_mark(line: str) -> MarkedLine | None:
    """The mark of one log line, or None for an ordinary line."""
    if _ARGPARSE.search(line):
        return MarkedLine(LogMark.ARGPARSE_ERROR)
    if _SUBPROCESS_CRASH.search(line):
        return MarkedLine(LogMark.SUBPROCESS_CRASHED, _exit_code(line))
    if (own := _KILL_OWN_TREE.search(line)) is not None and own.group(1) == own.group(2):
        return MarkedLine(LogMark.KILLS_OWN_TREE)
    lowered = line.lower()
    if _host_pool(lowered) and "tokens" in lowered:
        return MarkedLine(LogMark.HOST_POOL_ALLOCATED)
    for phrase in PHRASES:
        if phrase.text in lowered:
            code = _exit_code(line) if phrase.mark is LogMark.RANK_DIED_AT_INIT else None
            return MarkedLine(phrase.mark, code)
    if graph := _GRAPH_CAPTURE.search(line):
        begins = graph.group(1).lower() == "begin"
        return MarkedLine(LogMark.GRAPH_CAPTURE_BEGIN if begins else LogMark.GRAPH_CAPTURE_END)
    return None


def _host_pool(lowered: str) -> bool:
    """ "allocating " and, later on the line, "host pool"."""
    first, then = _HOST_POOL_WORDS
    at = lowered.find(first)
    return at != -1 and lowered.find(then, at + len(first)) != -1


def _exit_code(line: str) -> int | None:
    match = _EXIT_CODE.search(line)
    return int(match.group(1)) if match else None


def marks_in(lines: tuple[str, ...] | list[str]) -> tuple[MarkedLine, ...]:
    """Every mark found in `lines`, in order."""
    return tuple(m for m in (read_mark(line) for line in lines) if m is not None)
