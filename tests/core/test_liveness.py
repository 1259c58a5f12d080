"""Rank liveness from the server tree: expected schedulers, missing, zombie, stopped."""

from __future__ import annotations

import pytest

from supervisor.core.liveness import (
    RankProblem,
    is_scheduler_title,
    judge_ranks,
)
from supervisor.core.readings import ProcessInfo


def proc(pid: int, title: str, state: str = "S") -> ProcessInfo:
    return ProcessInfo(pid=pid, ppid=1, pgid=1, state=state, title=title)


def test_all_schedulers_alive_is_ok_and_other_processes_do_not_count():
    tree = [
        proc(1, "python -m sglang.launch_server"),
        proc(2, "sglang::scheduler_TP0"),
        proc(3, "sglang::scheduler_TP1"),
        proc(4, "sglang::detokenizer"),
    ]
    verdict = judge_ranks(tree, expected=2, all_seen_before=False)
    assert verdict.problem is RankProblem.OK
    assert not verdict.is_dead


def test_a_missing_rank_is_dead_only_once_all_were_seen():
    tree = [proc(2, "sglang::scheduler_TP0")]
    assert judge_ranks(tree, expected=2, all_seen_before=False).problem is RankProblem.NOT_YET
    verdict = judge_ranks(tree, expected=2, all_seen_before=True)
    assert verdict.problem is RankProblem.MISSING
    assert verdict.is_dead
    assert "1 of 2" in verdict.detail


def test_a_zombie_rank_is_dead_even_by_its_truncated_comm():
    # A zombie has no cmdline: only the 15-byte comm set by setproctitle is left.
    tree = [proc(2, "sglang::scheduler_TP0"), proc(3, "sglang::schedul", state="Z")]
    verdict = judge_ranks(tree, expected=2, all_seen_before=False)
    assert verdict.problem is RankProblem.ZOMBIE
    assert verdict.pids == (3,)


@pytest.mark.parametrize("state", ["T", "t"])
def test_a_stopped_rank_is_dead(state):
    tree = [proc(2, "sglang::scheduler_TP0", state=state), proc(3, "sglang::scheduler_TP1")]
    verdict = judge_ranks(tree, expected=2, all_seen_before=True)
    assert verdict.problem is RankProblem.STOPPED
    assert verdict.pids == (2,)


def test_titles():
    assert is_scheduler_title("sglang::scheduler_DP0_TP0_EP0")
    assert not is_scheduler_title("sglang::detokenizer")
    assert not is_scheduler_title("python sglang::scheduler")


@pytest.mark.parametrize(
    ("status", "words"),
    [(9, "killed by signal 9"), (1 << 8, "exited with status 1")],
)
def test_a_rank_seen_the_moment_it_died_is_a_death_not_a_zombie(status, words):
    """Its pidfd wakes us before SGLang reaps it: the wait status says how it ended."""
    dead = ProcessInfo(
        pid=11, ppid=1, pgid=1, state="Z", title="sglang::scheduler_TP1", exit_status=status
    )
    verdict = judge_ranks([proc(10, "sglang::scheduler_TP0"), dead], 2, True)
    assert verdict.problem is RankProblem.DIED
    assert verdict.detail == f"scheduler pid 11 {words}"
    unreaped = ProcessInfo(
        pid=11, ppid=1, pgid=1, state="Z", title="sglang::scheduler_TP1", exit_status=0
    )
    assert judge_ranks([unreaped], 2, True).problem is RankProblem.ZOMBIE
