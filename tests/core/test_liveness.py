"""Rank liveness from the server tree: expected schedulers, missing, zombie, stopped."""

from __future__ import annotations

import pytest

from supervisor.core.liveness import (
    RankProblem,
    expected_scheduler_titles,
    is_scheduler_title,
    judge_ranks,
)
from supervisor.core.readings import ProcessInfo
from supervisor.core.sglang_args import parse_launch_args


def proc(pid: int, title: str, state: str = "S") -> ProcessInfo:
    return ProcessInfo(pid=pid, ppid=1, pgid=1, state=state, title=title)


@pytest.mark.parametrize(
    ("argv", "titles"),
    [
        ([], ("sglang::scheduler",)),
        (["--tp", "2"], ("sglang::scheduler_TP0", "sglang::scheduler_TP1")),
        (
            ["--tp-size", "2", "--dp-size", "2"],
            (
                "sglang::scheduler_DP0_TP0",
                "sglang::scheduler_DP0_TP1",
                "sglang::scheduler_DP1_TP0",
                "sglang::scheduler_DP1_TP1",
            ),
        ),
        (
            ["--tp-size", "2", "--pp-size", "2"],
            (
                "sglang::scheduler_PP0_TP0",
                "sglang::scheduler_PP0_TP1",
                "sglang::scheduler_PP1_TP0",
                "sglang::scheduler_PP1_TP1",
            ),
        ),
        (
            ["--tp-size", "4", "--nnodes", "2", "--node-rank", "1"],
            ("sglang::scheduler_TP2", "sglang::scheduler_TP3"),
        ),
    ],
)
def test_expected_titles_follow_sglangs_naming(argv, titles):
    plan = parse_launch_args(argv)
    assert expected_scheduler_titles(plan) == titles
    assert len(titles) == plan.local_ranks


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
