"""The real server at TP 2 (two gloo ranks, one core each): a killed rank is one rank death,
one restart and ready again; loading beside busy loops on both cores is never taken for a rank
death (during init a scheduler forks short-lived children that carry its title)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.real_sglang.lane import LANE_MARKS, Leftovers, real_supervisor
from tests.waiting import wait_until

pytestmark = LANE_MARKS
# Loaded launches: 10 in CI and by default; fewer by hand while developing the lane.
LAUNCHES = int(os.environ.get("SGLANG_SUPERVISOR_LANE_LAUNCHES", "10"))


def test_a_killed_rank_is_one_rank_death_one_restart_and_ready_again(
    tmp_path: Path, simulated_process_guard: str
):
    left: list[Leftovers] = []
    with real_supervisor(tmp_path, simulated_process_guard, tp=2, leftovers=left) as sup:
        sup.wait_ready()
        schedulers = sup.schedulers()
        assert set(schedulers) == {"sglang::scheduler_TP0", "sglang::scheduler_TP1"}, schedulers
        os.kill(schedulers["sglang::scheduler_TP1"], signal.SIGKILL)
        failed = sup.wait_event("server_failed", timeout_s=120)
        assert failed["failure"] == "rank_crash", failed
        assert sup.wait_event("restarting")["restart_count"] == 1
        sup.wait_ready(count=2)
        assert len(sup.events("server_failed")) == 1
        again = sup.schedulers()
        assert set(again) == set(schedulers)
        assert not set(again.values()) & set(schedulers.values())
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit(timeout_s=180) == 0
        assert len(sup.events("server_failed")) == 1
        # SGLang's pid-stamped ring buffer (24 MiB at TP 2) outlives each tree, the killed one
        # and the cleanly stopped one: the supervisor removes it.
        assert [e["segments"] >= 1 for e in sup.events("shm_removed")] == [True, True]
    (after,) = left
    assert (after.processes, after.cgroups) == ([], [])


@contextmanager
def busy_cores(count: int, lifetime_s: float) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`count` busy loops (one per core), each ending by itself after `lifetime_s` at most."""
    loop = (
        f"import time\nend = time.monotonic() + {lifetime_s}\nwhile time.monotonic() < end: pass\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)


# A hang guard that grows with the launches: each may wait 600 s for ready (a loaded machine
# took about 300 s a launch), and 1200 s for all ten ended a healthy run at the fifth.
LANE_TIMEOUT_S = 300 + 600 * LAUNCHES


@pytest.mark.timeout(LANE_TIMEOUT_S)
def test_loading_at_tp2_beside_busy_cores_has_no_false_rank_death(
    tmp_path: Path, simulated_process_guard: str
):
    false_deaths: list[tuple[int, dict[str, object]]] = []
    left: list[Leftovers] = []
    ready_count = 0
    with busy_cores(2, LANE_TIMEOUT_S):
        for launch in range(LAUNCHES):
            with real_supervisor(tmp_path, simulated_process_guard, tp=2, leftovers=left) as sup:
                # Ready, or a failure, then stopped. Not stopped earlier: a SIGTERM while SGLang
                # warms up stops uvicorn, and the server then hangs in "Waiting for application
                # shutdown." until the grace's SIGKILL.
                wait_until(
                    lambda: sup.events("server_failed") or sup.events("ready"),
                    timeout_s=600,
                    interval_s=0.2,
                    what="ready, or a failure",
                    context=lambda: sup.log_text()[-2000:],
                )
                ready_count += len(sup.events("ready"))
                false_deaths += [(launch, e) for e in sup.events("server_failed")]
                sup.signal(signal.SIGTERM)
                assert sup.wait_exit(timeout_s=180) == 0
    assert false_deaths == []
    assert ready_count == LAUNCHES
    assert [(x.processes, x.cgroups) for x in left] == [([], [])] * LAUNCHES
