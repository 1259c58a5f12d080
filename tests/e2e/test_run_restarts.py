"""`sglang-supervisor run` end to end: deaths are classified and restarted with backoff, a bad
flag is never retried (exit 3), the same start failure twice before ready ends with exit 4, a
crash loop with exit 5, and the restart budget outlives the supervisor."""

from __future__ import annotations

import os
import signal

import pytest

from tests.e2e.run_support import supervisor
from tests.testing.support import leaked, recorded_shm_names
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def test_a_killed_rank_gets_the_whole_tree_replaced_with_new_pids(
    tmp_path, free_port, simulated_process_guard, shm_record
):
    with supervisor(tmp_path, free_port, simulated_process_guard) as sup:
        sup.wait_event("ready")
        before = set(sup.tree())
        os.kill(sup.schedulers()["sglang::scheduler_TP1"], signal.SIGKILL)
        failed = sup.wait_event("server_failed")
        assert failed["failure"] in ("rank_crash", "exited_unexpectedly")
        restarting = sup.wait_event("restarting")
        assert restarting["restart_count"] == 1
        sup.wait_event("ready", count=2)
        after = set(sup.tree())
        assert len(after) >= 3
        assert not before & after  # every process of the tree is new
        assert sup.state()["restart_count"] == 1
        # The killed tree's /dev/shm segments (SGLang's ring buffers) were removed; the new
        # tree's are its own to unlink at its clean exit.
        assert sup.events("shm_removed")[0]["segments"] >= 1
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
        assert recorded_shm_names(shm_record) != []
        assert leaked(shm_record) == []


@pytest.mark.parametrize(
    ("scenario", "failure"),
    [
        ({"zombie": {"rank": 1, "after_s": 0.3}}, "rank_zombie"),
        ({"hang": {"rank": 0, "after_s": 0.3}}, "rank_stopped"),
        ({"health_fail_after_s": 0.3}, "health_timeout"),
    ],
)
def test_zombie_stopped_rank_and_failing_health_are_deaths_that_restart(
    tmp_path, free_port, simulated_process_guard, scenario, failure
):
    # A long backoff: the supervisor is stopped while it waits, which must also exit 0.
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario=scenario,
        options=("--backoff-initial", "60s", "--backoff-max", "60s"),
    ) as sup:
        failed = sup.wait_event("server_failed")
        assert failed["failure"] == failure
        restarting = sup.wait_event("restarting")
        assert restarting["delay_s"] == 60
        assert sup.state()["last_failure"] == failure
        assert sup.tree() == []  # the dead tree was killed before the backoff
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
        if failure == "health_timeout":
            unhealthy = sup.events("unhealthy")[0]
            assert "3 consecutive failed health checks" in unhealthy["detail"]


def test_a_bad_flag_is_never_retried_and_sglangs_message_is_shown(
    tmp_path, free_port, simulated_process_guard
):
    """An SGLang newer than every flag table: its unknown flags are passed on with a warning
    (never blocked), and when SGLang itself refuses one, that is final."""
    scenario = {"bad_flags": ["--no-such-flag"]}
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario=scenario,
        server_args=("--tp", "2", "--no-such-flag"),
        overrides={"host": {"sglang_version": "0.9.0"}},
    ) as sup:
        assert sup.wait_exit() == 3
        settings = sup.events("settings")[0]
        assert "passed on unchecked: --no-such-flag" in settings["argv_warnings"][0]
        assert len(sup.events("launching")) == 1
        assert sup.events("server_failed")[0]["failure"] == "bad_flags"
        # The operator sees SGLang's own argparse message in the supervisor's final words.
        final = sup.log_text().split("sglang-supervisor: SGLang rejected its arguments")[-1]
        assert "unrecognized arguments: --no-such-flag" in final
        assert sup.tree() == []


def test_a_crash_loop_backs_off_doubling_then_exits_5(tmp_path, free_port, simulated_process_guard):
    # Each death comes after ready: dying twice the same way before ready is exit 4 (below).
    with supervisor(
        tmp_path, free_port, simulated_process_guard, options=("--max-restarts", "3")
    ) as sup:
        for count in range(1, 5):
            sup.wait_event("ready", count=count)
            os.kill(sup.schedulers()["sglang::scheduler_TP0"], signal.SIGKILL)
        assert sup.wait_exit(timeout_s=60) == 5
        delays = [e["delay_s"] for e in sup.events("restarting")]
        assert delays == [0.1, 0.2, 0.4]
        assert len(sup.events("launching")) == 4
        loop = sup.events("crash_loop")
        assert len(loop) == 1
        assert loop[0]["restarts_in_window"] == 3
        assert sup.state()["restart_count"] == 3
        assert "crash loop" in sup.log_text().strip().splitlines()[-1]
        wait_until(lambda: not sup.tree(), timeout_s=5, what="no process left")


def test_a_load_without_progress_is_a_startup_stall_and_is_restarted(
    tmp_path, free_port, simulated_process_guard
):
    options = ("--startup-stall-timeout", "1s", "--backoff-initial", "60s", "--backoff-max", "60s")
    with supervisor(
        tmp_path, free_port, simulated_process_guard, scenario={"startup_s": 60}, options=options
    ) as sup:
        failed = sup.wait_event("server_failed")
        assert failed["failure"] == "startup_stall"
        sup.wait_event("restarting")
        assert sup.tree() == []
        sup.signal(signal.SIGINT)
        assert sup.wait_exit() == 0


def test_the_hard_startup_timeout_ends_the_run_with_exit_4(
    tmp_path, free_port, simulated_process_guard
):
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario={"startup_s": 60},
        options=("--startup-timeout", "1s"),
    ) as sup:
        assert sup.wait_exit() == 4
        assert sup.events("server_failed")[0]["failure"] == "startup_timeout"
        assert not sup.events("restarting")
        assert sup.tree() == []


def test_the_same_start_failure_twice_before_ready_exits_4_without_a_crash_loop(
    tmp_path, free_port, simulated_process_guard
):
    """A deterministic start failure (here rank 0 dies in its first init) is not retried."""
    with supervisor(
        tmp_path, free_port, simulated_process_guard, scenario={"exit_code_on_start": 1}
    ) as sup:
        assert sup.wait_exit(timeout_s=60) == 4
        assert len(sup.events("launching")) == 2
        assert len(sup.events("restarting")) == 1
        assert not sup.events("ready")
        fatal = sup.events()[-1]
        assert (fatal["event"], fatal["exit_code"]) == ("fatal", 4)
        failure = sup.events("server_failed")[-1]["failure"]
        assert fatal["reason"].startswith(f"the same failure twice before ready: {failure}: ")
        assert sup.tree() == []


def test_the_restart_budget_survives_a_restart_of_the_supervisor(
    tmp_path, free_port, simulated_process_guard
):
    state_dir = tmp_path / "state"
    with supervisor(tmp_path, free_port, simulated_process_guard, state_dir=state_dir) as sup:
        sup.wait_event("ready")
        os.kill(sup.schedulers()["sglang::scheduler_TP1"], signal.SIGKILL)
        sup.wait_event("ready", count=2)
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
        assert len(sup.state()["restart_times"]) == 1
    # As systemd would start it again: the window still holds that restart, so with one restart
    # allowed the next death is a crash loop at once instead of a fresh budget.
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        state_dir=state_dir,
        options=("--max-restarts", "1"),
    ) as sup:
        restored = sup.wait_event("restart_budget_restored")
        assert restored["restarts_in_window"] == 1
        sup.wait_event("ready")
        os.kill(sup.schedulers()["sglang::scheduler_TP1"], signal.SIGKILL)
        assert sup.wait_exit() == 5
        assert "crash loop: 1 restarts within 1800 s" in sup.events()[-1]["reason"]
        assert len(sup.events("launching")) == 1
