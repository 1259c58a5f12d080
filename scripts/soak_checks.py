"""The invariants scripts/soak checks after every cycle, its settings and its markdown report,
RELIABILITY.md (not a test)."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from soak_support import (
    ROOT,
    LogTail,
    Proc,
    SecretScanner,
    descends_from,
    is_live,
    marked,
    orphaned_segments,
    poll_until,
)

sys.path.insert(0, str(ROOT))

from supervisor.run.state import RunState

# Processes a dying tree takes with it (PDEATHSIG, a group kill) are gone within milliseconds;
# whatever is still there after this is left behind for good.
GRACE_S = 3.0
INVARIANTS = (
    "orphan_process",
    "leaked_shm",
    "state_invalid",
    "two_server_trees",
    "secret_revealed",
    "cgroup_left",
    "bad_exit",
    "no_recovery",
)


@dataclass
class Outcome:
    kind: str
    result: str  # recovered | refused | violation
    seconds: float | None  # to the next ready (recovered) or to the exit (refused)
    detail: str = ""
    failures: list[str] = field(default_factory=list)  # how the supervisor classified deaths


@dataclass
class World:
    """What the checks look at: the soak's marker, its files, its secrets."""

    marker: str
    state_dir: Path
    shm_record: Path
    scanner: SecretScanner
    corrupt_seen: set[Path] = field(default_factory=set)


def runs(log: LogTail) -> list[str]:
    return [str(e.get("run_id")) for e in log.named("launching")]


def strays(world: World, sup_pid: int | None, log: LogTail | None) -> list[str]:
    """Marked processes that belong to no live supervisor's current tree. A server process
    carries its launch's run ID: it may be of the latest launch (or one that began during the
    scan), never of an earlier one; the supervisor's helpers (NVML worker, reset command)
    carry none and must be its descendants."""
    before = runs(log) if log is not None else []
    procs = marked(world.marker)
    allowed: set[str] = set()
    if log is not None:
        log.poll()
        allowed = set(runs(log)[max(0, len(before) - 1) :])

    def ours(p: Proc) -> bool:
        if sup_pid is None:
            return False
        return p.run_id in allowed if p.run_id else descends_from(p.pid, sup_pid)

    suspects = [p for p in procs if not ours(p)]
    if not suspects:
        return []
    poll_until(lambda: not any(is_live(p.pid, p.start_ticks) for p in suspects), GRACE_S, 0.05)
    return [
        f"pid {p.pid} {p.title[:60]!r} run {p.run_id or '-'} (supervisor {sup_pid})"
        for p in suspects
        if is_live(p.pid, p.start_ticks)
    ]


def two_trees(world: World) -> list[str]:
    tp0 = [p for p in marked(world.marker) if p.title == "sglang::scheduler_TP0"]
    live = [p for p in tp0 if is_live(p.pid, p.start_ticks)]
    if len(live) <= 1:
        return []
    return [", ".join(f"TP0 pid {p.pid} run {p.run_id}" for p in live)]


def leaked_shm(world: World) -> list[str]:
    """Segments of processes that are gone and that nobody removed within the grace."""
    found = orphaned_segments(world.shm_record)
    if not found:
        return []
    poll_until(lambda: not orphaned_segments(world.shm_record), GRACE_S, 0.05)
    return orphaned_segments(world.shm_record)


def state_problems(world: World) -> list[str]:
    out = []
    path = world.state_dir / "state.json"
    try:
        RunState.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError, KeyError) as exc:
        out.append(f"{path.name}: {type(exc).__name__}: {exc}")
    # The supervisor sets a state file it could not read aside: one it wrote itself means a
    # write was not atomic.
    for kept in sorted(world.state_dir.glob("state.json.corrupt-*")):
        if kept not in world.corrupt_seen:
            world.corrupt_seen.add(kept)
            out.append(f"the supervisor found a corrupt state file ({kept.name})")
    return out


def check(world: World, sup_pid: int | None, log: LogTail | None) -> list[tuple[str, str]]:
    """Every invariant, each violation as (kind, detail); `sup_pid` None: none is running."""
    found = [("orphan_process", d) for d in strays(world, sup_pid, log)]
    found += [("two_server_trees", d) for d in two_trees(world)]
    found += [("leaked_shm", d) for d in leaked_shm(world)]
    found += [("state_invalid", d) for d in state_problems(world)]
    found += [("secret_revealed", d) for d in world.scanner.scan()]
    return found


# -- the report ----------------------------------------------------------------------------

# The supervisor's timings in the soak: millisecond-scale where production uses seconds, so a
# death is seen, the tree killed and the server relaunched within a second or two.
SETTINGS: dict[str, dict[str, Any]] = {
    "run": {
        "health_interval": "50ms",
        "health_timeout": "2s",  # the least `run` takes for /health (two of SGLang's looks)
        "failure_threshold": 3,
        "stop_grace": "2s",
        "backoff_initial": "10ms",
        "backoff_max": "80ms",
        "stable_after": "2s",
    },
    "gpu": {"release_timeout": "3s", "nvml_timeout": "1s", "nvml_start_timeout": "3s"},
}

EXPECTED = {
    "rank_kill": "recovered (rank_crash)",
    "rank_hang": "recovered (rank_stopped)",
    "zombie": "recovered (rank_zombie)",
    "leak": "recovered (memory_kill)",
    "orphan": "recovered, escapee killed",
    "gpu_stuck": "recovered after a GPU reset",
    "nvml_hang": "refused: exit 6",
    "sup_sigterm": "exit 0, then recovered",
    "sup_sigkill": "recovered, leftovers cleaned",
    "disk_full": "recovered",
    "port_stolen": "recovered (port_in_use)",
}

HOW_TO_READ = """\
Each cycle injects one fault into a running, ready supervisor (or starts one with the simulated
server's launch-time scenario for it), waits for the outcome, then checks every invariant.
**Recovered**: the supervisor's next `ready` event came after the fault; *TTR* (time to recover)
runs from the injection (the signal sent, or the launch-time fault seen firing in `/proc`) to that
event's timestamp, and includes detecting the death, killing and reaping the whole tree, waiting
for the simulated GPUs, the restart backoff, and the simulated server's own start (~1 s for 8
ranks on this machine). For `sup_sigterm`/`sup_sigkill` it also includes the soak starting the
next supervisor, as an operator or systemd would. **Refused**: the supervisor ended with a
documented exit code (1-6) and a `fatal` event saying why; the next cycle starts a fresh one.
**Not recovered**: neither within 30 s, or an exit without a `fatal` event; counted as the
`no_recovery` or `bad_exit` invariant. *Classified as* counts the `failure` of every
`server_failed` event between the fault and its outcome (the three most frequent). The invariants
are checked after every cycle, and after each stop of a supervisor: every process carrying the
soak's marker belongs to the running supervisor (its helpers, or its current launch by
`SGLANG_SUPERVISOR_RUN_ID`), none once it stopped; no `/dev/shm` segment of a process that is gone
is left; `state.json` parses as the state format; at most one `sglang::scheduler_TP0`; neither the
API key nor the HF token in any log line or file under the soak's directory; no cgroup of the
instance after a supervisor exited by itself. Violations should be 0; each one is listed with its
cycle, and the seed replays the same sequence of faults (not the same timings)."""


class SoakLike(Protocol):
    seed: int
    lives: int
    operator_resets: int
    violations: list[tuple[int, str, str]]
    modes: Counter[str]


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def fault_table(outcomes: Sequence[Outcome], kinds: Sequence[str]) -> list[str]:
    lines = [
        "| Fault | Injected | Recovered | Refused | Not recovered | TTR p50 | TTR p95 | "
        "Refused after (p50) | Classified as | Expected |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for kind in kinds:
        mine = [o for o in outcomes if o.kind == kind]
        count = Counter(o.result for o in mine)
        ttr = [o.seconds for o in mine if o.result == "recovered" and o.seconds is not None]
        refused = [o.seconds for o in mine if o.result == "refused" and o.seconds is not None]
        classes = Counter(f for o in mine for f in o.failures)
        named = ", ".join(f"{k} ×{n}" for k, n in classes.most_common(3)) or "–"
        lines.append(
            f"| {kind} | {len(mine)} | {count['recovered']} | {count['refused']} | "
            f"{count['violation']} | {_s(percentile(ttr, 50))} | {_s(percentile(ttr, 95))} | "
            f"{_s(percentile(refused, 50))} | {named} | {EXPECTED.get(kind, '')} |"
        )
    return lines


def violation_table(violations: Sequence[tuple[int, str, str]]) -> list[str]:
    count = Counter(kind for _, kind, _ in violations)
    lines = ["| Invariant | Violations |", "|---|---:|"]
    lines += [f"| {kind} | {count[kind]} |" for kind in INVARIANTS]
    if violations:
        lines += ["", "First violations (cycle, invariant, detail):", ""]
        lines += [f"- cycle {c}: `{k}`: {d[:300]}" for c, k, d in violations[:20]]
    return lines


def _settings_line() -> str:
    pairs = [f"`{k} = {v}`" for section in SETTINGS.values() for k, v in section.items()]
    return ", ".join(pairs)


def render(
    soak: SoakLike,
    args: argparse.Namespace,
    outcomes: Sequence[Outcome],
    wall_s: float,
    kinds: Sequence[str],
    left_out: str | None,
) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    modes = ", ".join(f"{m} ({n} launches)" for m, n in soak.modes.most_common()) or "–"
    lines = [
        "# Reliability: chaos soak of `sglang-supervisor run`",
        "",
        f"Generated by `scripts/soak` on {now}. Machine: {os.cpu_count()} CPUs, Linux "
        f"{platform.release()}, Python {platform.python_version()}.",
        "",
        f"Replay: `.venv/bin/python scripts/soak --seed {soak.seed} --cycles {args.cycles}`",
        "",
        f"- Cycles: {len(outcomes)}, wall time {wall_s / 60:.1f} min "
        f"({wall_s / max(1, len(outcomes)):.1f} s per cycle); {soak.lives} supervisor starts; "
        f"containment: {modes}.",
        "- Server: the simulated SGLang 0.5.23 (`supervisor.testing.fake_sglang`), `--tp 8` on 8 "
        'simulated H200s (`[gpu] backend = "sim"`, reset command '
        "`python -m supervisor.testing.fake_gpu_reset {index}`), the memory watchdog on with a "
        "tree budget 16 MiB above the pre-flight's estimate of the real tree.",
        f"- Settings: {_settings_line()}. They are millisecond-scale where production uses "
        "seconds (health every 10 s, restart after 10 s), so a cycle takes seconds; only the "
        "time to notice and the backoff shrink, every step of the recovery is the same.",
        f"- Operator GPU resets between cycles (stuck memory after a clean stop of a `gpu_stuck` "
        f"server, which the supervisor does not check on a clean stop): {soak.operator_resets}.",
    ]
    if left_out:
        lines.append(f"- `disk_full` left out: no tmpfs could be mounted ({left_out}).")
    lines += ["", "## Faults", "", *fault_table(outcomes, kinds), ""]
    lines += ["## Invariant violations (expected: 0)", "", *violation_table(soak.violations)]
    lines += ["", "## How to read this", "", HOW_TO_READ, ""]
    return "\n".join(lines)
