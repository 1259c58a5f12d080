"""Rank liveness: which `sglang::scheduler*` processes a launch should have, and whether the
ones found in the server tree are all alive (not missing, zombie `Z` or stopped `T`).

Pure: fed with the LaunchPlan and the ProcessInfo list the procfs adapter read. HTTP can keep
answering after a scheduler died (sglang #6624), so this check runs at every tick.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from supervisor.core.readings import ProcessInfo
from supervisor.core.sglang_args import LaunchPlan

SCHEDULER_PREFIX = "sglang::scheduler"
# setproctitle also sets /proc/PID/comm, cut to 15 bytes (TASK_COMM_LEN 16). A zombie has an
# empty cmdline, so the comm is all that is left of its title.
_SCHEDULER_COMM = SCHEDULER_PREFIX[:15]
SGLANG_TITLE_PREFIX = "sglang::"


def is_scheduler_title(title: str) -> bool:
    return title.startswith(SCHEDULER_PREFIX) or title == _SCHEDULER_COMM


def is_sglang_title(title: str) -> bool:
    """Any of SGLang's titled subprocesses (scheduler, detokenizer, DP controller, workers)."""
    return title.startswith(SGLANG_TITLE_PREFIX)


def expected_scheduler_titles(plan: LaunchPlan) -> tuple[str, ...]:
    """The titles SGLang gives the local schedulers (sglang.md §3): `sglang::scheduler` plus
    `_DP{d}` (data parallel), `_PP{p}` (pp > 1), `_TP{t}` (tp > 1), `_EP{e}` (ep > 1).

    Used for messages; the liveness verdict counts processes by prefix so that a title format
    change in SGLang does not read as dead ranks.
    """
    dp_titled = plan.dp_size > 1 or plan.enable_dp_attention or plan.attn_dp_size > 1
    tp_per_node = max(1, plan.tp_size // plan.nnodes) if plan.pp_size == 1 else plan.tp_size
    pp_per_node = max(1, plan.pp_size // plan.nnodes) if plan.pp_size > 1 else 1
    tp_offset = plan.node_rank * tp_per_node if plan.pp_size == 1 else 0
    pp_offset = plan.node_rank * pp_per_node if plan.pp_size > 1 else 0
    titles: list[str] = []
    for dp in range(plan.data_parallel_replicas):
        for pp in range(pp_offset, pp_offset + pp_per_node):
            for tp in range(tp_offset, tp_offset + tp_per_node):
                suffix = ""
                if dp_titled:
                    suffix += (
                        f"_DP{dp if plan.data_parallel_replicas > 1 else _attn_dp_rank(plan, tp)}"
                    )
                if plan.pp_size > 1:
                    suffix += f"_PP{pp}"
                if plan.tp_size > 1:
                    suffix += f"_TP{tp}"
                if plan.ep_size > 1:
                    suffix += f"_EP{tp // max(1, plan.tp_size // plan.ep_size)}"
                titles.append(SCHEDULER_PREFIX + suffix)
    return tuple(titles)


def _attn_dp_rank(plan: LaunchPlan, tp_rank: int) -> int:
    """DP attention: the tp ranks are split into attention-DP groups of tp / attn_dp each."""
    attn_dp = plan.attn_dp_size if plan.attn_dp_size > 1 else plan.dp_size
    return tp_rank // max(1, plan.tp_size // max(1, attn_dp))


class RankProblem(str, Enum):
    OK = "ok"
    NOT_YET = "not_yet"  # fewer than expected, but not all were ever seen (still starting)
    MISSING = "missing"
    ZOMBIE = "zombie"
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
        return self.problem in (RankProblem.MISSING, RankProblem.ZOMBIE, RankProblem.STOPPED)


def judge_ranks(
    processes: Iterable[ProcessInfo], expected: int, all_seen_before: bool
) -> RankVerdict:
    """Judge the scheduler processes of one server tree.

    `all_seen_before`: the full set has been alive at some earlier tick (or the server answered
    ready). Until then, fewer schedulers than expected means they are still being spawned.
    """
    schedulers = [p for p in processes if is_scheduler_title(p.title)]
    zombies = tuple(p.pid for p in schedulers if p.is_zombie)
    stopped = tuple(p.pid for p in schedulers if p.is_stopped)
    alive = sum(1 for p in schedulers if not p.is_zombie and p.state != "X")
    if zombies:
        return RankVerdict(
            problem=RankProblem.ZOMBIE,
            expected=expected,
            alive=alive,
            pids=zombies,
            detail=f"scheduler pid {', '.join(map(str, zombies))} is a zombie (Z)",
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
            detail=f"{alive} of {expected} scheduler processes alive",
        )
    return RankVerdict(problem=RankProblem.OK, expected=expected, alive=alive)
