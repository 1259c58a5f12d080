"""Every number and string of every config section within its bounds, checked in one place.

Each section's `__post_init__` calls `check_limits(self, "<section>")` after its own rules
(whose messages say more about their keys): the config file, the command line
(`dataclasses.replace` over the file's section) and the `SGLANG_SUPERVISOR_<OPTION>` variables
all construct the section, so all meet the same check.

What is checked, for each int or float field (and each integer of a tuple of them):
- finite: TOML reads `nan` and `inf` as floats, and `nan` passes every `<` and `<=` a section's
  own rule would ask (`ramp_gb_per_second = nan` was "positive");
- sizes (`*_bytes`) within 1 PB and durations (`*_s`) within 30 days, as core/units.py parses
  them, for values that reach a section without its parser (a TOML number of seconds);
- any other number at most DEFAULT_HIGH (a count of 10^18 is a typo, and some become a
  collection's size);
- the narrower bounds LIMITS gives a key, where more would be a typo, a busy loop or a plan of
  a machine that cannot exist.

And each string (and each string of a list): no NUL (a C string ends there: the OS calls that
take it fail later, at launch), at most MAX_TEXT_CHARS (a word of 100,000 characters is no name
and costs every log line that quotes it), and for the keys that name files a path the kernel
takes (PATH_MAX, NAME_MAX): these would fail only when first opened, after the checks passed.

Relations between keys (warn > terminate > kill, backoff_max >= backoff_initial) stay with their
sections.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from supervisor.core.bounded import path_problem, shown
from supervisor.core.units import MAX_DURATION_S, MAX_SIZE_BYTES, GiB, TiB, format_bytes
from supervisor.errors import ConfigError

DEFAULT_HIGH = 10**9


@dataclasses.dataclass(frozen=True, slots=True)
class Limit:
    """Bounds of one key: None leaves that side to the section's own rule (or to the default)."""

    low: float | None = None
    high: float | None = None
    option: str = ""  # the command-line spelling, named beside the key
    why: str = ""  # what a value past the bounds would mean


LIMITS: dict[str, Limit] = {
    "host.gpus": Limit(1, 1024, "--gpus"),
    "host.gpu_memory": Limit(1 * GiB, 4 * TiB, "--gpu-memory", "the memory of one GPU"),
    "host.mem_available": Limit(None, None, "--mem-available"),
    "host.cgroup_headroom": Limit(None, None, "--cgroup-headroom"),
    # Linux's MAX_NUMNODES is 1024 (CONFIG_NODES_SHIFT at most 10).
    "host.numa.node": Limit(0, 1023, "--numa", "a NUMA node number"),
    "host.numa.gpus": Limit(0, 1023, "--numa", "a GPU index"),
    "preflight.avg_request_tokens": Limit(1, 10**8, "--avg-request-tokens"),
    "preflight.load_threads": Limit(0, 1024, why="loader threads per rank"),
    "preflight.weights": Limit(None, None, "--weights"),
    "server.model_config": Limit(option="--model-config"),
    "run.state_dir": Limit(option="--state-dir"),
    "run.health_interval": Limit(0.01, None, why="a probe more often than every 10 ms"),
    "run.failure_threshold": Limit(1, 10**6),
    "run.max_restarts": Limit(0, 10**6),
    "run.keep_files": Limit(1, 10**6),
    "watchdog.min_interval": Limit(0.01, 60, why="the watchdog's fastest tick"),
    "watchdog.max_interval": Limit(None, 60, why="the watchdog's slowest tick"),
    "watchdog.psi_full_warn_percent": Limit(0, 100, why="a share of the time"),
    "watchdog.ramp_gb_per_second": Limit(None, 10_000, why="beyond any memory bandwidth"),
    "watchdog.warn_ticks": Limit(1, 10**6),
    "watchdog.incident_log_lines": Limit(0, 10**6),
    "gpu.max_volatile_dbe": Limit(0, 10**9),
}


MAX_TEXT_CHARS = 4096
# An argument of the server's or a hook's command: Linux's MAX_ARG_STRLEN.
MAX_ARG_CHARS = 128 * 1024
_LONG_TEXT = {"server.args", "server.command", "gpu.reset_command"} | {
    f"hooks.{name}" for name in ("on_incident", "on_fatal", "on_ready")
}
# Keys that name a file or directory: held to what the kernel takes.
PATH_KEYS = frozenset(
    {"server.model_config", "preflight.ledger_dir", "run.state_dir", "metrics.textfile"}
)
SECRET_KEYS = frozenset({"group.token"})  # never quoted


def field_key(name: str) -> str:
    """The TOML key of a section field: its name without the unit suffix."""
    for suffix in ("_bytes", "_s"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def check_limits(section: Any, name: str) -> None:
    """Refuse the first number of `section` (the table `name`) that is not finite or out of
    its bounds, or string that holds a NUL or is too long, naming its key (and option).

    Raises:
        ConfigError: "config key run.health_timeout must be at most 30 days (got ...)".
    """
    for fld in dataclasses.fields(section):
        value = getattr(section, fld.name)
        values = value if isinstance(value, tuple) else (value,)
        key = f"{name}.{field_key(fld.name)}"
        for item in values:
            if isinstance(item, str):
                _check_text(key, item)
            elif isinstance(item, (int, float)) and not isinstance(item, bool):
                _check(key, fld.name, item)


def _check_text(key: str, text: str) -> None:
    option = LIMITS[key].option if key in LIMITS else ""
    named = f"config key {key}" + (f" ({option})" if option else "")
    got = "" if key in SECRET_KEYS else f" (got {shown(text)})"
    if "\0" in text:
        raise ConfigError(f"{named} holds a NUL character{got}")
    most = MAX_ARG_CHARS if key in _LONG_TEXT else MAX_TEXT_CHARS
    if len(text) > most:
        raise ConfigError(f"{named} is longer than {most:,} characters{got}")
    problem = path_problem(text) if key in PATH_KEYS else None
    if problem is not None:
        raise ConfigError(f"{named} {problem}{got}")


def _check(key: str, field_name: str, value: float) -> None:
    limit = LIMITS.get(key, Limit())
    if isinstance(value, float) and not math.isfinite(value):
        _refuse(
            key, dataclasses.replace(limit, why=""), "must be a finite number", value, field_name
        )
    high = limit.high
    if high is None:
        high = _default_high(field_name)
    if limit.low is not None and value < limit.low:
        _refuse(key, limit, f"must be at least {_show(limit.low, field_name)}", value, field_name)
    if value > high:
        _refuse(key, limit, f"must be at most {_show(high, field_name)}", value, field_name)


def _default_high(field_name: str) -> float:
    if field_name.endswith("_bytes"):
        return MAX_SIZE_BYTES
    if field_name.endswith("_s"):
        return MAX_DURATION_S
    return DEFAULT_HIGH


def _refuse(key: str, limit: Limit, rule: str, value: float, field_name: str) -> None:
    option = f" ({limit.option})" if limit.option else ""
    why = f", {limit.why}" if limit.why else ""
    raise ConfigError(f"config key {key}{option} {rule}{why} (got {_show(value, field_name)})")


def _show(value: float, field_name: str) -> str:
    """A bound or a value in the key's unit."""
    if isinstance(value, int) and value.bit_length() > 200:
        return f"about 10^{int(value.bit_length() * math.log10(2))}"  # str() stops at 4300 digits
    if not math.isfinite(value):
        return str(value)
    if field_name.endswith("_bytes"):
        return format_bytes(value)
    if field_name.endswith("_s"):
        if value == MAX_DURATION_S:
            return "30 days (720h)"
        return f"{value * 1000:g} ms" if value < 1 else f"{value:g} s"
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"
