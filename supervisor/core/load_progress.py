"""SGLang's load, read from its output: the phase it is in, how far, and when it should end.

Pure: lines and times in, a LoadProgress out. The phases, as SGLang 0.5.x logs them
(model_executor/model_runner.py, model_loader/weight_utils.py, cuda_graph_setup.py):

    starting --"Load weight begin"--> weights --"Load weight end" / "KV Cache is allocated"-->
    memory_pools --"Capture … graph begin"--> cuda_graphs --(503)--> warm_up --(200)--> ready

The marks come from core/log_phases.py. Two phases carry tqdm meters, printed by rank 0 only:
the weight shards ("Loading safetensors checkpoint shards:  45% Completed | 27/60
[00:31<00:38,  1.42s/it]", utils/common.py BAR_FORMAT) and the graph shapes ("Capturing batches
(bs=8 avail_mem=10.30 GB):  40%|████      | 21/52 [00:03<00:04,  7.40it/s]", tqdm's default
format). tqdm's own estimate of the time left is the phase's ETA.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import Enum

from supervisor.core.log_phases import LogMark, read_mark
from supervisor.core.units import format_seconds


class Phase(str, Enum):
    STARTING = "starting"  # launched; SGLang has not begun to load the weights
    WEIGHTS = "weights"
    MEMORY_POOLS = "memory_pools"  # KV cache and host pools
    CUDA_GRAPHS = "cuda_graphs"
    WARM_UP = "warm_up"  # HTTP is up, SGLang's warm-up request runs (503)
    READY = "ready"


LABELS = {
    Phase.STARTING: "starting",
    Phase.WEIGHTS: "loading weights",
    Phase.MEMORY_POOLS: "allocating memory pools",
    Phase.CUDA_GRAPHS: "capturing CUDA graphs",
    Phase.WARM_UP: "warming up",
    Phase.READY: "ready",
}
_ORDER = {phase: i for i, phase in enumerate(Phase)}
_MARK_PHASES = {
    LogMark.WEIGHTS_LOAD_BEGIN: Phase.WEIGHTS,
    LogMark.WEIGHTS_LOADED: Phase.MEMORY_POOLS,
    LogMark.KV_CACHE_ALLOCATED: Phase.MEMORY_POOLS,
    LogMark.HOST_POOL_ALLOCATED: Phase.MEMORY_POOLS,
    LogMark.GRAPH_CAPTURE_BEGIN: Phase.CUDA_GRAPHS,
    LogMark.READY: Phase.READY,
}

# One tqdm meter: "<desc>: <pct>%" then SGLang's " Completed |" or tqdm's "|<bar>|", then
# "<n>/<total> [<elapsed><<remaining>". Searched, not anchored: a bar redraw may be glued to
# another process's line on the same pipe, and tqdm pads a shorter redraw with spaces. The
# pattern begins at the colon after the description, so that a search tries each colon once
# (not every character of a long line); the description is what precedes it (_description).
_METER = re.compile(
    r":\s*(?P<percent>\d{1,3})%"
    r"(?:\s*Completed\s*\||\|[^|\r\n]*\|)\s*"
    r"(?P<n>\d+)/(?P<total>\d+)\s*\[(?P<elapsed>[\d:]+)<(?P<remaining>[\d:]+|\?)"
)
DESCRIPTION_MAX_CHARS = 200  # tqdm's description is a few words; the rest is glued-on text
_CLOCK = re.compile(r"\A\d+(?::\d+){1,2}\Z")


def _description(line: str, colon: int) -> str:
    """The meter's description: the text before its colon, back to a colon or a line end."""
    start = max(0, colon - DESCRIPTION_MAX_CHARS)
    before = line[start:colon]
    cut = max(before.rfind(":"), before.rfind("\r"), before.rfind("\n"))
    return before[cut + 1 :]


@dataclass(frozen=True, slots=True)
class Meter:
    """One tqdm meter line: which phase it counts, how far, and tqdm's time left."""

    phase: Phase
    done: int
    total: int
    unit: str
    remaining_s: float | None  # None: tqdm does not know yet ("?")


def _clock_s(text: str) -> float | None:
    """tqdm's format_interval ("mm:ss" or "h:mm:ss") in seconds; None for "?"."""
    if not _CLOCK.fullmatch(text):
        return None
    seconds = 0
    for part in text.split(":"):
        seconds = seconds * 60 + int(part)
    return float(seconds)


def read_meter(line: str) -> Meter | None:
    """The weight-shard or graph-capture meter in `line`; None for any other line or meter."""
    match = _METER.search(line)
    if match is None:
        return None
    desc = _description(line, match.start()).lower()
    if "loading" in desc and ("shard" in desc or "safetensors" in desc or "checkpoint" in desc):
        phase, unit = Phase.WEIGHTS, "shards"
    elif "capturing" in desc or "compiling num tokens" in desc:
        phase, unit = Phase.CUDA_GRAPHS, "shapes"
    else:
        return None
    done, total = int(match.group("n")), int(match.group("total"))
    if total <= 0 or done > total:
        return None
    return Meter(phase, done, total, unit, _clock_s(match.group("remaining")))


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadProgress:
    """Where one launch's load stands. Times are wall-clock seconds (they are shown to people
    and written to the status file, read by another process)."""

    phase: Phase = Phase.STARTING
    started_at_s: float  # the launch
    phase_since_s: float
    done: int | None = None  # the phase's meter, when it has one
    total: int | None = None
    unit: str = ""
    eta_at_s: float | None = None  # when tqdm expects the phase's meter to end

    @classmethod
    def begin(cls, now_s: float) -> LoadProgress:
        return cls(started_at_s=now_s, phase_since_s=now_s)

    @property
    def percent(self) -> float | None:
        if self.done is None or not self.total:
            return None
        return 100.0 * self.done / self.total

    def enter(self, phase: Phase, now_s: float) -> LoadProgress:
        """In `phase` from `now_s` (its meter cleared); unchanged when already there."""
        if phase is self.phase:
            return self
        return replace(
            self, phase=phase, phase_since_s=now_s, done=None, total=None, unit="", eta_at_s=None
        )

    def feed(self, line: str, now_s: float) -> LoadProgress:
        """The progress after one line of SGLang's output (a meter redraw may carry another
        process's line glued to it: both count).

        Phases only move forward: ranks finish at different times, and the first "Load weight
        end" must not be undone by rank 0's last meter redraws. "Load weight begin" is the one
        way back: a second model (a speculative draft) loads after the first.
        """
        progress = self
        meter = read_meter(line)
        if meter is not None and _ORDER[meter.phase] >= _ORDER[self.phase]:
            eta = None if meter.remaining_s is None else now_s + meter.remaining_s
            progress = replace(
                self.enter(meter.phase, now_s),
                done=meter.done,
                total=meter.total,
                unit=meter.unit,
                eta_at_s=eta,
            )
        marked = read_mark(line) if _may_mark(line) else None
        mark = marked.mark if marked is not None else None
        phase = _MARK_PHASES.get(mark) if mark is not None else None
        if phase is not None and (
            _ORDER[phase] > _ORDER[progress.phase] or mark is LogMark.WEIGHTS_LOAD_BEGIN
        ):
            progress = progress.enter(phase, now_s)
        return progress

    def eta_s(self, now_s: float) -> float | None:
        if self.eta_at_s is None:
            return None
        return max(0.0, self.eta_at_s - now_s)

    def describe(self, now_s: float) -> str:
        """One line for people: "loading weights 45% (27/60 shards, ETA 38 s)"."""
        text = LABELS[self.phase]
        if self.done is None or self.total is None or self.percent is None:
            return text
        detail = f"{self.done}/{self.total} {self.unit}"
        eta = self.eta_s(now_s)
        if eta is not None and self.done < self.total:
            detail += f", ETA {format_seconds(eta)}"
        return f"{text} {self.percent:.0f}% ({detail})"

    def bar(self, now_s: float, width: int = 24) -> str:
        """A one-line bar for a terminal: "[#########---------------] loading weights 45% …"."""
        filled = round(width * (self.percent or 0.0) / 100.0)
        return f"[{'#' * filled}{'-' * (width - filled)}] {self.describe(now_s)}"

    def to_json(self) -> dict[str, object]:
        return {
            "phase": self.phase.value,
            "started_at": self.started_at_s,
            "phase_since": self.phase_since_s,
            "done": self.done,
            "total": self.total,
            "unit": self.unit or None,
            "percent": None if self.percent is None else round(self.percent, 1),
            "eta_at": self.eta_at_s,
        }

    @classmethod
    def from_json(cls, data: object) -> LoadProgress:
        """Raises ValueError/TypeError/KeyError on a document that is not a load progress."""
        if not isinstance(data, dict):
            raise ValueError("load_progress is not an object")
        return cls(
            phase=Phase(data["phase"]),
            started_at_s=float(data["started_at"]),
            phase_since_s=float(data["phase_since"]),
            done=_int_or_none(data.get("done")),
            total=_int_or_none(data.get("total")),
            unit=str(data.get("unit") or ""),
            eta_at_s=None if data.get("eta_at") is None else float(data["eta_at"]),
        )


def _int_or_none(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not a count")
    return value


# read_mark scans every phrase; most output lines carry none of these words.
_MARK_WORDS = ("weight", "kv cache", "host pool", "graph", "fired up")


def _may_mark(line: str) -> bool:
    lowered = line.lower()
    return any(word in lowered for word in _MARK_WORDS)
