"""Which /dev/shm segments are a dead tree's of ours: SGLang's names, our members, their age."""

from __future__ import annotations

import pytest

from supervisor.core.shm import Member, Segment, creator_pid, left_by


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
