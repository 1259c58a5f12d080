"""`sglang-supervisor demo`: the whole story on the built-in simulation, no GPU needed.

The seed box, simulated: Kimi-K2.5 on 8 × RTX PRO 6000 (96 GB) with 449 GB of RAM. The pre-flight
refuses `--hicache-size 300` (per rank, so 2.4 TB) and names the safe size; the supervisor
launches the simulated SGLang server with it; one rank starts leaking; the watchdog kills the
whole group before the limit; the GPUs are waited for (one stays stuck and gets the simulated
`nvidia-smi --gpu-reset`); the server comes back with a smaller cache. Real memory stays tiny: 64
KiB stand for a simulated GB.

How the simulation is watched (documented in the README): the ranks' host pools and the leak are
shared memory (RssShmem), scaled up by the same factor; the simulated MemAvailable is the box's
449 GB minus 4 GB for the OS minus that scaled charge. Everything else is the production code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import structlog

from supervisor.adapters.clock import SystemClock
from supervisor.core.readings import HostMemory, ProcessInfo
from supervisor.core.units import GB, KiB

if TYPE_CHECKING:
    from supervisor.adapters.events import QueueEvents as Events
    from supervisor.adapters.gpu_guard import GuardedGpuSensor
    from supervisor.config import RunSettings
    from supervisor.core.ports import GpuSensor
    from supervisor.run.runner import Runner
    from supervisor.run.state import StateStore

BOX_TOTAL_BYTES = 449 * GB
# The seed box: 449 GB of RAM, 445 GB MemAvailable before launch (kernel, page tables,
# the supervisor itself take the rest), so the pre-flight suggests the same safe size, 49.
OS_USED_BYTES = 4 * GB
GPUS = 8
GPU_TOTAL = "97887MiB"  # nvidia-smi memory.total of an RTX PRO 6000 Blackwell
GPU_TOTAL_BYTES = 97887 * 2**20
WEIGHTS_GB = 595  # Kimi-K2.5's checkpoint: INT4 experts, bf16 attention
REAL_BYTES_PER_GB = 64 * KiB  # 8 ranks × 40 GB of host pool = 20 MiB of real memory
ASKED_GB = 300
STUCK_GPU = 3
LEAK_RANK = 5
LEAK_GB_PER_S = 8.0

# configs/models/kimi-k2.5/config.json, shipped in the package beside this module (a test keeps
# the two equal): the geometry the pre-flight and the simulated server read; no checkpoint needed.
KIMI_K2_5_CONFIG = "demo_kimi_k2_5.json"


def kimi_k2_5() -> dict[str, Any]:
    text = resources.files("supervisor.commands").joinpath(KIMI_K2_5_CONFIG).read_text()
    config: dict[str, Any] = json.loads(text)
    return config


def scale_tree(tree: tuple[ProcessInfo, ...]) -> tuple[ProcessInfo, ...]:
    """The tree as the simulated box sees it: shared memory (pools, leak) scaled to GB."""
    factor = GB // REAL_BYTES_PER_GB
    return tuple(
        dataclasses.replace(p, rss_shmem_bytes=p.rss_shmem_bytes * factor, rss_file_bytes=0)
        for p in tree
    )


def simulated_host(tree: tuple[ProcessInfo, ...] | Any) -> HostMemory:
    """MemAvailable of the simulated box: total − OS − the (scaled) tree."""
    used = OS_USED_BYTES + sum(p.charged_bytes for p in tree)
    return HostMemory(total_bytes=BOX_TOTAL_BYTES, available_bytes=max(0, BOX_TOTAL_BYTES - used))


def instance_name(workdir: Path) -> str:
    """One instance per demo directory: a starting supervisor kills every live process carrying
    its instance's marker as a leftover, so two demos at once must not share a name."""
    return "demo-" + workdir.name.rsplit("-", 1)[-1]


def demo_config_text(workdir: Path, model_dir: Path) -> str:
    scenario = {
        "startup_s": 0.3,
        "warmup_s": 0.1,
        "runtime_gb": 1.0,
        "leak": {
            "rank": LEAK_RANK,
            "kind": "shmem",
            "after_s": 2.0,
            "bytes_per_s": int(LEAK_GB_PER_S * REAL_BYTES_PER_GB),
            "max_bytes": 200 * REAL_BYTES_PER_GB,
        },
        "gpu_release_delay_s": 1.0,
        "weight_bytes_per_rank": WEIGHTS_GB * GB // GPUS,
    }
    reset = f"{sys.executable} -m supervisor.testing.fake_gpu_reset {{index}}"
    return f"""
[server]
command = [{json.dumps(sys.executable)}, "-m", "supervisor.testing.fake_sglang"]
args = ["--model-path", {json.dumps(str(model_dir))}, "--tp-size", "{GPUS}", "--trust-remote-code",
        "--mem-fraction-static", "0.88", "--kv-cache-dtype", "bf16",
        "--enable-hierarchical-cache", "--hicache-size", "{ASKED_GB}", "--port", "{{port}}"]

[server.env]
FAKE_SGLANG_SCENARIO = {json.dumps(json.dumps(scenario))}
FAKE_SGLANG_BYTES_PER_GB = "{REAL_BYTES_PER_GB}"

[host]
mem_available = "{(BOX_TOTAL_BYTES - OS_USED_BYTES) // GB}GB"
gpus = {GPUS}
gpu_memory = "{GPU_TOTAL}"

[preflight]
weights = "{WEIGHTS_GB}GB"
# The simulated box's memory is not this host's: it claims nothing in the host-wide ledger.
ledger_dir = ""

[run]
name = {json.dumps(instance_name(workdir))}
state_dir = {json.dumps(str(workdir / "state"))}
backoff_initial = "1s"
health_interval = "1s"
stop_grace = "5s"
auto_size = true
log_format = "json"

[gpu]
backend = "sim"
release_timeout = "4s"
reset_command = {json.dumps(reset)}
"""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Error-level events the timeline already tells in its own words.
_SHOWN_ABOVE = ("server_killed", "server_failed", "unhealthy", "gpu_reset_failed")


class Timeline:
    """Turns the supervisor's structured log events into a short story, printed as it happens."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self.clock = SystemClock()
        self.started = self.clock.monotonic()
        self.echo = echo
        self.lines: list[str] = []
        self.readies = 0
        self.on_ready: list[Callable[[int], None]] = []
        self._waiting_shown = False

    def say(self, text: str) -> None:
        line = f"{self.clock.monotonic() - self.started:6.1f} s  {text}"
        self.lines.append(line)
        self.echo(line)

    def __call__(self, _logger: Any, _name: str, event: MutableMapping[str, Any]) -> Any:
        self.describe(event)
        raise structlog.DropEvent

    def describe(self, e: MutableMapping[str, Any]) -> None:
        name = e.get("event")
        if name == "auto_sized":
            self.say(f"pre-flight: launching with the safe --hicache-size {e['hicache_size_gb']}")
        elif name == "launching":
            argv = e.get("argv", [])
            size = argv[argv.index("--hicache-size") + 1] if "--hicache-size" in argv else "?"
            self.say(f"server launching: 8 ranks, --hicache-size {size} GB per rank")
        elif name == "ready":
            self.readies += 1
            self.say("server ready")
            for hook in self.on_ready:
                hook(self.readies)
        elif name == "server_killed" and e.get("cause") == "memory_kill":
            self.say(
                f"WATCHDOG: killed the whole group ({len(e.get('pids', []))} processes) at once: "
                f"{e.get('reason')}"
            )
        elif name == "server_tree_gone":
            self.say(f"every process of the tree gone {e.get('after_ms')} ms after the kill")
        elif name == "incident_written":
            self.say(f"incident report written: {Path(str(e.get('path'))).name} (--keep keeps it)")
        elif name == "server_failed":
            self.say(f"classified: {e.get('failure')}")
        elif name == "hicache_shrunk":
            self.say(
                f"restart smaller: --hicache-size {e.get('previous_gb')} -> "
                f"{e.get('hicache_size_gb')} GB per rank (kept in the state file)"
            )
        elif name == "gpu_release_waiting" and not self._waiting_shown:
            self._waiting_shown = True
            self.say("waiting for the GPUs to release the old run's memory")
        elif name == "gpu_reset_started":
            self.say(f"GPU {e.get('gpu')} still held with no process: running the reset command")
        elif name == "gpu_reset_done":
            self.say(f"GPU {e.get('gpu')} reset")
        elif name == "gpu_release_done":
            self.say(f"all 8 GPUs free after {e.get('elapsed_s')} s")
        elif name == "memory_warn":
            self.say(f"watchdog warning: {e.get('reason')}")
        elif name == "stopped":
            self.say("stopped cleanly")
        elif e.get("level") == "error" and name not in _SHOWN_ABOVE:
            self.say(f"{name}: {e.get('reason') or e.get('detail') or ''}")


def _make_gpu_stuck(state_dir: Path, index: int) -> None:
    """Mark the holdings on GPU `index` as stuck: after the holder dies its memory stays used
    with no process listed (driver-held), until the reset command runs."""
    from supervisor.testing import gpu_state

    for path in sorted((state_dir / gpu_state.HOLDERS_DIR).glob(f"gpu{index}-pid*.json")):
        data = json.loads(path.read_text())
        data["stuck"] = True
        gpu_state.write_json_atomic(path, data)


@contextmanager
def _demo_environment(keep: bool) -> Iterator[Path]:
    workdir = Path(tempfile.mkdtemp(prefix="sglang-supervisor-demo-"))
    saved = dict(os.environ)
    try:
        yield workdir
    finally:
        os.environ.clear()
        os.environ.update(saved)
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _prepare(workdir: Path) -> tuple[RunSettings, Path]:
    """The simulated model, GPUs and config in `workdir`; the run's settings and the GPU dir."""
    from supervisor.commands.run import build_settings
    from supervisor.config import load_config
    from supervisor.testing import gpu_state

    model_dir = workdir / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(kimi_k2_5()))
    gpus_dir = workdir / "gpus"
    gpu_state.create_gpus(
        gpus_dir, GPUS, total_bytes=GPU_TOTAL_BYTES, numa_nodes=2, name="NVIDIA RTX PRO 6000"
    )
    os.environ["FAKE_GPU_STATE_DIR"] = str(gpus_dir)  # read by the reset command too
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        os.environ.pop(name, None)
    config_path = workdir / "demo.toml"
    config_path.write_text(
        demo_config_text(workdir, model_dir).replace("{port}", str(_free_port()))
    )
    settings = build_settings(
        load_config(config_path),
        config_path=config_path,
        server_args=(),
        server_command=None,
        gpu_backend=None,
        run_options={},
    )
    return settings, gpus_dir


def _show_refusal(settings: RunSettings, sensor: GpuSensor, timeline: Timeline) -> None:
    """The pre-flight as it would answer without --auto-size: the refusal, in short."""
    from supervisor.errors import PreflightFailed
    from supervisor.run.launch import preflight_gate

    config = settings.config
    strict = dataclasses.replace(
        settings,
        config=dataclasses.replace(config, run=dataclasses.replace(config.run, auto_size=False)),
    )
    try:
        preflight_gate(strict, settings.server_args, sensor)
    except PreflightFailed as refused:
        timeline.say("pre-flight REFUSES the launch:")
        for line in str(refused).splitlines()[1:]:
            if any(k in line for k in ("host_memory", "FAIL", "safe", "suggest", "--hicache")):
                timeline.echo(f"           {line.strip()}")


def _supervise(
    settings: RunSettings, gpus_dir: Path, sensor: GuardedGpuSensor, timeline: Timeline
) -> tuple[int, StateStore]:
    """Run the production runner on the simulated box until the second `ready`."""
    from supervisor.adapters.events import QueueEvents, signal_event
    from supervisor.adapters.systemd import SdNotifier
    from supervisor.commands.run import build_runner
    from supervisor.errors import SupervisorError
    from supervisor.memory.guard import MemoryGuard
    from supervisor.run.state import StateStore

    store = StateStore(settings.state_dir)
    store.ensure_writable()
    guard = MemoryGuard(
        settings,
        store,
        gpu_snapshot=sensor.last_snapshot,
        read_host=simulated_host,
        tree_view=scale_tree,
    )
    events = QueueEvents()

    def on_ready(count: int) -> None:
        if count == 1:
            _make_gpu_stuck(gpus_dir, STUCK_GPU)
            timeline.say(f"rank {LEAK_RANK} will start leaking; GPU {STUCK_GPU} will stick")
        else:
            timeline.say("back in service with the smaller cache: stopping the demo")
            events.put(signal_event(signal.SIGTERM))

    timeline.on_ready.append(on_ready)
    runner = build_runner(settings, store, sensor, guard, notifier=SdNotifier({}), events=events)
    try:
        return run_with_signals(runner, events), store
    except SupervisorError as exc:
        timeline.say(f"supervisor stopped: {exc}")
        return int(exc.exit_code), store


def run_demo(echo: Callable[[str], None] = click.echo, keep: bool = False) -> int:
    """Run the story; returns the exit code (0 when everything happened as told)."""
    from supervisor.preflight.sensors import guarded_sensor

    with _demo_environment(keep) as workdir:
        settings, gpus_dir = _prepare(workdir)
        timeline = Timeline(echo)
        structlog.configure(
            processors=[structlog.processors.add_log_level, timeline],
            logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
            cache_logger_on_first_use=False,
        )
        echo(
            f"Simulated box: Kimi-K2.5 on {GPUS} × RTX PRO 6000 (96 GB), "
            f"{BOX_TOTAL_BYTES // GB} GB of RAM (no GPU used; "
            f"{REAL_BYTES_PER_GB // KiB} KiB of real memory per simulated GB)."
        )
        echo(f"Asked for: --tp-size 8 --hicache-size {ASKED_GB} (GB *per rank*)\n")
        sensor = guarded_sensor("sim", timeout_s=5.0, env={"FAKE_GPU_STATE_DIR": str(gpus_dir)})
        try:
            _show_refusal(settings, sensor, timeline)
            code, store = _supervise(settings, gpus_dir, sensor, timeline)
        finally:
            sensor.close()
        shrunk = store.load().hicache_size_override_gb
        ok = code == 0 and timeline.readies >= 2 and shrunk is not None
        echo("")
        echo(
            "Done: the group was killed before the host ran out, the stuck GPU was reset, and "
            f"the server came back with --hicache-size {shrunk}."
            if ok
            else f"The demo did not go as planned (exit {code}); see the timeline above."
        )
        if keep:
            echo(f"Files kept in {workdir}")
        return code if ok else 1


@click.command()
@click.option("--keep", is_flag=True, help="Keep the demo's files (state, incidents, config).")
def demo(keep: bool) -> None:
    """Run the supervisor's whole story on the simulated seed box (about 15 s, no GPU)."""
    sys.exit(run_demo(keep=keep))


def run_with_signals(runner: Runner, events: Events) -> int:
    """Run the loop as the tree's subreaper with the signals queued as events (the demo)."""
    from supervisor.adapters.events import install_signal_handlers, restore_signal_handlers
    from supervisor.adapters.server_process import become_subreaper

    previous = install_signal_handlers(events)
    become_subreaper()
    try:
        return runner.run()
    finally:
        restore_signal_handlers(previous)
