"""The run loop in-process, told as stories on a fake clock: ready, a rank dies, backoff, the
GPUs are waited for, relaunch, stop; a crash loop; bad flags; a stuck GPU; stop signals during
each wait. Seconds of the story take microseconds; nothing sleeps, no process starts."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.core.classify import FailureKind
from supervisor.core.events import (
    KillReason,
    MemoryAction,
    SignalEvent,
    WatchdogEvent,
)
from supervisor.core.lifecycle import HealthStatus, ServerState
from supervisor.core.units import GiB
from supervisor.errors import (
    ConfigError,
    CrashLoop,
    GpuUnrecoverable,
    ServerArgsRejected,
    StartupFailed,
)
from supervisor.memory.guard import MemoryGuard
from supervisor.preflight.measurements import load_records
from supervisor.run.plugins import Plugins
from supervisor.run.state import ProcessRef, RunState
from tests.fakes import FakeProc, RecordingResetter
from tests.run.runner_support import LOAD_S, WARM_S, World, names, runner, settings, world

SIGTERM = SignalEvent(signal.SIGTERM, "SIGTERM")


def test_ready_rank_death_backoff_gpu_release_relaunch_stop(tmp_path: Path):
    w = world(tmp_path)
    run = runner(w, settings(tmp_path))
    ready_at = LOAD_S + WARM_S

    def crash() -> None:
        w.hold_gpus(w.server, seconds=25.0)  # unpinning outlasts the 10 s backoff
        w.server.crash_rank(1)

    w.events.call_at(ready_at + 30.0, crash)
    w.events.at(200.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    assert names(logs) == [
        *("launching", "loading", "warming", "ready", "unhealthy", "restarting"),
        "gpu_release_done",
        *("launching", "loading", "warming", "ready", "stopping", "stopped"),
    ]
    first, second = w.launcher.started
    assert first.kill_reason is not None
    assert first.kill_reason.failure is FailureKind.RANK_CRASH
    restarting = next(e for e in logs if e["event"] == "restarting")
    assert (restarting["failure"], restarting["delay_s"]) == ("rank_crash", 10.0)
    release = next(e for e in logs if e["event"] == "gpu_release_done")
    assert release["elapsed_s"] >= 10.0, "the GPUs were still held when the backoff ended"
    assert second.terminated == 1  # a stop asks first (SIGTERM), then kills what is left
    state = w.store.load()
    assert (state.restart_count, state.last_failure) == (1, "rank_crash")
    assert state.server_pids[0].pid == second.pid
    assert [m for m in w.notifier.messages if m.startswith("READY=1")] != []
    assert w.notifier.messages[-1].startswith("STATUS=stopped")


def test_a_server_that_dies_the_same_way_twice_before_ready_ends_with_exit_4(tmp_path: Path):
    """A deterministic start failure (a missing module, a rank dying in its first init) is
    not retried into a crash loop: the same launch would fail the same way again."""
    w = world(tmp_path)
    w.launcher.on_start = lambda server: w.events.call_at(
        w.clock.now + 2.0, lambda: server.exit_by_itself(1)
    )
    run = runner(w, settings(tmp_path, max_restarts=3), watch_gpus=False)
    with capture_logs() as logs, pytest.raises(StartupFailed) as err:
        run.run()
    assert err.value.exit_code == 4
    assert len(w.launcher.started) == 2
    assert [e["delay_s"] for e in logs if e["event"] == "restarting"] == [10.0]
    fatal = logs[-1]
    assert (fatal["event"], fatal["exit_code"]) == ("fatal", 4)
    assert fatal["reason"].startswith(
        "the same failure twice before ready: exited_unexpectedly: the server exited"
    )
    assert w.store.load().last_failure == "exited_unexpectedly"


def test_a_server_that_keeps_dying_after_ready_is_a_crash_loop(tmp_path: Path):
    w = world(tmp_path)

    def start_then_die(server) -> None:
        w.on_start(server)
        w.events.call_at(w.clock.now + LOAD_S + WARM_S + 2.0, lambda: server.exit_by_itself(1))

    w.launcher.on_start = start_then_die
    run = runner(w, settings(tmp_path, max_restarts=3), watch_gpus=False)
    with capture_logs() as logs, pytest.raises(CrashLoop) as err:
        run.run()
    assert err.value.exit_code == 5
    assert len(w.launcher.started) == 4
    assert names(logs).count("ready") == 4
    delays = [e["delay_s"] for e in logs if e["event"] == "restarting"]
    assert delays == [10.0, 20.0, 40.0]
    assert names(logs)[-2:] == ["crash_loop", "fatal"]
    fatal = logs[-1]
    assert (fatal["event"], fatal["exit_code"]) == ("fatal", 5)
    assert fatal["reason"].startswith("crash loop: 3 restarts within 1800 s")
    assert w.store.load().last_failure == "exited_unexpectedly"


def test_sglang_rejecting_its_flags_ends_the_run_without_a_retry(tmp_path: Path):
    w = world(tmp_path)

    def reject(server) -> None:
        server.lines += [
            "usage: launch_server.py [-h] ...",
            "launch_server.py: error: unrecognized arguments: --x",
        ]
        w.events.call_at(w.clock.now + 0.5, lambda: server.exit_by_itself(2))

    w.launcher.on_start = reject
    run = runner(w, settings(tmp_path), watch_gpus=False)
    with pytest.raises(ServerArgsRejected) as err:
        run.run()
    assert err.value.exit_code == 3
    assert "unrecognized arguments: --x" in str(err.value)
    assert len(w.launcher.started) == 1


def test_a_gpu_that_stays_held_is_reset_and_a_failed_reset_ends_the_run(tmp_path: Path):
    w = world(tmp_path)
    w.resetter = RecordingResetter(ok=False)

    def crash() -> None:
        w.hold_gpus(w.server, seconds=10_000.0)
        w.server.crash_rank(0)

    w.events.call_at(LOAD_S + WARM_S + 5.0, crash)
    run = runner(w, settings(tmp_path))
    with capture_logs() as logs, pytest.raises(GpuUnrecoverable) as err:
        run.run()
    assert err.value.exit_code == 6
    fatal = logs[-1]
    assert (fatal["event"], fatal["exit_code"]) == ("fatal", 6)
    assert "GPUs not released" in fatal["reason"]
    assert w.resetter.calls == [(0, "GPU-0"), (1, "GPU-1")]
    assert len(w.launcher.started) == 1, "never relaunched onto a dirty GPU"
    assert w.store.load().last_failure == "gpu_dirty"
    assert any("gpu unrecoverable" in m for m in w.notifier.messages)


def test_a_load_without_progress_is_restarted_and_one_past_the_hard_limit_ends(tmp_path: Path):
    w = world(tmp_path)
    w.load_s = 10_000.0  # never answers: the tree's memory never grows, no line is logged
    run = runner(
        w,
        settings(tmp_path, startup_stall_timeout_s=60.0, startup_timeout_s=100.0, max_restarts=1),
        watch_gpus=False,
    )
    with capture_logs() as logs, pytest.raises(StartupFailed) as stalled:
        run.run()
    causes = [e["cause"] for e in logs if e["event"] == "unhealthy"]
    assert causes == [FailureKind.STARTUP_STALL, FailureKind.STARTUP_STALL]
    assert "the same failure twice before ready: startup_stall" in str(stalled.value)

    w2 = world(tmp_path / "2")

    def chatty(server) -> None:
        # A log line every 30 s is progress: only the hard limit ends this load.
        for t in range(30, 200, 30):
            w2.events.call_at(w2.clock.now + t, lambda: server.lines.append("loading shard"))

    w2.launcher.on_start = chatty
    run2 = runner(
        w2, settings(tmp_path / "2", startup_stall_timeout_s=60.0, startup_timeout_s=100.0)
    )
    with pytest.raises(StartupFailed) as err:
        run2.run()
    assert err.value.exit_code == 4


def test_a_zombie_rank_is_a_dead_server_even_while_http_answers(tmp_path: Path):
    w = world(tmp_path)
    w.events.call_at(LOAD_S + WARM_S + 5.0, lambda: w.server.set_rank_state(0, "Z"))
    w.events.at(60.0, SIGTERM)
    run = runner(w, settings(tmp_path), watch_gpus=False)
    with capture_logs() as logs:
        assert run.run() == 0
    unhealthy = next(e for e in logs if e["event"] == "unhealthy")
    assert unhealthy["cause"] is FailureKind.RANK_ZOMBIE


def test_leftovers_of_an_earlier_run_are_killed_before_the_first_launch(tmp_path: Path):
    w = world(tmp_path)
    w.processes.add(FakeProc(pid=4444, title="sglang::scheduler_TP0", instance="unit"))
    w.events.at(1.0, SIGTERM)
    with capture_logs() as logs:
        assert runner(w, settings(tmp_path)).run() == 0
    assert w.processes.killed == [4444]
    order = [e["event"] for e in logs]
    assert order.index("leftovers_killed") < order.index("launching")


class FakeWatchdog:
    """What the memory watchdog does to a leaking server: kill the whole tree, post the event
    (or, with `terminate`, SIGTERM first and let the exit follow)."""

    def __init__(self, w: World, after_s: float, *, terminate: bool = False) -> None:
        self.w = w
        self.after_s = after_s
        self.terminate = terminate
        self.stopped = 0

    def __call__(self, server, post, info):  # a ComponentFactory
        if len(self.w.launcher.started) > 1:
            return None  # only the first launch leaks
        self.info = info

        def fire() -> None:
            reason = KillReason(FailureKind.MEMORY_KILL, "tree over budget")
            action = MemoryAction.TERMINATED if self.terminate else MemoryAction.KILLED
            if self.terminate:
                server.terminate(reason)
            else:
                server.kill_all(reason)
            post(
                WatchdogEvent(
                    action=action, failure=FailureKind.MEMORY_KILL, reason=reason.detail, at_s=0
                )
            )

        self.w.events.call_at(self.w.clock.now + self.after_s, fire)
        return self

    def start(self) -> None:
        pass

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stopped += 1


@pytest.mark.parametrize("terminate", [False, True])
def test_a_memory_kill_relaunches_with_a_smaller_hicache_size(tmp_path: Path, terminate: bool):
    w = world(tmp_path)
    run_settings = settings(tmp_path)
    guard = MemoryGuard(run_settings, w.store)
    dog = FakeWatchdog(w, after_s=LOAD_S + WARM_S + 2.0, terminate=terminate)
    plugins = Plugins(components=(dog,), death_hooks=(guard.on_death,))
    w.events.at(100.0, SIGTERM)
    with capture_logs() as logs:
        assert runner(w, run_settings, plugins=plugins).run() == 0
    failed = next(e for e in logs if e["event"] == "server_failed")
    assert failed["failure"] == "memory_kill"
    assert dog.info.fit is not None, "the launch's own pre-flight report travelled with it"
    # Llama-3-70B at TP 2: (128 + 128) × 4 KV heads × 80 layers × 2 B = 163,840 B per token;
    # 40 GB is 244,140 tokens plus the padding page.
    assert dog.info.fit.host_pool_bytes_per_rank == 244_141 * 163_840
    first, second = w.launcher.argvs
    assert first[-2:] == ("--hicache-size", "40")
    assert second[-2:] == ("--hicache-size", "30")
    assert w.store.load().hicache_size_override_gb == 30
    assert dog.stopped == 1


SIZING_LINES = [
    "[2026-12-01 05:00:00 TP0] Load weight end. elapsed=9.10 s, type=LlamaForCausalLM, "
    "avail mem=120.50 GB, mem usage=18.63 GB.",
    "[2026-12-01 05:00:01 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 612345, "
    "K size: 12.25 GB, V size: 12.25 GB",
]


def test_what_sglang_measured_is_filed_under_the_planned_deployment_at_ready(tmp_path: Path):
    w = world(tmp_path)
    w.launcher.output = SIZING_LINES
    run = runner(w, settings(tmp_path))
    w.events.at(LOAD_S + WARM_S + 5.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    measured = next(e for e in logs if e["event"] == "sizing_measured")
    assert measured["device_tokens"] == 612_345
    records, problem = load_records(tmp_path)
    assert problem is None
    (record,) = records
    assert record.deployment == run.fit.deployment  # type: ignore[union-attr]
    assert record.measurement.weights_bytes == int(18.63 * GiB)
    assert record.settings["kv_cache_dtype"] == "auto"


def test_a_launch_without_sizing_lines_files_nothing(tmp_path: Path):
    w = world(tmp_path)
    run = runner(w, settings(tmp_path))
    w.events.at(LOAD_S + WARM_S + 5.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    assert any(e["event"] == "sizing_not_measured" for e in logs)
    assert load_records(tmp_path) == ((), None)


def test_a_rank_s_exit_is_acted_on_when_it_happens_not_at_the_next_tick(tmp_path: Path):
    """The tree's exit watcher wakes the loop (a WakeEvent); the 1 s tick would be later."""
    w = world(tmp_path)
    run = runner(w, settings(tmp_path))
    crash_at = LOAD_S + WARM_S + 10.25  # between two 1 s ticks
    killed_at: list[float] = []

    def crash() -> None:
        server = w.server
        kill_all = server.kill_all

        def timed_kill(reason: KillReason) -> tuple[int, ...]:
            killed_at.append(w.clock.now)
            return kill_all(reason)

        server.kill_all = timed_kill  # type: ignore[method-assign]
        server.crash_rank(1)
        assert server.notify_exit is not None  # the runner asked to hear of exits
        server.notify_exit()

    w.events.call_at(crash_at, crash)
    w.events.at(crash_at + 30.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    assert killed_at[0] == crash_at
    unhealthy = next(e for e in logs if e["event"] == "unhealthy")
    assert unhealthy["cause"] == "rank_crash"


def test_a_health_path_the_server_does_not_have_ends_the_run_as_bad_config(tmp_path: Path):
    w = world(tmp_path)
    w.events.call_at(LOAD_S + 0.5, lambda: setattr(w.probe, "answer", HealthStatus.NOT_FOUND))
    run = runner(w, settings(tmp_path), watch_gpus=False)
    with capture_logs() as logs, pytest.raises(ConfigError) as err:
        run.run()
    assert err.value.exit_code == 2
    assert "answers 404 on the health path" in str(err.value)
    assert len(w.launcher.started) == 1, "a wrong path never heals: no restart"
    assert w.launcher.last.poll() is not None
    assert names(logs)[-2:] == ["unhealthy", "fatal"]
    assert w.store.load().last_failure == "health_path_missing"


def test_the_shared_memory_of_every_gone_tree_is_swept(tmp_path: Path):
    w = world(tmp_path)
    earlier = RunState(instance="unit", server_pids=(ProcessRef(pid=4444, start_ticks=77),))
    w.store.save(earlier)
    w.events.call_at(LOAD_S + WARM_S + 1.0, lambda: w.server.crash_rank(0))
    w.events.at(LOAD_S + WARM_S + 30.0, SIGTERM)
    assert runner(w, settings(tmp_path), watch_gpus=False).run() == 0
    first, second = w.launcher.started
    assert w.swept[0] == {4444: 77}, "the earlier supervisor's tree, before the first launch"
    # Each launch's tree once it is gone (the crashed rank included), the stopped one last.
    assert w.swept[1:] == [first.seen, second.seen]
    assert first.seen.keys() >= {first.pid, first.pid + 1, first.pid + 2}


def test_the_ledger_holds_the_plan_from_the_preflight_until_ready_and_again_per_relaunch(
    tmp_path: Path,
):
    w = world(tmp_path)
    w.events.call_at(LOAD_S + WARM_S + 1.0, lambda: w.server.crash_rank(0))
    w.events.at(LOAD_S + WARM_S + 30.0, SIGTERM)
    run = runner(w, settings(tmp_path), watch_gpus=False)
    assert run.run() == 0
    assert run.fit is not None
    planned = run.fit.host_required_bytes
    kinds = [c[0] for c in w.ledger.calls]
    # gate: set; loading: pinned updates; ready: drop; relaunch: set again; ...; end: drop.
    assert w.ledger.calls[0] == ("set", planned, 0)
    first_drop = kinds.index("drop")
    assert first_drop > 1, "no pinned update while loading"
    assert all(c[:2] == ("set", planned) for c in w.ledger.calls[1:first_drop])
    assert w.ledger.calls[first_drop + 1] == ("set", planned, 0)
    assert kinds.count("drop") >= 3
    assert kinds[-1] == "drop"


def test_the_tree_s_pinned_bytes_reach_the_ledger_only_while_starting(tmp_path: Path):
    """The tick that makes the server ready also reads the pinned bytes, after the drop: an
    update then (ticks a second apart on a loaded host) kept the entry for the whole run."""
    w = world(tmp_path)
    w.events.at(LOAD_S + WARM_S + 30.0, SIGTERM)
    run = runner(w, settings(tmp_path), watch_gpus=False)
    assert run.run() == 0
    calls = len(w.ledger.calls)
    for state in (ServerState.READY, ServerState.UNHEALTHY, ServerState.STOPPED):
        run.state = state
        run._last_pin_s = -1e9  # a second and more since the last update
        run._note_pinned(1 << 30)
    assert len(w.ledger.calls) == calls
    run.state = ServerState.LOADING
    run._note_pinned(1 << 30)
    assert w.ledger.calls[-1][2] == 1 << 30
