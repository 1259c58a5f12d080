"""The restart-smaller override at a launch: the state file's `--hicache-size` applied to the argv
and shown with since when and until when, or dropped once `[watchdog] shrink_expires` has passed.
The override itself is set after a memory kill (memory/restart_smaller.py).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence

import structlog

from supervisor.config import RunSettings
from supervisor.core.sglang_args import with_flag_value
from supervisor.core.shrink import override_expired, override_expires_at
from supervisor.run.state import RunState, StateStore

log = structlog.get_logger("supervisor.run")


def utc_text(wall_s: float | None) -> str | None:
    """Epoch seconds as an ISO UTC time (None stays None)."""
    if wall_s is None:
        return None
    moment = datetime.datetime.fromtimestamp(wall_s, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def override_times(state: RunState, expires_s: float) -> dict[str, str | None]:
    """`since` and `expires` of the state's override, for the log and `run --dry-run`."""
    expires_at = override_expires_at(state.override_set_at, expires_s)
    if expires_at is not None:
        expires = utc_text(expires_at)
    elif expires_s > 0:
        expires = f"{expires_s:g} s after this start"  # set before its time was recorded
    else:
        expires = "never ([watchdog] shrink_expires is off)"
    return {"since": utc_text(state.override_set_at), "expires": expires}


def apply_override(
    argv: Sequence[str], state: RunState, *, expires_s: float = 0.0
) -> tuple[str, ...]:
    """The state file's --hicache-size override applied to `argv`, and said at every launch."""
    if state.hicache_size_override_gb is None:
        return tuple(argv)
    new = with_flag_value(argv, "--hicache-size", str(state.hicache_size_override_gb))
    log.warning(
        "hicache_override_applied",
        hicache_size_gb=state.hicache_size_override_gb,
        reason=state.override_reason,
        **override_times(state, expires_s),
        hint="`sglang-supervisor reset-state` clears it",
    )
    return new


def launch_override(settings: RunSettings, store: StateStore, now_s: float) -> tuple[str, ...]:
    """The server's argv for the next launch, with the state file's override unless it expired
    (then it is cleared from the state file: `hicache_override_expired`)."""
    expires_s = settings.config.watchdog.shrink_expires_s
    state = store.load()
    if state.hicache_size_override_gb is not None and expires_s > 0:
        if state.override_set_at is None:  # set by an older version: the time starts now
            state = store.update(lambda s: dataclasses.replace(s, override_set_at=now_s))
        elif override_expired(state.override_set_at, expires_s, now_s):
            log.info(
                "hicache_override_expired",
                hicache_size_gb=state.hicache_size_override_gb,
                since=utc_text(state.override_set_at),
                shrink_expires_s=expires_s,
            )
            state = store.update(
                lambda s: dataclasses.replace(
                    s, hicache_size_override_gb=None, override_reason=None, override_set_at=None
                )
            )
    return apply_override(settings.server_args, state, expires_s=expires_s)
