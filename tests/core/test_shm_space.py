"""/dev/shm: what a launch needs there (SGLang's segments as its 0.5.23 source sizes them, NCCL's
buffer per pair of GPUs) and the check of the free space against it."""

from __future__ import annotations

import pytest

from supervisor.core.checks import Status, check_shm
from supervisor.core.sglang_args import LaunchPlan, parse_launch_args
from supervisor.core.shm_space import ShmNeed, ShmSpace, launch_need

KiB, MiB, GiB = 1024, 1024**2, 1024**3
PAGE = 4096


def plan(*args: str) -> LaunchPlan:
    return parse_launch_args(["--model-path", "m", *args])


def pages(size: int) -> int:
    return (size + PAGE - 1) // PAGE * PAGE


# Written from SGLang's source, not from the product: ShmRingBuffer's size for the TP group's
# MessageQueue(max_chunk_bytes=1 << 22, max_chunks=6) with n local readers, and the load
# snapshot's header + one 16 KiB slot per DP rank.
def ring(local_readers: int) -> int:
    return pages(((1 << 22) + 1 + local_readers) * 6)


def load_snapshot(dp: int) -> int:
    return pages(12 + dp * 16 * KiB)


def test_one_gpu_needs_only_the_load_snapshot_and_no_nccl():
    need = launch_need(plan(), {})
    assert need.sglang_bytes == load_snapshot(1) == 20 * KiB
    assert need.nccl_bytes == 0


def test_tp8_needs_the_broadcast_queue_and_a_buffer_for_each_pair_each_way():
    need = launch_need(plan("--tp-size", "8"), {})
    assert need.sglang_bytes == load_snapshot(1) + ring(7)
    assert ring(7) == 25_169_920  # (4 MiB + 8) x 6, in whole pages: about 24 MiB
    assert need.nccl_bytes == 8 * 7 * 4 * MiB
    assert "1 TP broadcast queue(s) of 24.0 MiB" in need.parts


def test_plain_dp_replicas_each_have_their_queue_and_their_nccl_world():
    need = launch_need(plan("--tp-size", "2", "--dp-size", "2"), {})
    assert need.sglang_bytes == load_snapshot(2) + 2 * ring(1)
    assert need.nccl_bytes == 2 * (2 * 1) * 4 * MiB


def test_dp_attention_is_one_tp_group():
    need = launch_need(plan("--tp-size", "8", "--dp-size", "8", "--enable-dp-attention"), {})
    assert need.sglang_bytes == load_snapshot(8) + ring(7)


def test_tp_over_two_nodes_puts_the_queue_on_the_node_of_tp_rank_0_only():
    first = launch_need(plan("--tp-size", "16", "--nnodes", "2", "--node-rank", "0"), {})
    second = launch_need(plan("--tp-size", "16", "--nnodes", "2", "--node-rank", "1"), {})
    assert first.sglang_bytes == load_snapshot(1) + ring(7)
    assert second.sglang_bytes == load_snapshot(1)
    assert first.nccl_bytes == second.nccl_bytes == 8 * 7 * 4 * MiB


def test_pipeline_stages_on_one_node_each_have_a_queue():
    need = launch_need(plan("--tp-size", "4", "--pp-size", "2"), {})
    assert need.sglang_bytes == load_snapshot(1) + 2 * ring(3)
    assert need.nccl_bytes == 8 * 7 * 4 * MiB  # one NCCL world of 8 local ranks


def test_tokenizer_workers_add_their_arguments_segment_on_node_0():
    one = launch_need(plan("--tp-size", "2"), {})
    four = launch_need(plan("--tp-size", "2", "--tokenizer-worker-num", "4"), {})
    assert four.sglang_bytes - one.sglang_bytes == 256 * KiB


@pytest.mark.parametrize(
    ("env", "sglang", "nccl"),
    [
        ({"SGLANG_USE_MESSAGE_QUEUE_BROADCASTER": "false"}, load_snapshot(1), 8 * 7 * 4 * MiB),
        ({"NCCL_SHM_DISABLE": "1"}, load_snapshot(1) + ring(7), 0),
        ({"NCCL_BUFFSIZE": str(1 << 20)}, load_snapshot(1) + ring(7), 8 * 7 * MiB),
        ({"NCCL_BUFFSIZE": "lots"}, load_snapshot(1) + ring(7), 8 * 7 * 4 * MiB),
    ],
)
def test_the_servers_environment_changes_what_is_made(env, sglang, nccl):
    need = launch_need(plan("--tp-size", "8"), env)
    assert (need.sglang_bytes, need.nccl_bytes) == (sglang, nccl)


NEED = ShmNeed(sglang_bytes=24 * MiB, nccl_bytes=224 * MiB, parts=("queue", "nccl"))


def test_a_full_dev_shm_of_normal_size_is_a_refusal_naming_free_and_needed_bytes():
    full = ShmSpace(size_bytes=16 * GiB, free_bytes=0)
    check = check_shm(full, NEED)
    assert check.name == "shm"
    assert check.status is Status.FAIL
    assert "/dev/shm has 0.0 MiB free (0 B) of 16,384.0 MiB" in check.detail
    assert f"SGLang's own segments need 24.0 MiB ({24 * MiB:,} B" in check.detail
    assert "SIGBUS" in check.detail


def test_room_for_sglang_but_not_for_nccl_is_a_warning():
    check = check_shm(ShmSpace(size_bytes=16 * GiB, free_bytes=100 * MiB), NEED)
    assert check.status is Status.WARN
    assert f"may need 248.0 MiB ({248 * MiB:,} B" in check.detail
    assert f"100.0 MiB free ({100 * MiB:,} B)" in check.detail


def test_room_for_all_is_ok_and_says_how_much():
    check = check_shm(ShmSpace(size_bytes=16 * GiB, free_bytes=15 * GiB), NEED)
    assert check.status is Status.OK
    assert "needs about 248.0 MiB" in check.detail


def test_a_small_dev_shm_with_room_still_warns_where_nccl_runs_as_nccl_asks_for_1_gib():
    small = ShmSpace(size_bytes=512 * MiB, free_bytes=512 * MiB)
    assert check_shm(small, NEED).status is Status.WARN
    one_gpu = ShmNeed(sglang_bytes=20 * KiB, nccl_bytes=0, parts=())
    assert check_shm(ShmSpace(size_bytes=64 * MiB, free_bytes=64 * MiB), one_gpu).status is (
        Status.OK
    )


def test_no_dev_shm_is_a_warning():
    assert check_shm(None, NEED).status is Status.WARN
