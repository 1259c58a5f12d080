"""Which containment a `run` uses: a cgroup of its own for the server tree when this host lets
the supervisor make one, else /proc (process group, subreaper, scans), said once in the log.

The groups are made under the supervisor's own cgroup, named per instance, after the instance's
lock is held (run/state.py `claim`), so emptying a leftover `server` or `helpers` group of a
crashed supervisor can never hit another live supervisor's tree. They are removed when `run`
ends, after killing what is still in them: a tokenizer worker, or a hook or reset command that
outlived its own kill (adapters/command.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from supervisor.adapters.cgroup import CgroupError, InstanceCgroups, ServerCgroup, discover

log = structlog.get_logger("supervisor.run")

# How long a leftover tree in the group gets to die after cgroup.kill (unpinning can take tens
# of seconds for hundreds of GB).
LEFTOVER_WAIT_S = 60.0
# The same for the helpers' groups (a hook, a reset command): only a process stuck in the driver
# outlives SIGKILL for long, and waiting cannot help it.
HELPER_WAIT_S = 10.0


@dataclass
class Containment:
    mode: str  # "cgroup v2 + v1 memory", "cgroup v2", ... or "/proc"
    server: ServerCgroup | None = None
    groups: InstanceCgroups | None = None
    reason: str | None = None  # why /proc, when it is
    leftovers: list[int] = field(default_factory=list)

    @property
    def helpers_dir(self) -> Path | None:
        """Where the operator's commands get their cgroup leaves (None: /proc mode)."""
        return self.groups.helpers_dir if self.groups is not None else None


def contain(instance: str, setting: str, *, move_self: bool = True) -> Containment:
    """Make and enter the instance's groups (`setting` "auto"), or use /proc ("off", or no
    cgroup to be had: the reason is logged as a warning, never raised). `move_self` False
    leaves this process where it is (tests)."""
    if setting == "off":
        return _proc("cgroup = off")
    try:
        host = discover()
    except CgroupError as exc:
        return _proc(str(exc))
    groups = InstanceCgroups(host, instance)
    try:
        server = groups.create(move_self=move_self)
        leftovers = server.empty_leftovers(LEFTOVER_WAIT_S)
        helpers = groups.empty_helpers(HELPER_WAIT_S)
    except CgroupError as exc:
        problems = groups.remove()
        return _proc(f"{exc}" + (f" (and {'; '.join(problems)})" if problems else ""))
    for group, pids in ((server.group, leftovers), (groups.helpers_dir, helpers)):
        if pids:
            log.warning("cgroup_leftovers_killed", pids=pids, group=str(group))
    log.info("containment", mode=server.mode, group=str(server.group))
    return Containment(
        mode=server.mode, server=server, groups=groups, leftovers=leftovers + helpers
    )


def _proc(reason: str) -> Containment:
    log.warning("containment", mode="/proc", reason=reason)
    return Containment(mode="/proc", reason=reason)


def release(containment: Containment) -> None:
    """At the end of `run`: kill whatever is still in the server group (a tokenizer worker has no
    PDEATHSIG) and in the helpers' groups, then leave and remove every group."""
    server, groups = containment.server, containment.groups
    if server is None or groups is None:
        return
    _empty(server.group, lambda: server.empty_leftovers(LEFTOVER_WAIT_S))
    _empty(groups.helpers_dir, lambda: groups.empty_helpers(HELPER_WAIT_S))
    problems = groups.remove()
    if problems:
        log.warning("cgroup_not_removed", problems=problems)


def _empty(group: Path, empty: Callable[[], list[int]]) -> None:
    try:
        left = empty()
    except CgroupError as exc:
        log.warning("cgroup_not_emptied", reason=str(exc))
        return
    if left:
        log.warning("cgroup_leftovers_killed", pids=left, group=str(group))
