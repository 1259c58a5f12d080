"""Which /dev/shm segments are a dead tree's of ours: SGLang's names, our members, their age."""

from __future__ import annotations

import hashlib

import pytest

from supervisor.core.shm import (
    Member,
    Segment,
    creator_pid,
    is_candidate,
    is_unstamped,
    left_by,
)


@pytest.mark.parametrize(
    ("name", "pid"),
    [
        ("sgl_shm_mq_4242_0a1b2c3d", 4242),
        ("sgl_shm_node_check_77_deadbeef", 77),  # a kind with "_" in it
        ("sgl_shm_12_abcd", 12),
        ("multi_tokenizer_args_900", 900),
        ("sgl_shm_mq_0_0a1b2c3d", None),  # 0 and below name process groups, not a process
        ("sgl_shm_mq_x12_0a1b2c3d", None),
        ("sgl_shm_mq", None),
        ("nccl-1234", None),  # pid-less families are never ours to judge
        ("psm_4242", None),
    ],
)
def test_the_creator_pid_is_read_as_sglang_writes_it(name: str, pid: int | None):
    assert creator_pid(name) == pid


def seg(name: str, made_at_s: float = 1000.0) -> Segment:
    return Segment(name=name, size_bytes=4096, made_at_s=made_at_s)


def test_only_segments_of_dead_members_made_since_they_started_are_left_by_the_tree():
    members = {
        10: Member(pid=10, start_ticks=1, started_at_s=900.0),  # dead
        11: Member(pid=11, start_ticks=2, started_at_s=900.0),  # alive
        12: Member(pid=12, start_ticks=3, started_at_s=1100.0),  # dead, started after segment
    }
    alive = {(11, 2)}
    segments = [
        seg("sgl_shm_mq_10_aaaa"),
        seg("sgl_shm_mq_11_bbbb"),
        seg("sgl_shm_mq_12_cccc"),  # made by an earlier process that had PID 12
        seg("sgl_shm_mq_13_dddd"),  # not a member
        seg("other_10"),
    ]
    left = left_by(segments, members, lambda pid, ticks: (pid, ticks) in alive)
    assert [s.name for s in left] == ["sgl_shm_mq_10_aaaa"]


def test_a_member_s_reused_pid_does_not_protect_its_segments():
    members = {10: Member(pid=10, start_ticks=1, started_at_s=900.0)}
    # PID 10 runs again, with another start time: ours is gone.
    left = left_by([seg("sgl_shm_mq_10_aaaa")], members, lambda pid, ticks: ticks == 99)
    assert len(left) == 1


def test_a_rank_never_seen_leaves_segments_that_go_when_its_pid_is_no_process_now():
    """A scheduler that failed at init between two /proc scans: its PID is not a member."""
    members = {10: Member(pid=10, start_ticks=1, started_at_s=900.0)}  # the main process
    existing = {10, 14}
    segments = [
        seg("sgl_shm_mq_13_aaaa", made_at_s=950.0),  # made during the tree's life, 13 is gone
        seg("sgl_shm_mq_14_bbbb", made_at_s=950.0),  # 14 lives: maybe another server's rank
        seg("sgl_shm_mq_15_cccc", made_at_s=850.0),  # made before our tree began
        seg("nccl-13", made_at_s=950.0),  # no PID in its name: never judged
    ]
    left = left_by(segments, members, lambda pid, ticks: pid in existing, existing.__contains__)
    assert [s.name for s in left] == ["sgl_shm_mq_13_aaaa"]


def test_without_a_process_table_only_members_segments_are_judged():
    members = {10: Member(pid=10, start_ticks=1, started_at_s=900.0)}
    assert left_by([seg("sgl_shm_mq_13_aaaa")], members, lambda pid, ticks: False) == ()


# -- the families without a PID: SGLang's load snapshot, multiprocessing's semaphores ----------

LOADS = "sglang_loads_4c00ec5647f7_{}.shm"


def loads_name(instance: str = "4c00ec5647f7") -> str:
    """As managers/load_snapshot.py `shm_path_for` names it (blake2s, 4 bytes)."""
    digest = hashlib.blake2s(instance.encode(), digest_size=4).hexdigest()
    return f"sglang_loads_{instance}_{digest}.shm"


@pytest.mark.parametrize(
    ("name", "ours"),
    [
        (loads_name(), True),
        (LOADS.format("deadbeef"), False),  # a hash SGLang would not have made
        ("sem.mp-k2x9_q0a", True),
        ("sem.mp-short", False),
        ("sem.loky-1234-abcd", False),  # joblib's, never made by SGLang's tree
        ("sem.mp-K2X9Q0AB", False),
    ],
)
def test_unstamped_names_are_recognised_only_in_the_form_sglang_and_python_write(name, ours):
    assert is_unstamped(name) is ours
    assert is_candidate(name) is ours


def test_an_unstamped_file_goes_when_made_during_the_trees_life_and_held_by_nobody():
    members = {10: Member(pid=10, start_ticks=1, started_at_s=900.0)}
    held = {"sem.mp-held0000"}
    segments = [
        seg(loads_name()),  # made at 1000, held by nobody: the dead tree's
        seg("sem.mp-ours0000"),
        seg("sem.mp-held0000"),  # mapped by a live process (another server's lock)
        seg("sem.mp-early000", made_at_s=800.0),  # before our tree started
        seg(loads_name("0123456789ab"), made_at_s=899.0),
    ]
    stale = left_by(segments, members, lambda *_: False, lambda _pid: True, held.__contains__)
    assert {s.name for s in stale} == {loads_name(), "sem.mp-ours0000"}


def test_without_a_holder_check_no_unstamped_file_is_judged():
    members = {10: Member(pid=10, start_ticks=1, started_at_s=900.0)}
    assert left_by([seg(loads_name())], members, lambda *_: False, lambda _pid: False) == ()
    assert left_by([seg(loads_name())], {}, lambda *_: False, None, lambda _n: False) == ()
