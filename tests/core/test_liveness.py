"""Rank liveness from the server tree: expected schedulers, missing, zombie, stopped."""

from __future__ import annotations

import pytest

from supervisor.core.liveness import (
    RankProblem,
    is_scheduler_title,
    judge_ranks,
)
from supervisor.core.readings import ProcessInfo

MAIN = ProcessInfo(pid=1, ppid=0, pgid=1, state="S", title="python -m sglang.launch_server")


def proc(pid: int, title: str, state: str = "S", ppid: int = 1) -> ProcessInfo:
    return ProcessInfo(pid=pid, ppid=ppid, pgid=1, state=state, title=title)


def test_all_schedulers_alive_is_ok_and_other_processes_do_not_count():
    tree = [
        MAIN,
        proc(2, "sglang::scheduler_TP0"),
        proc(3, "sglang::scheduler_TP1"),
        proc(4, "sglang::detokenizer"),
    ]
    verdict = judge_ranks(tree, expected=2, all_seen_before=False)
    assert verdict.problem is RankProblem.OK
    assert not verdict.is_dead


def test_a_missing_rank_is_dead_only_once_all_were_seen():
    tree = [MAIN, proc(2, "sglang::scheduler_TP0")]
    assert judge_ranks(tree, expected=2, all_seen_before=False).problem is RankProblem.NOT_YET
    verdict = judge_ranks(tree, expected=2, all_seen_before=True)
    assert verdict.problem is RankProblem.MISSING
    assert verdict.is_dead
    assert "1 of 2 scheduler ranks alive" in verdict.detail


def test_a_zombie_rank_is_dead_even_by_its_truncated_comm():
    # A zombie has no cmdline: only the 15-byte comm set by setproctitle is left.
    tree = [MAIN, proc(2, "sglang::scheduler_TP0"), proc(3, "sglang::schedul", state="Z")]
    verdict = judge_ranks(tree, expected=2, all_seen_before=False)
    assert verdict.problem is RankProblem.ZOMBIE
    assert verdict.pids == (3,)


@pytest.mark.parametrize("state", ["T", "t"])
def test_a_stopped_rank_is_dead(state):
    tree = [
        MAIN,
        proc(2, "sglang::scheduler_TP0", state=state),
        proc(3, "sglang::scheduler_TP1"),
    ]
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
    verdict = judge_ranks([MAIN, proc(10, "sglang::scheduler_TP0"), dead], 2, True)
    assert verdict.problem is RankProblem.DIED
    assert verdict.detail == f"scheduler pid 11 {words}"
    unreaped = ProcessInfo(
        pid=11, ppid=1, pgid=1, state="Z", title="sglang::scheduler_TP1", exit_status=0
    )
    assert judge_ranks([MAIN, unreaped], 2, True).problem is RankProblem.ZOMBIE


# -- the init-time fork (a scheduler's subprocess carries its title until it execs) ---------


def _old_judging(tree: list[ProcessInfo], expected: int, all_seen: bool) -> str:
    """The judging before ranks had to be children of the main process: every live process
    titled like a scheduler counted, one per process."""
    alive = sum(1 for p in tree if is_scheduler_title(p.title) and not p.is_zombie)
    if alive < expected:
        return "missing" if all_seen else "not_yet"
    return "ok"


def test_a_schedulers_forked_child_is_no_rank_and_the_old_judging_called_it_a_death():
    """Read from a TP 2 server as it loaded: TP0 ran a subprocess (pid 20, still titled like
    TP0) before TP1 (pid 3, just spawned) had set its title; 13 ms later the child was gone."""
    forked = [
        MAIN,
        proc(2, "sglang::scheduler_TP0"),
        proc(20, "sglang::scheduler_TP0", ppid=2),
        proc(3, "python -c from multiprocessing.spawn import spawn_main"),
    ]
    after = [MAIN, proc(2, "sglang::scheduler_TP0"), proc(3, forked[3].title)]
    # Then: "2 of 2" set all ranks seen, and the child's exit read as a rank's death.
    assert _old_judging(forked, 2, all_seen=False) == "ok"
    assert _old_judging(after, 2, all_seen=True) == "missing"
    # Now: one rank, still starting, at both readings.
    first = judge_ranks(forked, expected=2, all_seen_before=False)
    assert (first.problem, first.alive) == (RankProblem.NOT_YET, 1)
    assert judge_ranks(after, 2, all_seen_before=False).problem is RankProblem.NOT_YET


def test_a_forked_childs_zombie_or_stop_is_not_a_ranks():
    tree = [
        MAIN,
        proc(2, "sglang::scheduler_TP0"),
        proc(3, "sglang::scheduler_TP1"),
        proc(20, "sglang::schedul", state="Z", ppid=2),  # exited, not yet reaped by TP0
        proc(21, "sglang::scheduler_TP1", state="T", ppid=3),
    ]
    dead = ProcessInfo(pid=22, ppid=3, pgid=1, state="Z", title="sglang::schedul", exit_status=9)
    verdict = judge_ranks([*tree, dead], expected=2, all_seen_before=True)
    assert verdict.problem is RankProblem.OK


def test_ranks_are_counted_by_suffix_not_by_process():
    """Two live processes with one rank's title are one rank: the other rank is missing."""
    tree = [MAIN, proc(2, "sglang::scheduler_TP0"), proc(3, "sglang::scheduler_TP0")]
    verdict = judge_ranks(tree, expected=2, all_seen_before=True)
    assert (verdict.problem, verdict.alive) == (RankProblem.MISSING, 1)


def test_a_scheduler_whose_parent_left_the_tree_is_no_rank():
    """Reparented to the supervisor (not a member): a rank's child whose parent died."""
    tree = [MAIN, proc(2, "sglang::scheduler_TP0"), proc(20, "sglang::scheduler_TP1", ppid=99)]
    assert judge_ranks(tree, 2, all_seen_before=True).problem is RankProblem.MISSING


def test_the_dp_controller_and_a_wrapper_are_parents_of_ranks():
    """Plain --dp-size: the controller spawns the schedulers. A wrapper of the server command
    (here a shell) sits above SGLang's main process, which is then no direct child of ours."""
    wrapper = ProcessInfo(pid=1, ppid=0, pgid=1, state="S", title="/bin/sh ./serve.sh")
    main = proc(5, "python -m sglang.launch_server --dp-size 2")
    controller = proc(6, "sglang::data_parallel_controller   ", ppid=5)
    tree = [
        wrapper,
        main,
        controller,
        proc(7, "sglang::scheduler_DP0", ppid=6),
        proc(8, "sglang::scheduler_DP1", ppid=6),
        proc(9, "sglang::scheduler_DP1", ppid=8),  # DP1's forked child
        proc(10, "sglang::detokenizer", ppid=5),
    ]
    verdict = judge_ranks(tree, expected=2, all_seen_before=True)
    assert (verdict.problem, verdict.alive) == (RankProblem.OK, 2)


def test_space_padded_titles_are_stripped():
    """setproctitle pads the argv area: /proc/PID/cmdline ends in spaces."""
    assert is_scheduler_title("sglang::scheduler_TP1" + " " * 40)
    tree = [
        MAIN,
        proc(2, "sglang::scheduler_TP0      "),
        proc(3, "sglang::scheduler_TP0"),
        proc(4, "sglang::scheduler_TP1    "),
    ]
    verdict = judge_ranks(tree, expected=2, all_seen_before=True)
    assert (verdict.problem, verdict.alive) == (RankProblem.OK, 2)
