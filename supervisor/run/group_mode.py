"""Group mode in the run loop (docs/multi-node.md): one node of a multi-node SGLang group.

Each node does what it does on one box (cleanup, pre-flight, watchdog, GPU release), with
three differences:

- before the first launch it waits for the leader's address to resolve, and agrees the launch
  with every other node (supervisor/group/handshake.py);
- the leader opens SGLang's launch gate once its ranks wait at it (supervisor/group/gate.py);
- a death is never restarted in place: the other nodes' ranks still hold the old
  communicator, so the node files the death, releases its GPUs and exits 8, and the launcher
  (LeaderWorkerSet's RecreateGroupOnPodRestart) recreates the whole group.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

import structlog

from supervisor.adapters import group_http
from supervisor.adapters.clock import SystemClock
from supervisor.config import RunSettings
from supervisor.core.backoff import delay_before_start_s
from supervisor.core.checks import FitReport
from supervisor.core.events import Event
from supervisor.core.ports import Clock, Reservations, ServerHandle
from supervisor.errors import GroupMustRecreate, PreflightFailed
from supervisor.group.gate import GateHttp, GateOpener
from supervisor.group.peer import HEALTHZ_PATH, HealthGet, LeaderWatch, WatchTiming
from supervisor.group.resolve import wait_until_resolved
from supervisor.group.setup import describe, leader_url, single_node
from supervisor.run import launch
from supervisor.run.death import DeathReport
from supervisor.run.plugins import Component, ComponentFactory, LaunchInfo, Plugins

if TYPE_CHECKING:
    from supervisor.run.runner import Runner

log = structlog.get_logger("supervisor.run")


def announce(settings: RunSettings) -> None:
    """Say once at start whether this run is a node of a group, and whether it has a gate."""
    spec = settings.group
    if spec is None:
        if single_node(settings.config, os.environ):
            log.info("group_single_node", detail="a group of one node: supervised as one box")
        return
    log.info("group_detected", **describe(spec))
    if not (settings.reader.rules.gated_launch and spec.gate_port):
        why = (
            "[group] gate_port = 0"
            if settings.reader.rules.gated_launch
            else f"{settings.reader.rules.describe} has no --gated-launch-port (0.5.19 and later)"
        )
        log.warning(
            "group_gate_unavailable",
            reason=why,
            detail="the nodes launch on the group's decision alone, without SGLang's gate",
        )


def before_first_launch(runner: Runner) -> None:
    """Say whether this is a group's node; wait for the leader's address to resolve
    (StopRequested on a stop signal)."""
    announce(runner.settings)
    spec = runner.settings.group
    if spec is None:
        return
    wait_earned_backoff(runner)
    wait_until_resolved(
        spec.leader_host,
        clock=runner.wait_clock,
        timeout_s=runner.settings.config.group.resolve_timeout_s,
        resolves=group_http.resolves,
    )


def wait_earned_backoff(runner: Runner) -> None:
    """A group is recreated at once after a node's failure: the backoff that failure earned
    (the state file's restart budget, node-local) is waited here, so a group that keeps failing
    does not relaunch in a tight loop."""
    now_s = runner.clock.monotonic()
    delay_s = delay_before_start_s(runner.budget, now_s)
    if delay_s <= 0:
        return
    state = runner.store.load()
    log.warning(
        "group_start_delayed",
        delay_s=round(delay_s, 1),
        restarts_in_window=runner.budget.restarts_in_window(now_s),
        last_failure=state.last_failure,
        detail="the backoff of this node's last failure, waited before the group starts again",
    )
    runner.notifier.status(f"waiting {delay_s:.0f} s: backoff after {state.last_failure}")
    runner.wait_clock.sleep(delay_s)


def preflight_gate(
    runner: Runner, argv: Sequence[str], book: Reservations | None
) -> tuple[tuple[str, ...], FitReport | None]:
    """The pre-flight gate; in group mode before the first launch, then the group's decision:
    the argv every node agreed on.

    Raises:
        PreflightFailed: this node or another one does not fit (exit 1).
        GroupMustRecreate: the decision did not come in time (exit 8).
    """
    settings, sensor, handshake = runner.settings, runner.io.sensor, runner.io.group
    if settings.group is None or handshake is None or runner.launched_argv is not None:
        return launch.preflight_gate(settings, argv, sensor, book)
    try:
        chosen, fit = launch.preflight_gate(settings, argv, sensor, book)
    except PreflightFailed as refusal:
        handshake.refused_here(refusal, settings.reader.plan(argv), runner.wait_clock)
        raise
    try:
        plan = settings.reader.plan(chosen)
        return handshake.agree(chosen, fit, plan, runner.wait_clock), fit
    except GroupMustRecreate as exc:
        log.error("group_must_recreate", reason=str(exc))
        raise


def recreate(runner: Runner, death: DeathReport) -> NoReturn:
    """After a death in group mode (filed, its hooks run): release the GPUs as before a
    relaunch (resetting those a driver event asked for), then end the run with exit 8.

    Raises:
        GroupMustRecreate: always, once the GPUs are free.
        GpuUnrecoverable: a GPU stays dirty (exit 6 wins: the node needs an operator).
    """
    runner.plugins.before_relaunch(runner.release, death.pids, runner.wait_clock)
    runner.release.wait(death.pids, runner.wait_clock)
    kind, hint = death.classification
    log.error("group_must_recreate", failure=kind.value, hint=hint)
    raise GroupMustRecreate(f"the group must be recreated: {kind.value}: {hint}")


def group_plugins(settings: RunSettings, http: GateHttp | None = None) -> Plugins:
    """What group mode plugs into the loop: on the leader with a gate, the gate opener; on a
    worker, the watch of its leader."""
    factories = (gate_opener(settings, http), leader_watch(settings))
    return Plugins(components=tuple(f for f in factories if f is not None))


def leader_watch(
    settings: RunSettings, get: HealthGet | None = None, clock: Clock | None = None
) -> ComponentFactory | None:
    """On a worker: a component beside each launch that kills the tree once the leader's
    supervisor is lost (supervisor/group/peer.py)."""
    spec = settings.group
    if spec is None or spec.is_leader:
        return None
    url = leader_url(spec, settings.config, os.environ, HEALTHZ_PATH)
    run = settings.run
    timing = WatchTiming(run.health_interval_s, run.health_timeout_s, run.failure_threshold)
    ask = get or _get
    watch_clock = clock or SystemClock()

    def factory(server: ServerHandle, post: Callable[[Event], None], info: LaunchInfo) -> Component:
        return LeaderWatch(
            url, server, post, get=ask, timing=timing, clock=watch_clock, run_id=info.run_id
        )

    return factory


def _get(url: str, timeout_s: float) -> group_http.Answer:
    return group_http.get(url, timeout_s=timeout_s)


def gate_opener(settings: RunSettings, http: GateHttp | None = None) -> ComponentFactory | None:
    """On the leader with a gate: a component beside each launch that opens SGLang's gate."""
    spec = settings.group
    if spec is None or not spec.is_leader or not spec.gate_port:
        return None
    if not settings.reader.rules.gated_launch:
        return None
    gate_http = http or GateHttp(get=group_http.get, post=group_http.post_empty)

    def factory(
        server: ServerHandle, _post: Callable[[Event], None], info: LaunchInfo
    ) -> Component:
        return GateOpener(
            info.plan.host, spec.gate_port, gate_http, run_id=info.run_id, server_pid=server.pid
        )

    return factory
