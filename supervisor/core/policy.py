"""The host-memory watchdog's decision (pure): readings of the last ticks in, OK / WARN /
TERMINATE / KILL plus the next poll interval out. No clock, no /proc, no signals here.

Theory of operation
-------------------
Two quantities are watched every tick:

* host headroom: MemAvailable, capped by the server cgroup's headroom (file pages are already
  counted as available, so mmapped weights never look like pressure);
* the tree's charge: RssAnon + RssShmem summed over the server's processes (pinned host KV pools
  are shared memory; RssFile, the mmapped weights, is never charged).

Levels on host headroom, lowest wins:  warn > terminate > kill.  Each level is bytes, percent, or
both (then the lower applies, like earlyoom's -M/-m). Percent is of an earlyoom-style base: what
would be available if everything killable were killed. earlyoom uses MemAvailable + AnonPages; the
only thing *we* may kill is the server tree, so the base is MemAvailable + the tree's charge.

The tree has its own budget: the pre-flight's expected total (warn above it) plus a margin (kill
above it) - a leak is caught even on a box with plenty of memory left.

    reading ─┬─ headroom <= kill, or tree >= budget+margin ─────────────────> KILL
             ├─ would cross either line before the next tick (trend; for the
             │  tree only once it is past the expected total) ──────────────> KILL
             ├─ TERM sent and its grace expired ────────────────────────────> KILL
             ├─ headroom <= terminate ──────────────────────────────────────> TERMINATE
             ├─ headroom <= warn, tree > budget, PSI full >= limit ─ N ticks > WARN
             └─ otherwise ──────────────────────────────────────────────────> OK

Trend: the growth rate (host headroom falling, tree charge rising; the larger of the slopes over
the last `trend_window_s` and the last 0.1 s) is projected over the next interval plus the
reaction time - the tree's own growth only up to the pre-flight's expected total, since a
loading server pins its pools at GB/s and then stops; fixed thresholds alone lose at fast
ramps (earlyoom #123: 715 ms of sleep, reacted at 3 % instead of 10 %). Kill needs no streak; WARN
needs `warn_ticks` consecutive breaches (circus's debounce, 3 samples).

Adaptive interval (earlyoom's): headroom to the nearest kill line / the worst plausible ramp
(6 GB/s, earlyoom's measured 6000 KiB/ms; the measured rate if faster), clamped to
[min_interval_s, max_interval_s] = 50 ms .. 1 s, so an idle box costs almost nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from supervisor.core.units import GB, GiB


class Verdict(Enum):
    OK = "ok"
    WARN = "warn"
    TERMINATE = "terminate"
    KILL = "kill"


@dataclass(frozen=True, slots=True, kw_only=True)
class Level:
    """A host-headroom level: bytes, percent of the base, or both (the lower applies)."""

    bytes_: int | None = None
    percent: float | None = None

    def resolve(self, base_bytes: int) -> int:
        """The level in bytes for this tick's base; 0 when neither form is set (disabled)."""
        options = []
        if self.bytes_ is not None:
            options.append(self.bytes_)
        if self.percent is not None:
            options.append(int(base_bytes * self.percent / 100.0))
        return min(options) if options else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Everything the decision needs besides readings (built from config.WatchdogConfig)."""

    warn: Level = Level(bytes_=8 * GiB, percent=8.0)
    terminate: Level = Level(bytes_=4 * GiB, percent=4.0)
    kill: Level = Level(bytes_=2 * GiB, percent=2.0)
    tree_budget_bytes: int | None = None  # pre-flight expected total: WARN above
    tree_kill_bytes: int | None = None  # budget + margin: KILL above
    psi_full_warn_percent: float | None = 40.0  # nohang's PSI warning line (full avg10)
    warn_ticks: int = 3
    terminate_grace_s: float = 5.0
    worst_ramp_bytes_per_s: float = 6 * GB
    reaction_s: float = 0.02  # re-read + kill + first reclaim, measured ~10-20 ms
    min_interval_s: float = 0.05
    max_interval_s: float = 1.0
    trend_window_s: float = 1.0


def tree_kill_line(expected_total_bytes: int, margin_percent: float, margin_bytes: int) -> int:
    """Budget + margin for the tree: the larger of a percentage and an absolute margin."""
    margin = max(int(expected_total_bytes * margin_percent / 100.0), margin_bytes)
    return expected_total_bytes + margin


@dataclass(frozen=True, slots=True, kw_only=True)
class Reading:
    """One tick's measurements (bytes, seconds)."""

    t_s: float
    available_bytes: int  # MemAvailable, capped by cgroup headroom
    tree_charged_bytes: int  # RssAnon + RssShmem of the whole server tree
    psi_some_avg10: float | None = None
    psi_full_avg10: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The verdict with everything an incident report needs to explain it."""

    verdict: Verdict
    reason: str
    streak: int  # consecutive WARN-level breaches, carried to the next tick
    next_interval_s: float
    predicted: bool = False  # KILL because of the trend, not a crossed line
    base_bytes: int = 0
    warn_bytes: int = 0
    terminate_bytes: int = 0
    kill_bytes: int = 0
    available_drop_bytes_per_s: float = 0.0
    tree_growth_bytes_per_s: float = 0.0

    def thresholds(self) -> dict[str, int | None]:
        return {
            "base_bytes": self.base_bytes,
            "warn_available_bytes": self.warn_bytes,
            "terminate_available_bytes": self.terminate_bytes,
            "kill_available_bytes": self.kill_bytes,
        }


def _rates_since(history: Sequence[Reading], min_age_s: float) -> tuple[float, float]:
    """(drop, growth) from the newest reading at least `min_age_s` older than the latest (else
    the oldest) to the latest."""
    latest = history[-1]
    ref = history[-2]
    for reading in reversed(history[:-1]):
        ref = reading
        if latest.t_s - reading.t_s >= min_age_s:
            break
    dt = latest.t_s - ref.t_s
    if dt <= 0:
        return 0.0, 0.0
    drop = (ref.available_bytes - latest.available_bytes) / dt
    growth = (latest.tree_charged_bytes - ref.tree_charged_bytes) / dt
    return max(0.0, drop), max(0.0, growth)


def growth_rates(
    history: Sequence[Reading], window_s: float, short_s: float = 0.1
) -> tuple[float, float]:
    """(host headroom drop, tree growth) in bytes/s; >= 0 each.

    The larger of two slopes: over at least `window_s` (smooth) and over at least `short_s`
    (a ramp that just started). Both reach back to a reading at least that old, so a re-read a
    few ms after the previous one (before a kill) cannot hide a ramp, and a single
    allocation step seen over a few ms cannot fake a huge rate.
    """
    if len(history) < 2:
        return 0.0, 0.0
    long_drop, long_growth = _rates_since(history, window_s)
    short_drop, short_growth = _rates_since(history, short_s)
    return max(long_drop, short_drop), max(long_growth, short_growth)


def next_interval_s(
    headroom_bytes: float, ramp_bytes_per_s: float, min_interval_s: float, max_interval_s: float
) -> float:
    """earlyoom's adaptive sleep: time the fastest plausible ramp needs to eat the headroom."""
    if headroom_bytes <= 0 or ramp_bytes_per_s <= 0:
        return min_interval_s if headroom_bytes <= 0 else max_interval_s
    return max(min_interval_s, min(max_interval_s, headroom_bytes / ramp_bytes_per_s))


def projected_drop(
    drop: float, growth: float, horizon_s: float, tree_bytes: int, limits: Limits
) -> float:
    """How much host headroom may go within `horizon_s`.

    The part of the drop our tree's growth explains stops at the pre-flight's expected total
    (the load pins its pools at GB/s, then stops); the rest (other processes, or the tree past
    its budget) is projected in full.
    """
    ours = min(drop, growth)
    foreign = drop - ours
    ours_s = ours * horizon_s
    if limits.tree_budget_bytes is not None and tree_bytes < limits.tree_budget_bytes:
        ours_s = min(ours_s, limits.tree_budget_bytes - tree_bytes)
    return foreign * horizon_s + ours_s


def _fmt_gb(n: float) -> str:
    return f"{n / GB:.2f} GB"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Tick:
    """One tick's numbers, resolved: levels in bytes, rates, the interval and horizon."""

    now: Reading
    limits: Limits
    base: int
    warn_b: int
    term_b: int
    kill_b: int
    drop: float
    growth: float
    interval: float
    horizon: float

    def out(self, verdict: Verdict, reason: str, streak: int, predicted: bool = False) -> Decision:
        return Decision(
            verdict=verdict,
            reason=reason,
            streak=streak,
            next_interval_s=self.interval,
            predicted=predicted,
            base_bytes=self.base,
            warn_bytes=self.warn_b,
            terminate_bytes=self.term_b,
            kill_bytes=self.kill_b,
            available_drop_bytes_per_s=self.drop,
            tree_growth_bytes_per_s=self.growth,
        )


def _tick(history: Sequence[Reading], limits: Limits) -> _Tick:
    now = history[-1]
    base = now.available_bytes + now.tree_charged_bytes
    kill_b = limits.kill.resolve(base)
    drop, growth = growth_rates(history, limits.trend_window_s)
    headrooms = [now.available_bytes - kill_b]
    if limits.tree_kill_bytes is not None:
        headrooms.append(limits.tree_kill_bytes - now.tree_charged_bytes)
    ramp = max(limits.worst_ramp_bytes_per_s, drop, growth)
    interval = next_interval_s(min(headrooms), ramp, limits.min_interval_s, limits.max_interval_s)
    return _Tick(
        now=now,
        limits=limits,
        base=base,
        warn_b=limits.warn.resolve(base),
        term_b=limits.terminate.resolve(base),
        kill_b=kill_b,
        drop=drop,
        growth=growth,
        interval=interval,
        horizon=interval + limits.reaction_s,
    )


def _crossed(t: _Tick, streak: int) -> Decision | None:
    """KILL for a line already crossed: host headroom, or the tree's budget plus margin."""
    avail, tree, kill_b = t.now.available_bytes, t.now.tree_charged_bytes, t.kill_b
    if avail <= kill_b:
        reason = (
            f"host memory available {_fmt_gb(avail)} at or below the kill level {_fmt_gb(kill_b)}"
        )
        return t.out(Verdict.KILL, reason, streak)
    tree_kill = t.limits.tree_kill_bytes
    if tree_kill is not None and tree >= tree_kill:
        reason = (
            f"server tree uses {_fmt_gb(tree)} (RssAnon+RssShmem), at or above its budget plus "
            f"margin {_fmt_gb(tree_kill)}"
        )
        return t.out(Verdict.KILL, reason, streak)
    return None


def _predicted(t: _Tick, streak: int) -> Decision | None:
    """KILL when the trend would cross a kill line before the next tick."""
    avail, tree, limits = t.now.available_bytes, t.now.tree_charged_bytes, t.limits
    if t.drop > 0 and avail - projected_drop(t.drop, t.growth, t.horizon, tree, limits) <= t.kill_b:
        reason = (
            f"host memory falls {_fmt_gb(t.drop)}/s: {_fmt_gb(avail)} available would cross the "
            f"kill level {_fmt_gb(t.kill_b)} within {t.horizon * 1000:.0f} ms, before the next tick"
        )
        return t.out(Verdict.KILL, reason, streak, predicted=True)
    # Below the pre-flight's expected total, fast tree growth is the load itself (pools are
    # pinned at GB/s): only growth past the expected total is projected onto the kill line.
    tree_kill = limits.tree_kill_bytes
    if (
        tree_kill is not None
        and t.growth > 0
        and (limits.tree_budget_bytes is None or tree > limits.tree_budget_bytes)
        and tree + t.growth * t.horizon >= tree_kill
    ):
        reason = (
            f"server tree grows {_fmt_gb(t.growth)}/s: {_fmt_gb(tree)} would cross its budget "
            f"plus margin {_fmt_gb(tree_kill)} within {t.horizon * 1000:.0f} ms"
        )
        return t.out(Verdict.KILL, reason, streak, predicted=True)
    return None


def _warn_breaches(t: _Tick) -> list[str]:
    """The WARN-level conditions this tick (host headroom, tree over budget, PSI full)."""
    now, limits = t.now, t.limits
    breaches = []
    if now.available_bytes <= t.warn_b:
        breaches.append(
            f"host memory available {_fmt_gb(now.available_bytes)} at or below the warn level "
            f"{_fmt_gb(t.warn_b)}"
        )
    if limits.tree_budget_bytes is not None and now.tree_charged_bytes > limits.tree_budget_bytes:
        breaches.append(
            f"server tree uses {_fmt_gb(now.tree_charged_bytes)}, above the pre-flight's expected "
            f"{_fmt_gb(limits.tree_budget_bytes)}"
        )
    psi_limit = limits.psi_full_warn_percent
    if psi_limit is not None and now.psi_full_avg10 is not None and now.psi_full_avg10 >= psi_limit:
        breaches.append(f"memory pressure full avg10 {now.psi_full_avg10:.1f} % >= {psi_limit:g} %")
    return breaches


def decide(
    history: Sequence[Reading],
    limits: Limits,
    *,
    streak: int = 0,
    terminated_at_s: float | None = None,
) -> Decision:
    """Decide on the newest reading of `history` (oldest first; at least one reading).

    `streak` is the previous Decision's streak; `terminated_at_s` the time SIGTERM was sent
    (None when not terminating), so an expired grace escalates to KILL. The rules are tried in
    the order of the module docstring's diagram; the first that fires decides.
    """
    t = _tick(history, limits)
    kill = _crossed(t, streak) or _predicted(t, streak)
    if kill is not None:
        return kill
    if terminated_at_s is not None and t.now.t_s - terminated_at_s >= limits.terminate_grace_s:
        reason = f"SIGTERM grace of {limits.terminate_grace_s:g} s expired with memory still short"
        return t.out(Verdict.KILL, reason, streak)
    if t.now.available_bytes <= t.term_b:
        reason = (
            f"host memory available {_fmt_gb(t.now.available_bytes)} at or below the terminate "
            f"level {_fmt_gb(t.term_b)}"
        )
        return t.out(Verdict.TERMINATE, reason, streak)
    breaches = _warn_breaches(t)
    if not breaches:
        return t.out(Verdict.OK, "memory within limits", 0)
    new_streak = streak + 1
    reason = "; ".join(breaches) + f" ({new_streak} consecutive ticks)"
    verdict = Verdict.WARN if new_streak >= limits.warn_ticks else Verdict.OK
    return t.out(verdict, reason, new_streak)
