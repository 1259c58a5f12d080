"""What a reload (SIGHUP) changes, and when each change takes effect (pure).

Settings are compared as flat `section.key` maps (the TOML spelling: `run.health_interval`).
Each key takes effect at one of three moments:

- now: read at each use by the run loop, the health monitor, the memory watchdog or the hooks
  (health checks, restart budget, stop grace, watchdog levels, log level, hooks);
- at the next launch of the server: its argv, command and environment, and what the pre-flight
  reads before a launch (`[server]`, `[host]`, `[preflight]`, ...);
- at the next start of the supervisor: everything it sets up once (state directory, cgroup, GPU
  access, log format, the ledger, and any key not listed here).

A key this table does not know waits for the next start: claiming a change took effect when
nothing reads it again would be a lie.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum


class Applies(str, Enum):
    NOW = "now"
    NEXT_LAUNCH = "next_launch"
    NEXT_START = "next_start"


_NOW = frozenset(
    {
        *(
            f"run.{key}"
            for key in (
                "health_interval",
                "health_timeout",
                "failure_threshold",
                "startup_timeout",
                "startup_stall_timeout",
                "stop_grace",
                "worker_stop_grace",
                "backoff_initial",
                "backoff_max",
                "stable_after",
                "max_restarts",
                "restart_window",
                "log_level",
                "restart_on_reload",
            )
        ),
        *(
            f"watchdog.{key}"
            for key in (
                "warn",
                "warn_percent",
                "terminate",
                "terminate_percent",
                "kill",
                "kill_percent",
                "tree_margin",
                "tree_margin_percent",
                "warn_ticks",
                "psi_full_warn_percent",
                "terminate_grace",
                "ramp_gb_per_second",
                "min_interval",
                "max_interval",
                "shrink_factor",  # read at the next memory kill
                "min_hicache_size",
            )
        ),
    }
)
_NOW_SECTIONS = frozenset({"hooks"})
_NEXT_LAUNCH = frozenset(
    {
        "run.health_path",  # the probe's URL is built per launch
        "run.auto_size",
        "run.force",
        "run.oom_score_adj",
        "watchdog.enabled",  # the watchdog is started per launch
        "watchdog.incident_log_lines",
        "watchdog.shrink_expires",
    }
)
_NEXT_LAUNCH_SECTIONS = frozenset({"server", "host", "preflight"})
# Set up once at start, though their section is read per launch: the ledger is opened and the
# server's credentials resolved when the supervisor starts.
_NEXT_START = frozenset({"preflight.ledger_dir", "server.user", "server.group"})


def applies(key: str) -> Applies:
    """When a change of `key` (`section.key`) takes effect."""
    section = key.partition(".")[0]
    if key in _NEXT_START:
        return Applies.NEXT_START
    if key in _NOW or section in _NOW_SECTIONS:
        return Applies.NOW
    if key in _NEXT_LAUNCH or section in _NEXT_LAUNCH_SECTIONS:
        return Applies.NEXT_LAUNCH
    return Applies.NEXT_START


@dataclass(frozen=True, slots=True, kw_only=True)
class ReloadPlan:
    """The changed keys by when they take effect; `restart_server`: drain and relaunch now."""

    now: tuple[str, ...] = ()
    next_launch: tuple[str, ...] = ()
    next_start: tuple[str, ...] = ()
    restart_server: bool = False

    @property
    def changed(self) -> tuple[str, ...]:
        return (*self.now, *self.next_launch, *self.next_start)


def plan_reload(
    old: Mapping[str, object], new: Mapping[str, object], *, restart_on_reload: bool
) -> ReloadPlan:
    """Which keys differ between `old` and `new`, sorted by when they take effect.

    A key present on one side only counts as changed. With `restart_on_reload` a change that
    waits for the next launch restarts the server now instead.
    """
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    by_when: dict[Applies, list[str]] = {when: [] for when in Applies}
    for key in changed:
        by_when[applies(key)].append(key)
    launch = tuple(by_when[Applies.NEXT_LAUNCH])
    return ReloadPlan(
        now=tuple(by_when[Applies.NOW]),
        next_launch=launch,
        next_start=tuple(by_when[Applies.NEXT_START]),
        restart_server=restart_on_reload and bool(launch),
    )
