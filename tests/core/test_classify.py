"""Failure classes from exit status, signal, log tail and what the supervisor saw."""

from __future__ import annotations

import pytest

from supervisor.core.classify import (
    DeathContext,
    FailureKind,
    classify,
    describe_exit,
    killed_itself,
)
from supervisor.core.log_phases import marks_in

K = FailureKind
ARGPARSE = [
    "usage: launch_server.py [-h] --model-path MODEL_PATH",
    "launch_server.py: error: unrecognized arguments: --bogus-flag",
]


@pytest.mark.parametrize(
    ("exit_code", "sig", "tail", "context", "kind"),
    [
        (2, None, ARGPARSE, DeathContext(), K.BAD_FLAGS),
        # Only argparse's lines make exit 2 "bad flags": a rank that died at init with 2 is a crash.
        (2, None, [], DeathContext(), K.EXITED_UNEXPECTEDLY),
        (
            2,
            None,
            ["Rank 0 scheduler died during initialization (exit code: 2)"],
            DeathContext(oom_kills=0),
            K.RANK_CRASH,
        ),
        (2, None, [], DeathContext(was_ready=True), K.EXITED_UNEXPECTEDLY),
        (1, None, ["OSError: [Errno 98] Address already in use"], DeathContext(), K.PORT_IN_USE),
        (
            1,
            None,
            ["torch.OutOfMemoryError: CUDA out of memory."],
            DeathContext(),
            K.GPU_OOM_AT_LOAD,
        ),
        (
            1,
            None,
            ["torch.OutOfMemoryError: CUDA out of memory."],
            DeathContext(was_ready=True),
            K.RANK_CRASH,
        ),
        (None, 9, [], DeathContext(oom_kills=1), K.KERNEL_OOM_KILLED),
        (None, 9, [], DeathContext(oom_kills=0), K.EXITED_UNEXPECTEDLY),
        # No kernel evidence, no OOM: a SIGKILL alone is SGLang's own as often as not.
        (None, 9, [], DeathContext(), K.EXITED_UNEXPECTEDLY),
        (
            1,
            None,
            ["Rank 1 scheduler died during initialization (exit code: -9)"],
            DeathContext(),
            K.RANK_CRASH,
        ),
        (
            1,
            None,
            ["Rank 1 scheduler died during initialization (exit code: -9)"],
            DeathContext(oom_kills=1),
            K.KERNEL_OOM_KILLED,
        ),
        # The tree's own count decides: the host's OOM kill was another cgroup's victim.
        (None, 9, [], DeathContext(oom_kills=1, tree_oom_kills=0), K.EXITED_UNEXPECTEDLY),
        (None, 9, [], DeathContext(oom_kills=0, tree_oom_kills=2), K.KERNEL_OOM_KILLED),
        (None, 9, [], DeathContext(tree_oom_kills=1), K.KERNEL_OOM_KILLED),
        (None, None, [], DeathContext(observed=K.RANK_ZOMBIE, killed_by_us=True), K.RANK_ZOMBIE),
        (None, None, [], DeathContext(observed=K.RANK_STOPPED, killed_by_us=True), K.RANK_STOPPED),
        (
            None,
            None,
            [],
            DeathContext(observed=K.RANK_CRASH, killed_by_us=True, oom_kills=0),
            K.RANK_CRASH,
        ),
        (
            None,
            None,
            [],
            DeathContext(observed=K.HEALTH_TIMEOUT, killed_by_us=True),
            K.HEALTH_TIMEOUT,
        ),
        (
            None,
            None,
            [],
            DeathContext(observed=K.STARTUP_STALL, killed_by_us=True),
            K.STARTUP_STALL,
        ),
        (1, None, ["Scheduler hit an exception: boom"], DeathContext(), K.RANK_CRASH),
        (0, None, [], DeathContext(was_ready=True), K.EXITED_UNEXPECTEDLY),
        (2, None, ARGPARSE, DeathContext(override=K.MEMORY_KILL), K.MEMORY_KILL),
        (None, 9, ["Scheduler hit an exception"], DeathContext(override=K.GPU_DIRTY), K.GPU_DIRTY),
    ],
)
def test_deaths_are_classified(exit_code, sig, tail, context, kind):
    assert classify(exit_code, sig, tail, context).kind is kind


def test_bad_flags_hint_carries_sglangs_own_message():
    result = classify(2, None, ["some noise", *ARGPARSE], DeathContext())
    assert "unrecognized arguments: --bogus-flag" in result.hint
    assert "some noise" not in result.hint


def test_a_tree_we_killed_is_never_bad_flags_even_with_exit_2():
    result = classify(2, None, [], DeathContext(killed_by_us=True, observed=K.HEALTH_TIMEOUT))
    assert result.kind is K.HEALTH_TIMEOUT


def test_gpu_oom_hint_suggests_mem_fraction_static_and_host_refusal_is_explained():
    assert "--mem-fraction-static" in classify(1, None, ["CUDA out of memory"], DeathContext()).hint
    refused = classify(
        1, None, ["Not enough host memory available. Requesting 9 GB"], DeathContext()
    )
    assert refused.kind is K.EXITED_UNEXPECTEDLY
    assert "--hicache-size" in refused.hint
    assert "exit status 1" in refused.hint


def test_override_detail_is_appended_and_every_kind_has_a_hint():
    result = classify(
        None, 9, [], DeathContext(override=K.MEMORY_KILL, override_detail="3 GB left")
    )
    assert result.hint.endswith(": 3 GB left")
    assert all(classify(None, None, [], DeathContext(override=k)).hint for k in FailureKind)
    assert len({k.value for k in FailureKind}) == 17


def test_exit_descriptions():
    assert describe_exit(1, None) == "exit status 1"
    assert describe_exit(None, 9) == "killed by signal 9"
    assert describe_exit(None, None) == "still running"


def test_a_failed_warm_up_is_named_not_taken_for_the_oom_killer():
    """SGLang kills its own tree (-9) when the warm-up request fails (http_server.py)."""
    tail = ["Initialization failed. warmup error: Traceback (most recent call last):"]
    got = classify(None, 9, tail, DeathContext(oom_kills=0))
    assert got.kind is K.EXITED_UNEXPECTEDLY
    assert "warm-up request failed" in got.hint
    assert classify(None, 9, tail, DeathContext(oom_kills=1)).kind is K.KERNEL_OOM_KILLED


BUS_TAIL = [
    "Fatal Python error: Bus error",
    "",
    "Thread 0x00007f3a2c5fe640 (most recent call first):",
    "Rank 1 scheduler died during initialization (exit code: -7). If exit code is -9 (SIGKILL), "
    "a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.",
]


@pytest.mark.parametrize(
    ("exit_code", "sig", "tail", "kind"),
    [
        (1, None, BUS_TAIL, K.RANK_CRASH),  # a rank, as SGLang's main process reports it
        (1, None, BUS_TAIL[-1:], K.RANK_CRASH),  # the rank's exit code alone
        (1, None, ["Subprocess scheduler_0 (pid=4242) crashed with exit code -7"], K.RANK_CRASH),
        (None, 7, [], K.EXITED_UNEXPECTEDLY),  # the main process itself
        (1, None, BUS_TAIL[:1], K.EXITED_UNEXPECTEDLY),  # faulthandler's line alone
    ],
)
def test_a_sigbus_at_init_names_a_possible_full_dev_shm(exit_code, sig, tail, kind):
    result = classify(exit_code, sig, tail, DeathContext(oom_kills=0))
    assert result.kind is kind
    assert "SIGBUS (signal 7, 'Bus error') before ready" in result.hint
    assert "/dev/shm is full or too small" in result.hint
    assert "df -h /dev/shm" in result.hint


def test_what_the_runner_saw_keeps_its_class_with_the_dev_shm_hint():
    context = DeathContext(observed=K.RANK_CRASH, oom_kills=0)
    result = classify(None, None, BUS_TAIL, context)
    assert result.kind is K.RANK_CRASH
    assert "/dev/shm" in result.hint


def test_a_sigbus_after_ready_or_a_sigkill_at_init_does_not_blame_dev_shm():
    ready = classify(None, 7, [], DeathContext(was_ready=True, oom_kills=0))
    assert "/dev/shm" not in ready.hint
    killed = ["Rank 1 scheduler died during initialization (exit code: -9)."]
    oom = classify(1, None, killed, DeathContext(tree_oom_kills=1))
    assert oom.kind is K.KERNEL_OOM_KILLED
    assert "/dev/shm" not in oom.hint
    assert "/dev/shm" not in classify(1, None, ["exit code: -11"], DeathContext(oom_kills=0)).hint


# SGLang 0.5.23 on CPU, TP 2, scheduler_TP1 SIGKILLed: TP0's exception, the main process's
# SubprocessWatchdog line, its SIGQUIT handler, then kill_process_tree on itself (status -9).
SELF_KILL_TAIL = [
    "[2025-06-01 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/x/sglang/srt/managers/scheduler.py", line 3012, in run_scheduler_process',
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer",
    "[2025-06-01 10:00:01] Subprocess scheduler_1 (pid=4243) crashed with exit code -9. "
    "Triggering SIGQUIT for cleanup...",
    "[2025-06-01 10:00:01] SIGQUIT received. signum=3, frame=None. It usually means one child "
    "failed.",
    "[2025-06-01 10:00:06] kill_process_tree called: parent_pid=4200, include_parent=True, "
    "pid=4200",
]


def test_an_unexplained_sigkill_without_kernel_evidence_is_not_the_oom_killer():
    for context in (DeathContext(), DeathContext(oom_kills=0), DeathContext(tree_oom_kills=0)):
        result = classify(None, 9, ["INFO: some ordinary line"], context)
        assert result.kind is K.EXITED_UNEXPECTEDLY
        assert "SIGKILLed by neither the supervisor nor SGLang itself" in result.hint
    unread = classify(None, 9, [], DeathContext()).hint
    assert "could not be read: check `dmesg`" in unread
    assert "counted no OOM kill" in classify(None, 9, [], DeathContext(oom_kills=0)).hint


def test_an_oom_kill_counted_by_the_kernel_is_named_even_after_sglangs_self_kill():
    assert classify(None, 9, SELF_KILL_TAIL, DeathContext(oom_kills=1)).kind is (
        K.KERNEL_OOM_KILLED
    )
    tree = classify(None, 9, SELF_KILL_TAIL, DeathContext(oom_kills=0, tree_oom_kills=1))
    assert tree.kind is K.KERNEL_OOM_KILLED


def test_sglangs_self_kill_after_a_ranks_exception_is_named_with_the_ranks_words():
    result = classify(None, 9, SELF_KILL_TAIL, DeathContext(oom_kills=0, tree_oom_kills=0))
    assert result.kind is K.RANK_CRASH
    assert result.hint.startswith("SGLang's main process killed its own tree after a child")
    assert "Scheduler hit an exception" in result.hint
    assert "RuntimeError: [../third_party/gloo" in result.hint  # the rank's exception
    assert "the kernel counted no OOM kill" in result.hint
    assert killed_itself(9, marks_in(SELF_KILL_TAIL))


def test_the_self_kill_is_read_from_sglangs_lines_not_from_the_signal_alone():
    assert not killed_itself(9, marks_in(["INFO: ordinary"]))
    # The same lines, and a status that is no SIGKILL: not the self-kill.
    assert not killed_itself(1, marks_in(SELF_KILL_TAIL))
    # launch_server.py's own `finally` kills the children only (include_parent=False).
    children_only = "kill_process_tree called: parent_pid=7, include_parent=False, pid=7"
    assert not killed_itself(9, marks_in([children_only]))
    # A process that kills another's tree is not killing itself.
    other = "kill_process_tree called: parent_pid=8, include_parent=True, pid=7"
    assert not killed_itself(9, marks_in([other]))
    own = "kill_process_tree called: parent_pid=7, include_parent=True, pid=7"
    assert killed_itself(9, marks_in([own]))
    # An init failure with no crash line of a rank (a HiCache host pool that fails in
    # pool_host/common.py) is still named, and says the exception.
    hicache = [
        "Scheduler hit an exception: Traceback (most recent call last):",
        "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an",
        "Received sigquit from a child process. It usually means the child failed.",
        own,
    ]
    result = classify(None, 9, hicache, DeathContext(oom_kills=0))
    assert result.kind is K.RANK_CRASH
    assert "Found no NVIDIA driver" in result.hint


def test_what_the_runner_saw_keeps_its_class_and_the_hint_names_the_self_kill():
    context = DeathContext(observed=K.RANK_CRASH, oom_kills=0)
    result = classify(None, 9, SELF_KILL_TAIL, context)
    assert result.kind is K.RANK_CRASH
    assert "killed its own tree" in result.hint
    # A tree the supervisor killed alive did not kill itself, whatever its log says.
    ours = classify(
        None, None, SELF_KILL_TAIL, DeathContext(observed=K.RANK_CRASH, killed_by_us=True)
    )
    assert "killed its own tree" not in ours.hint
