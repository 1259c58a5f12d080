"""Wait until the leader's address resolves: in a LeaderWorkerSet the workers often start before
the leader pod's DNS record exists (its headless service publishes it once the pod has an IP).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from supervisor.core.ports import Clock
from supervisor.errors import ConfigError

log = structlog.get_logger("supervisor.group")

RESOLVE_EVERY_S = 2.0


def format_duration(seconds: float) -> str:
    """10 min, 90 s, 1.5 h: for messages people read."""
    if seconds >= 3600 and seconds % 360 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 6 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def wait_until_resolved(
    host: str,
    *,
    clock: Clock,
    timeout_s: float,
    resolves: Callable[[str], bool],
    every_s: float = RESOLVE_EVERY_S,
) -> None:
    """Return once `host` resolves; ask every `every_s` on `clock` (the runner's EventClock: a
    stop signal ends the wait with StopRequested).

    Raises:
        ConfigError: still unresolved after `timeout_s`.
    """
    started = clock.monotonic()
    if resolves(host):
        return
    log.info("group_leader_resolving", leader=host, timeout_s=timeout_s)
    while True:
        waited = clock.monotonic() - started
        if waited >= timeout_s:
            raise ConfigError(
                f"the leader address {host} does not resolve after {format_duration(timeout_s)} "
                "([group] resolve_timeout)"
            )
        clock.sleep(min(every_s, timeout_s - waited))
        if resolves(host):
            log.info(
                "group_leader_resolved", leader=host, waited_s=round(clock.monotonic() - started, 1)
            )
            return
