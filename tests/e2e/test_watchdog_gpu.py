"""GPU release after a kill, against the simulated server and GPUs: delayed release, a stuck GPU
reset by the (simulated) reset command, a failing reset, an orphan holder, NVML hanging."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.adapters import reclaim
from supervisor.adapters.clock import SystemClock
from supervisor.adapters.gpu_guard import GuardedGpuSensor
from supervisor.adapters.gpu_reset import CommandGpuResetter
from supervisor.core.classify import FailureKind
from supervisor.core.events import KillReason, MemoryAction, WatchdogEvent
from supervisor.errors import ExitCode, GpuUnrecoverable
from supervisor.memory.watchdog import MemoryWatchdog
from supervisor.run.gpu_holders import Holders
from supervisor.run.gpu_wait import (
    ReleaseLimits,
    ReleaseResult,
    measure_baselines,
    raise_if_unrecoverable,
    wait_for_gpu_release,
)
from supervisor.testing import gpu_state
from tests.adapters.test_reclaim import state_of
from tests.e2e.watchdog_support import Launched, launched, sim_sensor, system_holders, tree_limits
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

MiB = 2**20
RESET = f"{sys.executable} -m supervisor.testing.fake_gpu_reset {{index}}"


def _kill_and_release(
    run: Launched,
    sensor: GuardedGpuSensor,
    gpus: Path,
    baselines: dict[str, int],
    *,
    reset_command: str | None,
    timeout_s: float,
    holders: Holders | None = None,
) -> ReleaseResult:
    old = [p.pid for p in run.server.tree()]
    run.server.kill_all(KillReason(FailureKind.MEMORY_KILL, "test"))
    wait_until(lambda: not run.live_tree(), timeout_s=10, what="tree gone")
    return wait_for_gpu_release(
        sensor,
        [0, 1],
        old,
        clock=SystemClock(),
        holders=holders or system_holders(),
        baselines=baselines,
        limits=ReleaseLimits(
            timeout_s=timeout_s, reset_settle_s=0.5, d_state_grace_s=timeout_s, poll_interval_s=0.05
        ),
        resetter=(
            CommandGpuResetter(
                reset_command,
                timeout_s=30,
                env={**os.environ, "FAKE_GPU_STATE_DIR": str(gpus)},
            )
            if reset_command
            else None
        ),
    )


@pytest.fixture
def gpus(make_gpu_state: Callable[..., Path]) -> Path:
    return make_gpu_state(2)


@pytest.fixture
def sensor(gpus: Path):
    guard = sim_sensor(gpus)
    yield guard
    guard.close()


def test_a_delayed_release_is_waited_for(gpus: Path, sensor: GuardedGpuSensor, free_port: int):
    scenario = {"startup_s": 0.1, "gpu_release_delay_s": 1.0}
    baselines = measure_baselines(sensor, [0, 1])
    with launched(["--tp-size", "2"], scenario, port=free_port, state_dir=gpus) as run:
        wait_until(run.ready, timeout_s=30, what="server ready")
        result = _kill_and_release(run, sensor, gpus, baselines, reset_command=None, timeout_s=20)
    assert result.ok, result.reason
    assert result.elapsed_s >= 0.5  # the dead ranks' PIDs stayed listed for a while
    assert result.reset_gpus == ()
    assert result.killed_pids == ()


def test_a_stuck_gpu_is_reset_by_the_configured_command_then_free(
    gpus: Path, sensor: GuardedGpuSensor, free_port: int
):
    scenario = {"startup_s": 0.1, "gpu_stuck": True}
    baselines = measure_baselines(sensor, [0, 1])
    with launched(["--tp-size", "2"], scenario, port=free_port, state_dir=gpus) as run:
        wait_until(run.ready, timeout_s=30, what="server ready")
        result = _kill_and_release(run, sensor, gpus, baselines, reset_command=RESET, timeout_s=1.0)
    assert result.ok, result.reason
    assert result.reset_gpus == (0, 1)
    after = sensor.read_gpus()
    assert after is not None
    assert all(g.used_bytes == baselines[g.uuid] for g in after)


def test_a_failing_reset_means_no_relaunch_and_exit_code_6(
    gpus: Path, sensor: GuardedGpuSensor, free_port: int
):
    scenario = {"startup_s": 0.1, "gpu_stuck": True}
    baselines = measure_baselines(sensor, [0, 1])
    broken = f"{sys.executable} -m supervisor.testing.fake_gpu_reset 7"  # no such GPU: exit 6
    with launched(["--tp-size", "2"], scenario, port=free_port, state_dir=gpus) as run:
        wait_until(run.ready, timeout_s=30, what="server ready")
        result = _kill_and_release(
            run, sensor, gpus, baselines, reset_command=broken, timeout_s=1.0
        )
    assert not result.ok
    assert "reset failed" in result.reason
    with pytest.raises(GpuUnrecoverable) as err:
        raise_if_unrecoverable(result)
    assert err.value.exit_code is ExitCode.GPU_UNRECOVERABLE
    gpu_state.clear_gpu(gpus, 0)
    gpu_state.clear_gpu(gpus, 1)


def test_an_orphan_holding_a_gpu_is_found_and_killed(
    gpus: Path, sensor: GuardedGpuSensor, free_port: int
):
    """A setsid escapee of the old run (SGLang-titled) survives a plain group kill and keeps
    GPU memory: the release wait finds it on the GPU and kills it."""
    scenario = {
        "startup_s": 0.1,
        "orphan": {"kind": "setsid", "holds_gpu": True, "rank": 0, "lifetime_s": 600},
    }
    baselines = measure_baselines(sensor, [0, 1])
    with launched(["--tp-size", "2"], scenario, port=free_port, state_dir=gpus) as run:
        wait_until(run.ready, timeout_s=30, what="server ready")
        group = [p.pid for p in run.server.tree() if p.pgid == run.server.pgid]
        orphan = wait_until(
            lambda: [p.pid for p in run.server.tree() if p.pgid != run.server.pgid],
            timeout_s=10,
            what="orphan started",
        )[0]
        # Its GPU claim comes a moment after it is a process: the release wait must find it there.
        wait_until(
            lambda: orphan in gpu_state.live_holders(gpus, 0),
            timeout_s=10,
            what="the orphan holding GPU 0",
        )
        # The naive kill: only the process group, which misses the setsid child.
        run.server.signal_group(signal.SIGKILL)
        wait_until(
            lambda: all(state_of(p) in (None, "Z") for p in group),
            timeout_s=10,
            what="group dead",
        )
        assert state_of(orphan) not in (None, "Z")
        result = wait_for_gpu_release(
            sensor,
            [0, 1],
            [],  # the old run's PIDs unknown: recognised by its SGLang title
            clock=SystemClock(),
            holders=system_holders(),
            baselines=baselines,
            limits=ReleaseLimits(timeout_s=20, poll_interval_s=0.05),
        )
    assert result.ok, result.reason
    assert orphan in result.killed_pids
    wait_until(lambda: state_of(orphan) in (None, "Z"), timeout_s=5, what="orphan gone")


def test_a_d_state_holder_is_waited_for_not_re_killed(
    gpus: Path, sensor: GuardedGpuSensor, free_port: int
):
    """The simulated rank cannot really enter D state, so its /proc state is reported as D for
    the first second after the kill (how a rank unpinning hundreds of GB looks after SIGKILL)."""
    scenario = {"startup_s": 0.1, "gpu_release_delay_s": 1.5}
    baselines = measure_baselines(sensor, [0, 1])
    kills: list[int] = []
    with launched(["--tp-size", "2"], scenario, port=free_port, state_dir=gpus) as run:
        wait_until(run.ready, timeout_s=30, what="server ready")
        ranks = {p.pid for p in run.server.tree() if p.title.startswith("sglang::scheduler")}
        started = time.monotonic()

        def state(pid: int) -> str | None:
            if pid in ranks and time.monotonic() - started < 1.0:
                return "D"
            return state_of(pid)

        def kill(pid: int) -> bool:
            kills.append(pid)
            return reclaim.kill_and_reclaim(pid)

        real = system_holders()
        holders = Holders(is_ours=real.is_ours, state=state, kill=kill)
        result = _kill_and_release(
            run, sensor, gpus, baselines, reset_command=None, timeout_s=20, holders=holders
        )
    assert result.ok, result.reason
    assert set(result.d_state_pids) == ranks
    assert kills == []


def test_memory_kills_happen_on_time_while_nvml_hangs(
    tmp_path: Path, gpus: Path, sensor: GuardedGpuSensor, free_port: int
):
    scenario = {
        "startup_s": 0.1,
        "leak": {"rank": 0, "bytes_per_s": 8 * MiB, "after_s": 1.0, "max_bytes": 48 * MiB},
    }
    with launched(["--tp-size", "2"], scenario, port=free_port, state_dir=gpus) as run:
        wait_until(run.ready, timeout_s=30, what="server ready")
        assert sensor.read_gpus() is not None
        gpu_state.set_nvml_hang(gpus, 60.0)
        # Another thread (the runner, say) is stuck in an NVML query meanwhile.
        blocked = threading.Thread(target=sensor.read_gpus, daemon=True)
        blocked.start()
        expected = sum(p.charged_bytes for p in run.server.tree())
        limits = tree_limits(expected)
        dog = MemoryWatchdog(
            run.server,
            limits,
            post=run.events.put,
            gpu_snapshot=sensor.last_snapshot,
            state_dir=tmp_path,
        )
        dog.start()
        event = run.events.get(timeout=30)
        assert isinstance(event, WatchdogEvent)
        assert event.action is MemoryAction.KILLED
        # On time: the kill came before the leak (8 MiB/s, up to 48 MiB) got past the tree's
        # budget by more than a tick's growth, while the NVML query stayed stuck (60 s).
        assert max(r.tree_charged_bytes for r in dog.history) < expected + 16 * MiB
        dog.stop()
        blocked.join(timeout=15)
        assert sensor.hangs == 1
    gpu_state.set_nvml_hang(gpus, None)
