"""A Runner wired to the fakes of tests/fakes: a fake clock in seconds that jumps, servers that
load, crash and exit on cue, GPUs scripted on that clock. No process, no sleep."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from supervisor.config import (
    GpuConfig,
    HostConfig,
    PreflightConfig,
    RunConfig,
    RunSettings,
    ServerConfig,
    SupervisorConfig,
)
from supervisor.core.gpu_health import HealthSnapshot
from supervisor.core.lifecycle import HealthStatus
from supervisor.core.readings import GpuState
from supervisor.core.units import GB, GiB
from supervisor.run.plugins import Plugins, RunnerIO
from supervisor.run.runner import Runner
from supervisor.run.state import StateStore
from tests.fakes import (
    FakeClock,
    FakeEvents,
    FakeLauncher,
    FakeLedger,
    FakeProcesses,
    FakeServer,
    ImmediateExecutor,
    RecordingNotifier,
    RecordingResetter,
    ScriptedGpus,
    SwitchableProbe,
    gpu,
)

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "configs" / "models" / "llama-3-70b" / "config.json"
ARGS = ("--model-path", "m", "--tp", "2", "--enable-hierarchical-cache", "--hicache-size", "40")
LOAD_S = 3.0  # refused while loading, 503 for a second, then 200
WARM_S = 1.0


def settings(tmp_path: Path, args: Sequence[str] = ARGS, **run: Any) -> RunSettings:
    """Planning facts for the pre-flight (no /proc, no NVML): 445 GB and eight 80 GiB GPUs."""
    config = SupervisorConfig(
        server=ServerConfig(model_config=str(LLAMA)),
        host=HostConfig(
            mem_available_bytes=445 * GB,
            gpus=8,
            gpu_memory_bytes=141 * GiB,
            sglang_version="0.5.23",
        ),
        preflight=PreflightConfig(weights_bytes=40 * GB),
        run=RunConfig(name="unit", **run),
        gpu=GpuConfig(release_timeout_s=30.0),
    )
    return RunSettings(
        config=config, server_command=("sglang",), server_args=tuple(args), state_dir=tmp_path
    )


@dataclasses.dataclass
class World:
    """Everything the runner touches, as fakes the test drives."""

    clock: FakeClock
    events: FakeEvents
    launcher: FakeLauncher
    processes: FakeProcesses
    notifier: RecordingNotifier
    probe: SwitchableProbe
    store: StateStore
    # GPU index -> (the PIDs NVML lists on it, the time its memory is released)
    held: dict[int, tuple[tuple[int, ...], float]] = dataclasses.field(default_factory=dict)
    resetter: RecordingResetter | None = None
    load_s: float = LOAD_S
    swept: list[dict[int, int]] = dataclasses.field(default_factory=list)  # shm sweeps asked
    ledger: FakeLedger = dataclasses.field(default_factory=FakeLedger)

    def gpus(self, now: float) -> tuple[GpuState, ...]:
        """Eight GPUs, idle but for what `held` says."""
        out = []
        for index in range(8):
            pids, until = self.held.get(index, ((), 0.0))
            out.append(gpu(index, 40 * GB, *pids) if now < until else gpu(index, 0))
        return tuple(out)

    def hold_gpus(self, server: FakeServer, seconds: float) -> None:
        """The server's ranks keep GPUs 0 and 1 listed and used for `seconds` from now."""
        ranks = tuple(server.ranks)
        for index, pid in enumerate(ranks):
            self.held[index] = ((pid,), self.clock.now + seconds)

    def on_start(self, server: FakeServer) -> None:
        """A launched server loads: refused for load_s, then 503 (warming), then 200."""
        now = self.clock.now
        self.probe.answer = HealthStatus.REFUSED
        self.events.call_at(now + self.load_s, self._answer(HealthStatus.WARMING))
        self.events.call_at(now + self.load_s + WARM_S, self._answer(HealthStatus.READY))

    def _answer(self, status: HealthStatus) -> Callable[[], None]:
        def set_answer() -> None:
            self.probe.answer = status

        return set_answer

    @property
    def server(self) -> FakeServer:
        return self.launcher.last


def world(tmp_path: Path) -> World:
    clock = FakeClock(start_s=0.0)
    w = World(
        clock=clock,
        events=FakeEvents(clock),
        launcher=FakeLauncher(ranks=2),
        processes=FakeProcesses(self_pid=1),
        notifier=RecordingNotifier(watchdog_interval_s=15.0),
        probe=SwitchableProbe(),
        store=StateStore(tmp_path, clock=clock),
    )
    w.launcher.on_start = w.on_start
    return w


def runner(
    w: World,
    run_settings: RunSettings,
    *,
    plugins: Plugins | None = None,
    watch_gpus: bool = True,
    gpus: Callable[[float], tuple[GpuState, ...] | None] | None = None,
    health: Callable[[float], HealthSnapshot | None] = lambda _now: None,
) -> Runner:
    """The runner over the world's fakes; `gpus` replaces what NVML answers (World.gpus),
    `health` its health read (default: none)."""
    io = RunnerIO(
        clock=w.clock,
        events=w.events,
        launcher=w.launcher,
        processes=w.processes,
        notifier=w.notifier,
        probe_factory=lambda plan: w.probe,
        sensor=ScriptedGpus(w.clock, gpus or w.gpus, health) if watch_gpus else None,
        resetter=w.resetter,
        probe_executor=ImmediateExecutor,
        sweep_shm=lambda seen: w.swept.append(dict(seen)),
        reservations=w.ledger,
    )
    w.store.ensure_writable()
    return Runner(run_settings, w.store, io, plugins)


def names(logs: Sequence[Mapping[str, object]]) -> list[object]:
    """The story's state changes (the events the runner logs on each transition)."""
    wanted = {
        "launching",
        "loading",
        "warming",
        "ready",
        "unhealthy",
        "restarting",
        "gpu_release_done",
        "stopping",
        "stopped",
        "fatal",
        "crash_loop",
    }
    return [e["event"] for e in logs if e["event"] in wanted]
