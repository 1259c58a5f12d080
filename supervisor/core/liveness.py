"""Rank liveness: whether the `sglang::scheduler*` ranks found in the server tree are all there
and alive (not missing, zombie `Z` or stopped `T`).

Pure: fed with the expected count and the ProcessInfo list the procfs adapter read. HTTP can keep
answering after a scheduler died (sgl-project/sglang #6624), so this check runs at every tick.

A process titled like a scheduler is a rank only when its parent is SGLang's main process or its
DP controller. A scheduler runs subprocesses while it initialises (utils/common.py
`parse_lscpu_topology` runs lscpu on CPU, `get_device_sm_nvidia_smi` nvidia-smi), and a forked
child carries its parent's title until it execs: counted as a rank, it made "2 of 2" out of one
rank, and "1 of 2" a death once it exited. The main process keeps its command line (SGLang
titles only its subprocesses) and may sit below a wrapper of the server command, so the parent
is recognised by its title, not by PID: a tree member without an SGLang title, or the
`sglang::data_parallel_controller`. Ranks are counted by their title's rank suffix
(`_DP0_TP1`, managers/scheduler.py `configure_scheduler_process`), one per suffix, not per
process.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from supervisor.core.readings import ProcessInfo
from supervisor.core.sglang_facts import DP_CONTROLLER_TITLE, TITLE_PREFIX
from supervisor.core.sglang_facts import SCHEDULER_TITLE_PREFIX as SCHEDULER_PREFIX

# setproctitle also sets /proc/PID/comm, cut to 15 bytes (TASK_COMM_LEN 16). A zombie has an
# empty cmdline, so the comm is all that is left of its title.
_SCHEDULER_COMM = SCHEDULER_PREFIX[:15]


def clean_title(title: str) -> str:
    """A title as SGLang set it: setproctitle pads the rest of the argv area with spaces."""
    return title.strip()


def is_scheduler_title(title: str) -> bool:
    title = clean_title(title)
    return title.startswith(SCHEDULER_PREFIX) or title == _SCHEDULER_COMM


def rank_key(info: ProcessInfo) -> str:
    """What names one rank: its title's suffix ("" at TP 1). A bare comm names no rank, so each
    process known only by it counts on its own."""
    title = clean_title(info.title)
    if title == _SCHEDULER_COMM:
        return f"pid {info.pid}"
    return title.removeprefix(SCHEDULER_PREFIX)


def ranks_of(processes: Sequence[ProcessInfo]) -> list[ProcessInfo]:
    """The scheduler processes that are ranks: their parent is a member of the tree that is
    SGLang's main process (no SGLang title) or its DP controller."""
    titles = {p.pid: clean_title(p.title) for p in processes}

    def launches_ranks(pid: int) -> bool:
        title = titles.get(pid)
        if title is None:
            return False  # reparented: its parent is gone, or it is no child of the tree
        return not title.startswith(TITLE_PREFIX) or title == DP_CONTROLLER_TITLE

    return [p for p in processes if is_scheduler_title(p.title) and launches_ranks(p.ppid)]


class RankProblem(str, Enum):
    OK = "ok"
    NOT_YET = "not_yet"  # fewer than expected, but not all were ever seen (still starting)
    MISSING = "missing"
    DIED = "died"  # a scheduler exited non-zero or by a signal; its parent has not reaped it yet
    ZOMBIE = "zombie"  # a scheduler exited 0 (or we cannot tell) and sits unreaped
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True, kw_only=True)
class RankVerdict:
    problem: RankProblem
    expected: int
    alive: int
    pids: tuple[int, ...] = ()  # the schedulers at fault (zombie/stopped)
    detail: str = ""

    @property
    def is_dead(self) -> bool:
        return self.problem in (
            RankProblem.MISSING,
            RankProblem.DIED,
            RankProblem.ZOMBIE,
            RankProblem.STOPPED,
        )


def judge_ranks(
    processes: Iterable[ProcessInfo], expected: int, all_seen_before: bool
) -> RankVerdict:
    """Judge the scheduler ranks of one server tree (`ranks_of`), counted by rank suffix.

    `all_seen_before`: the full set has been alive at some earlier tick (or the server answered
    ready). Until then, fewer schedulers than expected means they are still being spawned.
    """
    tree = tuple(processes)
    schedulers = ranks_of(tree)
    died = [p for p in schedulers if p.is_zombie and p.exit_status]
    zombies = tuple(p.pid for p in schedulers if p.is_zombie and not p.exit_status)
    stopped = tuple(p.pid for p in schedulers if p.is_stopped)
    alive = len({rank_key(p) for p in schedulers if not p.is_zombie and p.state != "X"})
    if died:
        # Seen the moment it exits (its pidfd), before SGLang reaps it: a death, not a zombie.
        return RankVerdict(
            problem=RankProblem.DIED,
            expected=expected,
            alive=alive,
            pids=tuple(p.pid for p in died),
            detail="; ".join(f"scheduler pid {p.pid} {describe_wait(p.exit_status)}" for p in died),
        )
    if zombies:
        return RankVerdict(
            problem=RankProblem.ZOMBIE,
            expected=expected,
            alive=alive,
            pids=zombies,
            detail=f"scheduler {_named(zombies, tree)} is a zombie (Z)",
        )
    if stopped:
        return RankVerdict(
            problem=RankProblem.STOPPED,
            expected=expected,
            alive=alive,
            pids=stopped,
            detail=f"scheduler pid {', '.join(map(str, stopped))} is stopped (T)",
        )
    if alive < expected:
        problem = RankProblem.MISSING if all_seen_before else RankProblem.NOT_YET
        return RankVerdict(
            problem=problem,
            expected=expected,
            alive=alive,
            detail=f"{alive} of {expected} scheduler ranks alive",
        )
    return RankVerdict(problem=RankProblem.OK, expected=expected, alive=alive)


def _named(pids: Sequence[int], tree: Sequence[ProcessInfo]) -> str:
    """Each PID with its title and its parent's: which process was judged, and why a rank."""
    info = {p.pid: p for p in tree}

    def one(pid: int) -> str:
        me = info[pid]
        parent = info.get(me.ppid)
        above = f"{parent.pid} {clean_title(parent.title)[:60]!r}" if parent else str(me.ppid)
        return f"pid {pid} {clean_title(me.title)[:40]!r} (parent {above})"

    return ", ".join(one(pid) for pid in pids)


def describe_wait(status: int | None) -> str:
    """A wait(2) status in words: "killed by signal 9" or "exited with status 1"."""
    if status is None:
        return "exited"
    if status & 0x7F:
        return f"killed by signal {status & 0x7F}"
    return f"exited with status {status >> 8}"
