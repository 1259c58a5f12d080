"""Before and at a launch: the server's command and environment, the pre-flight gate (with
--auto-size / --force), the start itself, and the state file's record of the run (the
watchdog's --hicache-size override: run/override.py). The loop that uses them is
supervisor/run/runner.py.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import dataclasses
import os
import shutil
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from supervisor.adapters.procfs import INSTANCE_ENV, RUN_ENV, SUPERVISOR_ENV
from supervisor.config import RunSettings
from supervisor.core import sglang_facts
from supervisor.core.autosize import decide_auto_size, is_memory_check
from supervisor.core.checks import FitReport, Status
from supervisor.core.events import KillReason
from supervisor.core.ledger import Reservation
from supervisor.core.measured import Measurement, Record, device_settings
from supervisor.core.ports import (
    Clock,
    GpuSensor,
    LaunchedServer,
    Processes,
    Reservations,
    ServerLauncher,
)
from supervisor.core.redact import redact_env, redact_line, redact_words
from supervisor.core.sglang_args import LaunchPlan, redact_argv, with_flag_value
from supervisor.errors import ConfigError, PreflightFailed
from supervisor.preflight import run_preflight
from supervisor.preflight.health import HealthGate
from supervisor.preflight.measurements import save_record
from supervisor.preflight.reader import read_plan
from supervisor.run import gpu_gate
from supervisor.run.death import wait_tree_gone
from supervisor.run.state import ProcessRef, StateStore

log = structlog.get_logger("supervisor.run")

# SGLang's crash path waits ~65 s (py-spy dump + CUDA core dump) with the GPUs held
# (docs/sglang.md §3.1); off unless [server] crash_dumps = true.
CRASH_DUMP_ENV = dict.fromkeys(sglang_facts.CRASH_DUMP_ENV, "0")
# systemd's variables are for the supervisor only (NotifyAccess=main): the server must not ping.
_SYSTEMD_ONLY_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
# The server's output lines kept for classification and incident files, at least.
MIN_TAIL_LINES = 200
# The output thread waits at most this long for start_server to learn the server's PID (it
# takes microseconds: Popen has returned before that thread exists).
PID_WAIT_S = 5.0


def default_server_command() -> tuple[str, ...]:
    return (sys.executable, "-m", "sglang.launch_server")


def check_server_command(command: Sequence[str]) -> None:
    """Raises ConfigError naming the path and the reason when the command cannot be executed."""
    if not command:
        raise ConfigError("the server command is empty ([server] command or --server-command)")
    exe = command[0]
    if "/" not in exe:
        if shutil.which(exe) is None:
            raise ConfigError(f"server command {exe!r}: not found on PATH")
        return
    path = Path(exe)
    if not path.exists():
        raise ConfigError(f"server command {exe}: no such file")
    if path.is_dir() or not os.access(path, os.X_OK):
        raise ConfigError(f"server command {exe}: not an executable file (permission denied)")


def server_env(
    settings: RunSettings,
    run_id: str,
    *,
    supervisor_mark: str,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The server's environment: ours + [server] env + crash-dump switches + run markers."""
    env = dict(os.environ if base is None else base)
    for name in _SYSTEMD_ONLY_ENV:
        env.pop(name, None)
    extra = dict(settings.config.server.env)
    if not settings.config.server.crash_dumps:
        env.update({k: v for k, v in CRASH_DUMP_ENV.items() if k not in extra})
    env.update(extra)
    env[INSTANCE_ENV] = settings.instance
    env[RUN_ENV] = run_id
    env[SUPERVISOR_ENV] = supervisor_mark
    return env


def describe_settings(settings: RunSettings, plan: LaunchPlan) -> dict[str, Any]:
    """The effective settings for the one `settings` log event, secrets redacted."""
    return {
        "server_command": list(redact_words(redact_argv(settings.server_command))),
        "server_args": list(redact_argv(settings.server_args)),
        "sglang_rules": settings.reader.rules.describe,
        "sglang_config_file": settings.reader.yaml_path,
        "argv_warnings": list(settings.reader.notes(plan)),
        "server_env": redact_env(settings.config.server.env),
        "crash_dumps": settings.config.server.crash_dumps,
        "state_dir": str(settings.state_dir),
        "gpu_backend": settings.config.gpu.backend,
        "gpus": list(plan.local_gpu_ids()),
        "local_ranks": plan.local_ranks,
        "run": {k: v for k, v in dataclasses.asdict(settings.run).items() if k not in ("name",)},
    }


def resolve_gpu_backend(backend: str) -> str:
    """`auto` -> nvml when libnvidia-ml is installed, else none. Decided without nvmlInit in the
    supervisor process (NVML can hang after GPU faults; the guard worker isolates it)."""
    if backend != "auto":
        return backend
    return "nvml" if ctypes.util.find_library("nvidia-ml") else "none"


def _failed(report: FitReport) -> list[str]:
    return [c.detail for c in report.checks if c.status is Status.FAIL]


def preflight_gate(
    settings: RunSettings,
    argv: Sequence[str],
    sensor: GpuSensor | None,
    reservations: Reservations | None = None,
) -> tuple[tuple[str, ...], FitReport | None]:
    """Run the pre-flight; the argv to launch (maybe auto-sized) and the report it rests on.

    With a ledger, the pre-flight counts what other instances starting on this host planned
    and have not pinned yet, and a launch that goes ahead records its own plan there: both
    under the ledger's lock, so two instances starting together never both take the same
    memory.

    Raises:
        PreflightFailed: no fit, and neither --auto-size could fix it nor --force was given.
        ConfigError: the pre-flight could not run (bad argv, model config not found) without
            --force.
    """
    book_cm = reservations.session() if reservations is not None else contextlib.nullcontext()
    with book_cm as book:
        reserved = book.others() if book is not None else ()
        chosen, report = _gate(settings, argv, sensor, reserved)
        if book is not None and report is not None and report.host_required_bytes:
            book.set(report.host_required_bytes)
    return chosen, report


def relaunch_gate(
    settings: RunSettings,
    plan: LaunchPlan,
    sensor: GpuSensor | None,
    fit: FitReport | None,
    book: Reservations | None,
) -> None:
    """Before a relaunch with the argv the pre-flight passed: the GPU health gate again, and
    the ledger's plan (a relaunch pins it all over again).

    Raises:
        PreflightFailed: a target GPU fails the health gate (enforce), no --force.
    """
    gpu_gate.check_before_relaunch(settings, plan.local_gpu_ids(), sensor)
    if book is not None and fit is not None and fit.host_required_bytes:
        book.set(fit.host_required_bytes)


def _gate(
    settings: RunSettings,
    argv: Sequence[str],
    sensor: GpuSensor | None,
    reserved: Sequence[Reservation],
) -> tuple[tuple[str, ...], FitReport | None]:
    run = settings.run
    health: list[HealthGate] = []  # the GPU health gate: read (and logged) once per gate

    def preflight(args: Sequence[str]) -> FitReport:
        if not health:
            targets = read_plan(settings.reader, args).local_gpu_ids()
            health.append(gpu_gate.read_gate(settings, targets, sensor))
        return run_preflight(
            settings.config,
            args,
            gpu_sensor=sensor,
            config_dir=settings.config_dir,
            reader=settings.reader,
            state_dir=settings.state_dir,
            reserved=reserved,
            health=health[0],
        )

    try:
        report = _reported(preflight(argv))
    except ConfigError as exc:
        if not run.force:
            raise
        log.warning("preflight_skipped", reason=str(exc), forced=True)
        return tuple(argv), None
    if report.fits:
        log.info("preflight_passed", required_bytes=report.host_required_bytes)
        return tuple(argv), report
    why_not = "--auto-size is off"
    if run.auto_size:
        sized, report, why_not = _auto_size(settings, argv, report, preflight)
        if sized is not None:
            return sized, report
    if run.force:
        log.warning("preflight_failed_forced", failed_checks=_failed(report))
        return tuple(argv), report
    refusal = PreflightFailed(_refusal(report, why_not, auto_size=run.auto_size))
    refusal.detail_logged = True  # the table: the preflight_report event, as fields
    refusal.fit = report
    raise refusal


def _reported(report: FitReport) -> FitReport:
    """`report` as the `preflight_report` event (the --json schema: the verdict, the checks,
    the numbers in bytes), so a structured log holds the pre-flight as data, never as a table."""
    (log.info if report.fits else log.warning)("preflight_report", **report.to_json())
    return report


def _auto_size(
    settings: RunSettings,
    argv: Sequence[str],
    report: FitReport,
    preflight: Callable[[Sequence[str]], FitReport],
) -> tuple[tuple[str, ...] | None, FitReport, str]:
    """(the argv with a smaller --hicache-size, its report, "") when that fits; else (None,
    the report to refuse with, why not)."""
    decision = decide_auto_size(report, settings.reader.plan(argv))
    if decision.size_gb is None:
        return None, report, decision.reason
    sized = with_flag_value(argv, "--hicache-size", str(decision.size_gb))
    log.warning(
        "auto_sized",
        hicache_size_gb=decision.size_gb,
        failed_checks=_failed(report),
        argv=list(redact_argv(sized)),
    )
    again = _reported(preflight(sized))
    if again.fits or settings.run.force:
        return sized, again, ""
    return None, again, f"--hicache-size {decision.size_gb} does not fit either"


def _refusal(report: FitReport, why_not: str, *, auto_size: bool) -> str:
    """The refusal, naming what failed; --auto-size is offered only where it could help. Its
    first line is the `fatal` event's reason; the table below it is for a terminal."""
    failed = [c for c in report.checks if c.status is Status.FAIL]
    if all(is_memory_check(c) for c in failed) and not auto_size:
        why_not = "--auto-size to launch with the largest safe --hicache-size"
    names = ", ".join(c.name for c in failed)
    return (
        f"the pre-flight refuses this launch: {names} failed ({why_not}; --force to launch "
        f"anyway)\n{report.render_table()}"
    )


def start_server(
    launcher: ServerLauncher,
    settings: RunSettings,
    run_id: str,
    argv: Sequence[str],
    *,
    redact: Callable[[str], str],
    supervisor_mark: str,
    on_line: Callable[[str], None] | None = None,
) -> LaunchedServer:
    """Start the server command with `argv`; its output goes to our log as server_output, and
    each line to `on_line` (the sizing reader).

    Raises:
        ConfigError: the command cannot be executed (the path and the reason named).
    """
    command = (*settings.server_command, *argv)
    # The output thread's lines carry run_id and server_pid like every event after the launch:
    # that thread sees none of this one's context, and the PID is known once start returns.
    bound: dict[str, object] = {"run_id": run_id}
    started = threading.Event()
    starter = threading.get_ident()

    def sink(line: str) -> None:
        if threading.get_ident() != starter:
            started.wait(PID_WAIT_S)
        log.info("server_output", line=line, **bound)
        if on_line is not None:
            on_line(line)

    try:
        server = launcher.start(
            command,
            server_env(settings, run_id, supervisor_mark=supervisor_mark),
            run_id=run_id,
            sink=sink,
            redact=redact,
            oom_score_adj=settings.run.oom_score_adj,
            tail_lines=max(MIN_TAIL_LINES, settings.config.watchdog.incident_log_lines),
        )
        bound["server_pid"] = server.pid
    except OSError as exc:
        raise ConfigError(
            f"server command {command[0]} cannot be executed: {exc.strerror or exc}"
        ) from None
    finally:
        started.set()
    return server


def record_launch(
    store: StateStore,
    settings: RunSettings,
    server: LaunchedServer,
    *,
    processes: Processes,
    clock: Clock,
    restart_count: int,
    gpu_indices: Sequence[int],
) -> None:
    """The new run in the state file: run id, restart count, the server's PID (start time).
    Anything failing here kills the tree first: nothing may run that nobody watches."""
    try:
        marks = processes.marks(server.pid)
        ref = ProcessRef(
            pid=server.pid, start_ticks=marks.start_ticks if marks else 0, title="server"
        )
        store.update(
            lambda state: dataclasses.replace(
                state,
                instance=settings.instance,
                run_id=server.run_id,
                supervisor_pid=processes.self_pid,
                restart_count=restart_count,
                server_pids=(ref,),
                gpu_indices=tuple(gpu_indices),
            )
        )
    except BaseException:
        reason = KillReason(None, "supervisor error")
        server.kill_all(reason)
        wait_tree_gone(server, clock, reason)
        server.close()
        raise


def record_tree(store: StateStore, server: LaunchedServer) -> None:
    """Every PID of the ready tree with its start time: a later run finds leftovers by them."""
    refs = tuple(
        ProcessRef(pid=p.pid, start_ticks=p.start_ticks, title=redact_line(p.title)[:60])
        for p in server.tree()
        if p.start_ticks
    )
    store.update(lambda state: dataclasses.replace(state, server_pids=refs))


def record_measurement(
    settings: RunSettings,
    fit: FitReport | None,
    argv: Sequence[str] | None,
    measured: Measurement,
    at: float,
) -> None:
    """File what SGLang measured at this launch under the deployment the pre-flight planned, for
    the next pre-flight (preflight/measurements.py)."""
    if fit is None or fit.deployment is None or argv is None or not measured.complete:
        log.info("sizing_not_measured", complete=measured.complete, preflight=fit is not None)
        return
    plan = settings.reader.plan(argv)
    if plan.on_cpu:
        measured = dataclasses.replace(measured, device="cpu")
    record = Record(
        deployment=fit.deployment,
        settings=device_settings(plan),
        measurement=measured,
        at=at,
    )
    save_record(settings.state_dir, record)
    log.info(
        "sizing_measured",
        device_tokens=measured.device_tokens,
        estimated_device_tokens=fit.device_tokens_per_rank,
        weights_bytes=measured.weights_bytes,
        pre_load_free_bytes=measured.pre_load_free_bytes,
        host_pool_tokens=measured.host_pool_tokens,
        device=measured.device,
    )
