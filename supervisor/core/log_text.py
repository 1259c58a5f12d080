"""Log events as text for a human reading the journal: a syslog priority, a short sentence and
the remaining fields as key=value (pure: an event dict in, one line out).

journald reads a leading `<N>` as the line's priority (SyslogLevelPrefix=, on by default) and
strips it, so `journalctl -p err` and `systemctl status` see what the supervisor meant. The
sentence comes from the table below, one entry per documented event; an event it does not know
reads as its own name. Sizes are rendered with units in the sentence; the `*_bytes` fields keep
their integers.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Mapping
from typing import Any

from supervisor.core.units import format_bytes

# sd-daemon(3) / syslog(3): 3 err, 4 warning, 6 info, 7 debug.
_PRIORITIES = {"critical": 3, "error": 3, "warning": 4, "warn": 4, "info": 6, "debug": 7}
# Not repeated as fields: journald stamps every line itself, and the priority says the level.
_NOT_FIELDS = frozenset({"event", "level", "timestamp", "exception"})
_CONTEXT_FIELDS = frozenset({"run_id", "server_pid"})
# SGLang's own lines: the sentence is the line; the run they belong to is in `server_launched`.
_QUIET_EVENTS = frozenset({"server_output"})
SERVER_OUTPUT_PREFIX = "[sglang] "


def priority(level: str) -> int:
    """The syslog priority of a structlog level name (info for one it does not know)."""
    return _PRIORITIES.get(level.lower(), 6)


def journal_stream_matches(journal_stream: str | None, st_dev: int, st_ino: int) -> bool:
    """True when `JOURNAL_STREAM` ("<device>:<inode>", decimal, as systemd.exec(5) sets it) names
    the file with this fstat device and inode: that stream is connected to the journal."""
    if not journal_stream:
        return False
    dev, sep, ino = journal_stream.strip().partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return False
    return (int(dev), int(ino)) == (st_dev, st_ino)


class _Formatter(string.Formatter):
    """str.format with three more specs: `:size` (bytes with a unit), `:secs`, `:list`."""

    def format_field(self, value: Any, format_spec: str) -> str:
        if format_spec == "size":
            return format_bytes(value) if isinstance(value, int | float) else "unknown"
        if format_spec == "secs":
            return f"{value:g} s" if isinstance(value, int | float) else str(value)
        if format_spec == "list":
            items = value if isinstance(value, list | tuple) else [value]
            return ", ".join(str(v) for v in items) or "none"
        return str(super().format_field(value, format_spec))


_FORMAT = _Formatter()
Sentence = Callable[[Mapping[str, Any]], tuple[str, frozenset[str]]]

# event -> a str.format template over its fields (specs :size, :secs, :list), or a function.
_TEMPLATES: dict[str, str] = {
    # the server's state, one event per change (README "Log events")
    "launching": "launching the server",
    "server_launched": "server started as pid {pid}",
    "loading": "server loading",
    "warming": "server warming up",
    "ready": "server ready",
    "unhealthy": "server unhealthy: {cause}",
    "server_failed": "server failed: {failure}",
    "restarting": "restarting after {failure} in {delay_s:secs}",
    "stopping": "stopping the server ({reason})",
    "stopped": "server stopped",
    "crash_loop": "crash loop: {restarts_in_window} restarts in the window, last {failure}",
    "fatal": "fatal: {reason}",
    "server_output": SERVER_OUTPUT_PREFIX + "{line}",
    # start-up and the pre-flight
    "settings": "settings of instance {instance}",
    "containment": "server tree contained by {mode}",
    "preflight_passed": "pre-flight passed: the launch needs {required_bytes:size} of host memory",
    "preflight_skipped": "pre-flight skipped (--force): {reason}",
    "preflight_failed_forced": "pre-flight failed, launching anyway (--force): "
    "{failed_checks:list}",
    "auto_sized": "auto-sized to --hicache-size {hicache_size_gb}",
    "hicache_override_applied": "--hicache-size {hicache_size_gb} from an earlier memory "
    "incident: {reason}",
    "sizing_measured": "SGLang's sizing recorded: {device_tokens} device tokens per rank",
    "sizing_not_measured": "SGLang's sizing not recorded",
    "leftovers_found": "processes of an earlier run found: {pids:list}",
    "leftovers_killed": "processes of an earlier run killed: {pids:list}",
    "leftover_not_killable": "cannot kill leftover pid {pid}: {reason}",
    "foreign_gpu_processes_killed": "other processes on the target GPUs killed: {pids:list}",
    "cgroup_leftovers_killed": "processes left in {group} killed: {pids:list}",
    "cgroup_not_emptied": "server cgroup not emptied: {reason}",
    "cgroup_not_removed": "cgroups not removed",
    "status": "status: {state}, {restart_count} restarts",
    "stop_escalated": "{signal} again: no more grace, killing the server",
    "server_tree_not_gone": "server processes still there after {waited_s:secs}: {pids:list}",
    "component_event": "server {action}: {reason}",
    "internal_error": "internal error (a bug; traceback follows)",
    # state, shared memory, NVML
    "state_corrupt": "state file {path} is corrupt: kept as {kept_as}, starting fresh",
    "state_unreadable": "state file {path} unreadable: {error}",
    "state_not_saved": "state file {path} not saved: {error}",
    "state_saved_again": "state file {path} saved again",
    "shm_removed": "{segments} shared-memory segments removed ({freed_bytes:size})",
    "shm_not_removed": "shared-memory segment {segment} not removed: {reason}",
    "nvml_unanswered": "NVML does not answer; waiting up to {waiting_s:secs} before launching",
    "nvml_answered": "NVML answered after {waited_s:secs}",
    "nvml_hung": "NVML hung: {reason}",
    "launching_gpus_unknown": "launching with the GPU state unknown (--force): {reason}",
    "measured_sizing_replaced": "measured sizing file replaced: {reason}",
    "measured_sizing_not_saved": "measured sizing not saved: {error}",
    # the memory watchdog
    "watchdog_started": "memory watchdog started",
    "memory_report": "memory: {available_bytes:size} available, server tree "
    "{tree_charged_bytes:size}",
    "memory_warn": "memory low: {reason}",
    "memory_kill_averted": "memory kill averted: {now}",
    "server_killed": "server killed ({cause}): {reason}",
    "server_terminated": "server terminated ({cause}): {reason}",
    "server_tree_gone": "killed server tree gone after {after_ms} ms",
    "watchdog_degraded": "memory watchdog degraded: {reason}",
    "watchdog_tick_failed": "memory watchdog tick failed (a bug; traceback follows)",
    "incident_written": "incident {kind} written: {path}",
    "incident_not_written": "incident {kind} not written: {error}",
    "incident_not_updated": "incident {path} not updated: {error}",
    "incidents_pruned": "{removed} old incident files removed",
    "hicache_shrunk": "--hicache-size shrunk from {previous_gb} to {hicache_size_gb} GB: {reason}",
    "hicache_not_shrunk": "--hicache-size not shrunk: {reason}",
    "hicache_shrink_saved": "--hicache-size {hicache_size_gb} GB saved for the next launch "
    "before the kill: {reason}",
    "hicache_shrink_not_saved": "--hicache-size not saved before the kill (a bug; traceback "
    "follows)",
    # GPU release
    "gpu_release_waiting": "waiting for the GPUs: {reason}",
    "gpu_release_done": "GPUs {gpus:list} released after {elapsed_s:secs}",
    "gpu_release_failed": "GPUs not released after {elapsed_s:secs}: {reason}",
    "gpu_holder_killed": "GPU holder pid {pid} killed",
    "gpu_holder_not_killable": "cannot kill GPU holder pid {pid}: {reason}",
    "gpu_reset_started": "resetting GPU {gpu}",
    "gpu_reset_done": "GPU {gpu} reset",
    "gpu_reset_failed": "GPU {gpu} reset failed: {detail}",
    "gpu_reset_refused": "GPU reset not run: {reason}",
    "gpu_health_unknown": "GPU health: {field} not reported ({reason})",
    # GPU driver events while serving (run/gpu_events.py)
    "gpu_events_unwatched": "GPU driver events not watched: {reason}",
    "gpu_event_watch_failed": "GPU event watch failed (a bug; traceback follows)",
    # group mode (supervisor/group, docs/multi-node.md)
    "group_detected": "node {node_rank} of a {mode} group of {size}, leader {leader}",
    "group_single_node": "a group of one node: supervised as one box",
    "group_gate_unavailable": "no launch gate ({reason}): the group launches on its decision",
    "group_start_delayed": "waiting {delay_s:secs} before the group starts: the backoff after "
    "{last_failure}",
    "group_leader_resolving": "waiting for the leader address {leader} to resolve",
    "group_leader_resolved": "leader address {leader} resolved after {waited_s:secs}",
    "group_report_sent": "pre-flight report sent to the leader: {summary}",
    "group_report_received": "node {node_rank} ({host}) reported: {summary}",
    "group_waiting": "waiting for the report of node {missing_nodes}",
    "group_decision": "the group's decision: {state}",
    "group_refused": "the group refuses to launch: {reason}",
    "group_hicache_applied": "the group's --hicache-size {hicache_size_gb} applied (this node "
    "planned {own_gb})",
    "group_gate_opened": "SGLang's launch gate opened",
    "group_leader_lost": "the leader's supervisor at {url} is lost ({misses} misses, last: "
    "{last_answer}): this node's server tree is killed",
    "group_must_recreate": "the group must be recreated: {failure}: {hint}",
}


def _watchdog_limits(event: Mapping[str, Any]) -> tuple[str, frozenset[str]]:
    size, percent = event.get("kill_available_bytes"), event.get("kill_available_percent")
    forms = [format_bytes(size) if size else "", f"{percent:g} %" if percent else ""]
    levels = " or ".join(f for f in forms if f)
    text = f"memory watchdog kills below {levels} available" if levels else "memory watchdog on"
    tree_kill = event.get("tree_kill_bytes")
    if isinstance(tree_kill, int):
        budget = _FORMAT.format_field(event.get("tree_budget_bytes"), "size")
        text += f", or when the server tree passes {format_bytes(tree_kill)} (budget {budget})"
    else:
        text += "; the server tree has no budget (no pre-flight report)"
    used = {
        "kill_available_bytes",
        "kill_available_percent",
        "tree_budget_bytes",
        "tree_kill_bytes",
    }
    return text, frozenset(used)


def _drain_cut(event: Mapping[str, Any]) -> tuple[str, frozenset[str]]:
    grace = _FORMAT.format_field(event["grace_s"], "secs")
    count = event.get("remaining_requests")
    if isinstance(count, int):
        plural = "" if count == 1 else "s"
        cut = f"with {count} request{plural} still in flight (SGLang's last count)"
    else:
        cut = "before SGLang counted the requests in flight"
    text = f"stop grace of {grace} ran out while the server drained: killed {cut}"
    return text, frozenset({"grace_s", "remaining_requests"})


def _preflight_report(event: Mapping[str, Any]) -> tuple[str, frozenset[str]]:
    verdict = event["verdict"]
    required = _FORMAT.format_field(event.get("host_required_bytes"), "size")
    budget = _FORMAT.format_field(event.get("host_budget_bytes"), "size")
    text = f"pre-flight: {verdict}; the launch needs {required} of {budget} host memory"
    checks = event.get("checks") or []
    failed = [
        c.get("name", "?") for c in checks if isinstance(c, dict) and c.get("status") == "fail"
    ]
    if failed:
        text += f"; failed: {', '.join(failed)}"
    return text, frozenset({"verdict", "host_required_bytes", "host_budget_bytes"})


_GPU_EVENT_KINDS = {
    "dbe": "double-bit ECC error",
    "sbe": "single-bit ECC error",
    "recovery_action": "recovery action",
    "lost": "GPU lost",
}
_GPU_EVENT_THEN = {
    "ignore": ": an application error, ignored",
    "restart": ": killing the server to restart it",
    "reset": ": killing the server, the GPU is reset before the relaunch",
    "drain": ": killing the server, no relaunch (drain the GPU)",
    "reboot": ": killing the server, no relaunch (the node needs a reboot)",
}


def _gpu_event(event: Mapping[str, Any]) -> tuple[str, frozenset[str]]:
    """'GPU 1: Xid 79 (GPU has fallen off the bus), recovery action node_reboot: killing ...'."""
    xid, kind = event.get("xid"), str(event["kind"])
    what = f"Xid {xid}" if xid is not None else _GPU_EVENT_KINDS.get(kind, kind)
    text = f"GPU {event['gpu']}: {what} ({event['meaning']})"
    if event.get("action"):
        text += f", recovery action {event['action']}"
    text += _GPU_EVENT_THEN.get(str(event.get("decision")), "")
    return text, frozenset({"gpu", "xid", "kind", "meaning", "action"})


def _gpu_health(event: Mapping[str, Any]) -> tuple[str, frozenset[str]]:
    """'GPU health (enforce): GPU 0 ok, GPU 1 fail (a row remap is pending: needs a reset)'."""
    shown = [
        f"GPU {g['gpu']} {g['verdict']}" + (f" ({g['reason']})" if g.get("reason") else "")
        for g in event["gpus"]
    ]
    return f"GPU health ({event['mode']}): {', '.join(shown)}", frozenset({"mode", "gpus"})


_FUNCTIONS: dict[str, Sentence] = {
    "watchdog_limits": _watchdog_limits,
    "drain_cut": _drain_cut,
    "preflight_report": _preflight_report,
    "gpu_event": _gpu_event,
    "gpu_health": _gpu_health,
}


def sentence(event: Mapping[str, Any]) -> tuple[str, frozenset[str]]:
    """The event as a short sentence, and the fields it already tells (not repeated after it).

    An event the table does not know, or one missing a field its sentence needs, reads as its
    name, with every field after it.
    """
    name = str(event.get("event", ""))
    try:
        if name in _FUNCTIONS:
            return _FUNCTIONS[name](event)
        template = _TEMPLATES.get(name)
        if template is not None:
            used = frozenset(f for _, f, _, _ in _FORMAT.parse(template) if f)
            return _FORMAT.vformat(template, (), event), used
    except (KeyError, IndexError, TypeError, ValueError):
        pass
    return name, frozenset()


def field_value(value: Any) -> str:
    """One value for key=value: bare when it is one plain word, else JSON (quoted, escaped, on
    one line, so a newline in a value never starts a journal entry without its priority)."""
    if isinstance(value, str):
        plain = value and not any(c.isspace() or c in '"=\\' for c in value)
        return value if plain else json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def journal_line(event: Mapping[str, Any]) -> str:
    """`<priority>sentence key=value ...`; a traceback follows on lines of the same priority."""
    prefix = f"<{priority(str(event.get('level', 'info')))}>"
    text, used = sentence(event)
    if str(event.get("event")) not in _QUIET_EVENTS:
        skip = used | _NOT_FIELDS
        # The event's own fields first; the run and server every event after launch names, last.
        keys = sorted((k for k in event if k not in skip), key=lambda k: k in _CONTEXT_FIELDS)
        fields = " ".join(f"{k}={field_value(event[k])}" for k in keys)
        text = f"{text} {fields}" if fields else text
    lines = [prefix + text.replace("\n", " ")]
    exception = event.get("exception")
    if isinstance(exception, str):
        lines += [prefix + line for line in exception.splitlines() if line.strip()]
    return "\n".join(lines)


def raw_server_line(line: str) -> str:
    """SGLang's line as it printed it, after a prefix that tells it from the supervisor's."""
    return SERVER_OUTPUT_PREFIX + line
