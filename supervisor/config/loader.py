"""Load the supervisor's TOML config (`[server]`, `[host]`, `[preflight]`, ...) into the section
dataclasses; sizes and durations are parsed here, at the edge, and every error names its key.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from supervisor.atomic_file import NotRegularFile, open_regular
from supervisor.config.limits import field_key
from supervisor.config.sections import NumaNodeSpec, SupervisorConfig
from supervisor.core.bounded import MAX_NESTING, nesting_problem, shown
from supervisor.core.units import parse_duration, parse_size
from supervisor.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


def toml_key(name: str) -> str:
    """The TOML key of a section field: its name without the unit suffix."""
    return field_key(name)


T = TypeVar("T")
MAX_CONFIG_BYTES = 1 << 20  # a config file; anything larger is a mistake (or an attack)


def _convert(key: str, field_name: str, annotation: Any, raw: Any) -> Any:
    """Convert one TOML value to the field's type; raise ConfigError naming the key."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _convert(key, field_name, inner[0], raw)
    try:
        if field_name.endswith("_bytes"):
            return parse_size(raw)
        if field_name.endswith("_s"):
            return parse_duration(raw)
    except ValueError as exc:
        raise ConfigError(f"config key {key}: {exc}") from None
    expected: str
    if annotation is bool:
        if isinstance(raw, bool):
            return raw
        expected = "true or false"
    elif annotation is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        expected = "an integer"
    elif annotation is float:
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return float(raw)
        expected = "a number"
    elif annotation is str:
        if isinstance(raw, str):
            return raw
        expected = "a string"
    elif origin is tuple and args and args[0] is str:
        if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
            return tuple(raw)
        expected = "a list of strings"
    elif origin is tuple and args and args[0] is int:
        if isinstance(raw, list) and all(
            isinstance(x, int) and not isinstance(x, bool) for x in raw
        ):
            return tuple(raw)
        expected = "a list of integers"
    elif origin is tuple and args and args[0] is NumaNodeSpec:
        if isinstance(raw, list) and all(isinstance(x, dict) for x in raw):
            return tuple(_section(NumaNodeSpec, x, f"{key}[{i}]") for i, x in enumerate(raw))
        expected = "a list of tables ([[host.numa]])"
    elif origin is Mapping or annotation is Mapping:
        if isinstance(raw, dict) and all(isinstance(v, str) for v in raw.values()):
            return dict(raw)
        expected = "a table of strings"
    else:  # pragma: no cover - a field type this loader was not taught
        raise TypeError(f"unsupported config field type {annotation!r} for {key}")
    raise ConfigError(
        f"config key {key}: expected {expected}, got {type(raw).__name__} {shown(raw)}"
    )


def _split_command(key: str, text: str) -> list[str]:
    """A command given as one string, split like a shell would (no shell runs it)."""
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"config key {key}: {exc}") from None


def _section(cls: type[T], table: Mapping[str, Any], prefix: str) -> T:
    """Build a section dataclass from a TOML table; unknown keys and bad types name the key."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"config key {prefix}: expected a table")
    hints = typing.get_type_hints(cls)
    by_key = {toml_key(f.name): f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, raw in table.items():
        fld = by_key.get(key)
        if fld is None:
            known = ", ".join(sorted(by_key))
            raise ConfigError(f"unknown config key {prefix}.{key} (known keys: {known})")
        if fld.metadata.get("command") and isinstance(raw, str):
            raw = _split_command(f"{prefix}.{key}", raw)
        kwargs[fld.name] = _convert(f"{prefix}.{key}", fld.name, hints[fld.name], raw)
    missing = [
        toml_key(f.name)
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and f.name not in kwargs
    ]
    if missing:
        raise ConfigError(f"config key {prefix}.{missing[0]} is required")
    return cls(**kwargs)


def _read_regular(path: Path) -> bytes:
    """The bytes of `path`, a regular file only: reading a FIFO blocks until a writer comes
    (for ever), a device may never end. Checked before the open, and again on the descriptor,
    opened without blocking, in case the path changed in between.

    Raises:
        ConfigError: not a regular file (its kind named), or unreadable.
    """
    try:
        with open_regular(path) as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except NotRegularFile as exc:
        raise ConfigError(f"config file {path} is {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than 1 MiB; not a config")
    return data


def read_toml(path: Path) -> dict[str, Any]:
    """Read a TOML file.

    Raises:
        ConfigError: not a regular file, unreadable, larger than 1 MiB, not UTF-8 (TOML's only
            encoding), a syntax error (tomllib's message carries the line), or nested more
            than MAX_NESTING levels deep.
    """
    raw = _read_regular(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"config file {path} is not UTF-8 text (line {line}: {exc.reason}); TOML files "
            "are UTF-8"
        ) from None
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except ValueError as exc:  # an integer past Python's 4,300 digits, raised as it is
        reason = str(exc).split(";")[0]  # not Python's advice on set_int_max_str_digits
        raise ConfigError(f"config file {path} is not valid TOML: {reason}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ConfigError(
            f"config file {path} is not a config: nested more than {MAX_NESTING} levels deep"
        ) from None
    problem = nesting_problem(data)
    if problem is not None:
        raise ConfigError(f"config file {path} is not a config: {problem}")
    return data


def parse_section(cls: type[T], data: Mapping[str, Any], name: str) -> T:
    """The section `name` of a loaded TOML document as `cls` (defaults when absent)."""
    return _section(cls, data.get(name, {}), name)


def check_known_sections(data: Mapping[str, Any], known: typing.Iterable[str], path: Path) -> None:
    """Refuse top-level tables the program does not know (a typo would silently do nothing)."""
    known_set = set(known)
    for key in data:
        if key not in known_set:
            raise ConfigError(
                f"unknown config section [{key}] in {path} (known: {', '.join(sorted(known_set))})"
            )


_SECTIONS: dict[str, type[Any]] = {
    f.name: f.type if isinstance(f.type, type) else typing.get_type_hints(SupervisorConfig)[f.name]
    for f in dataclasses.fields(SupervisorConfig)
}


def load_config(path: Path | None) -> SupervisorConfig:
    """Load a config file; None gives the defaults.

    Raises:
        ConfigError: unreadable file, TOML syntax error (with its line), unknown section or key,
            or a value of the wrong type (the message names the key).
    """
    if path is None:
        return SupervisorConfig()
    data = read_toml(path)
    check_known_sections(data, _SECTIONS, path)
    sections = {name: parse_section(cls, data, name) for name, cls in _SECTIONS.items()}
    return SupervisorConfig(**sections)
