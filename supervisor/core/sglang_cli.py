"""SGLang's launch_server command line as data, and reading an argv exactly as SGLang does.

SGLang parses its argv with the standard library's argparse (server_args.py
`prepare_server_args`); so does this module, over a table of every flag of the release
(core/sglang_cli_data.py, read from the wheels by scripts/contract). Abbreviations, `--a=b`,
repeated flags (the last wins), choices, types and the required `--model-path` therefore
behave as in SGLang, with argparse's own messages. A YAML `--config` file is merged the way
SGLang's `ConfigArgumentMerger` merges it (utils/server_args_config_parser.py).
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

PROG = "launch_server.py"


class ArgvError(ValueError):
    """The launch_server argv is malformed; the message is SGLang's (argparse's) own."""


@dataclass(frozen=True, slots=True)
class CliFlag:
    """One flag as SGLang registers it with argparse."""

    names: tuple[str, ...]
    dest: str
    nargs: int | str = 1  # 0 (a switch), 1, or argparse's "?", "*", "+"
    kind: str = "str"  # str | int | float: what values are converted to
    choices: tuple[str | int, ...] | None = None  # None: free, or only known at run time
    required: bool = False
    action: str = "store"  # store | store_true | bool_optional (--x/--no-x) | custom (SGLang's)

    def encode(self) -> str:
        """NAMES[^DEST][:NARGS][@KIND][=CHOICES][!][~|%] (see sglang_cli_data.py)."""
        text = "|".join(self.names)
        if self.dest != self.names[0][2:].replace("-", "_"):
            text += f"^{self.dest}"
        if self.nargs != 1:
            text += f":{self.nargs}"
        if self.kind != "str":
            text += f"@{self.kind}"
        if self.choices is not None:
            text += "=" + ",".join(str(c) for c in self.choices)
        if self.required:
            text += "!"
        if self.action == "custom" or (self.action == "store" and self.nargs == 0):
            text += "~"
        elif self.action == "bool_optional":
            text += "%"
        return text

    @classmethod
    def decode(cls, text: str) -> CliFlag:
        custom = text.endswith("~")
        bool_optional = text.endswith("%")
        text = text.removesuffix("~").removesuffix("%")
        required = text.endswith("!")
        text = text.removesuffix("!")
        text, _, choice_text = text.partition("=")
        text, _, kind = text.partition("@")
        text, _, nargs_text = text.partition(":")
        names_text, _, dest = text.partition("^")
        names = tuple(names_text.split("|"))
        nargs: int | str = 1
        if nargs_text:
            nargs = int(nargs_text) if nargs_text.isdigit() else nargs_text
        kind = kind or "str"
        choices: tuple[str | int, ...] | None = None
        if choice_text:
            items = choice_text.split(",")
            choices = tuple(int(c) for c in items) if kind == "int" else tuple(items)
        action = "custom" if custom else ("store_true" if nargs == 0 else "store")
        if bool_optional:
            action = "bool_optional"
        return cls(
            names=names,
            dest=dest or names[0][2:].replace("-", "_"),
            nargs=nargs,
            kind=kind,
            choices=choices,
            required=required,
            action=action,
        )


@dataclass(frozen=True)
class CliTable:
    """Every flag of one SGLang release."""

    version: str
    flags: tuple[CliFlag, ...]
    by_name: dict[str, CliFlag] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {n: f for f in self.flags for n in f.names})

    def flag(self, name: str) -> CliFlag | None:
        return self.by_name.get(name)


@dataclass(frozen=True, slots=True)
class CliRules:
    """How to read an argv: the release's table, and whether flags it lacks pass through (an
    SGLang newer than every table: refusing them could block a new release's flags)."""

    table: CliTable
    passthrough_unknown: bool = False
    yaml_any_spelling: bool = True  # a --config key may be any long spelling (0.5.23 and later)


@dataclass(frozen=True, slots=True)
class ParsedCli:
    """What argparse made of an argv: the given flags' values by dest."""

    values: Mapping[str, Any]
    unknown: tuple[str, ...] = ()  # flags the table lacks (only with passthrough)
    repeated: tuple[str, ...] = ()  # flags (first names) given more than once: the last wins


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print and exit 2
        raise ArgvError(message)

    def _get_formatter(self) -> argparse.HelpFormatter:
        # add_argument asks for a formatter per flag, and each default one asks the terminal for
        # its size (importing shutil): ~4 ms of the pre-flight for help that is never printed.
        return argparse.HelpFormatter(self.prog, width=100)


_TYPES: dict[str, type] = {"str": str, "int": int, "float": float}


@functools.lru_cache(maxsize=8)
def _parser(table: CliTable) -> _Parser:
    # SUPPRESS: only flags given on the command line appear in the result.
    parser = _Parser(prog=PROG, add_help=False, argument_default=argparse.SUPPRESS)
    for flag in table.flags:
        kwargs: dict[str, Any] = {"dest": flag.dest, "required": flag.required}
        names = flag.names
        if flag.action == "bool_optional":
            # The table lists the `--no-` spellings after the others; argparse adds them itself.
            names = names[: len(names) // 2]
            kwargs["action"] = argparse.BooleanOptionalAction
        elif flag.nargs == 0:
            kwargs.update(action="store_const", const=True)
        else:
            kwargs["type"] = _TYPES.get(flag.kind, str)
            if flag.nargs != 1:
                kwargs["nargs"] = flag.nargs
            if flag.choices is not None:
                kwargs["choices"] = flag.choices
        parser.add_argument(*names, **kwargs)
    return parser


def parse_cli(argv: Sequence[str], rules: CliRules) -> ParsedCli:
    """Read `argv` as SGLang's argparse would.

    Raises:
        ArgvError: what SGLang would refuse (an unknown or ambiguous flag, a missing value, an
            invalid choice or number, no --model-path), in argparse's words.
    """
    parser = _parser(rules.table)
    if rules.passthrough_unknown:
        namespace, extra = parser.parse_known_args(list(argv))
        unknown = tuple(t for t in extra if t.startswith("--"))
    else:
        namespace, unknown = parser.parse_args(list(argv)), ()
    seen: dict[str, int] = {}
    for span in option_spans(argv, rules.table):
        seen[span.flag.names[0]] = seen.get(span.flag.names[0], 0) + 1
    repeated = tuple(sorted(name for name, n in seen.items() if n > 1))
    return ParsedCli(values=vars(namespace), unknown=unknown, repeated=repeated)


def resolve(token: str, table: CliTable) -> CliFlag | None:
    """The flag an option token names, with argparse's unique-prefix rule (None: unknown or
    ambiguous; parse_cli reports which)."""
    name = token.partition("=")[0]
    if name in table.by_name:
        return table.by_name[name]
    matches = [n for n in table.by_name if n.startswith(name)]
    return table.by_name[matches[0]] if len(matches) == 1 else None


class Span(NamedTuple):
    """Where one flag stands in an argv."""

    at: int
    flag: CliFlag
    token: str  # as written: an abbreviation, or `--name=value`
    values: tuple[int, ...]  # indexes of its values (none for an inline `--name=value`)


def option_spans(argv: Sequence[str], table: CliTable) -> list[Span]:
    """Where each known flag stands, in order: used to edit and redact an argv in place."""
    out: list[Span] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        flag = resolve(token, table) if token.startswith("--") and token != "--" else None
        if flag is None:
            i += 1
            continue
        if "=" in token or flag.nargs == 0:
            out.append(Span(i, flag, token, ()))
            i += 1
            continue
        values = []
        j = i + 1
        while j < len(argv) and not _looks_like_option(argv[j]):
            values.append(j)
            j += 1
            if flag.nargs in (1, "?"):
                break
        out.append(Span(i, flag, token, tuple(values)))
        i = j
    return out


def _looks_like_option(token: str) -> bool:
    if not token.startswith("-") or token == "-":
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False  # a negative number is a value, as argparse reads it here


def merge_yaml(
    argv: Sequence[str], config: Mapping[str, Any], table: CliTable, *, all_spellings: bool
) -> tuple[str, ...]:
    """The argv SGLang builds from `--config FILE` and the YAML mapping loaded from FILE: the
    file's flags first, then the command line around `--config FILE` (so the command line wins).

    `all_spellings`: SGLang 0.5.23 accepts any long spelling of a flag as a YAML key when
    telling switches from valued flags; earlier releases only the flag's dest.

    Raises:
        ArgvError: `--config` given twice or without a file, or a key SGLang cannot take from a
            file (a flag with an action of its own), in SGLang's words.
    """
    indexes = [i for i, token in enumerate(argv) if token == "--config"]
    if len(indexes) > 1:
        raise ArgvError("Multiple config files specified! Only one allowed.")
    if not indexes:
        return tuple(argv)
    at = indexes[0]
    if at == len(argv) - 1:
        raise ArgvError("No config file specified after --config flag!")
    switches, unsupported = _yaml_key_kinds(table, all_spellings=all_spellings)
    args: list[str] = []
    for key, value in config.items():
        norm = str(key).replace("-", "_")
        if norm in unsupported:
            action = "BooleanOptionalAction" if unsupported[norm] == "bool_optional" else "custom"
            raise ArgvError(f"Unsupported config option '{norm}' with action '{action}'")
        if isinstance(value, bool):
            if norm in switches:
                args += [f"--{key}"] if value else []
            else:
                args += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            args += [f"--{key}", *(str(v) for v in value)] if value else []
        elif isinstance(value, dict):
            args += [f"--{key}", json.dumps(value)]
        else:
            args += [f"--{key}", str(value)]
    return (*args, *argv[:at], *argv[at + 2 :])


def _yaml_key_kinds(table: CliTable, *, all_spellings: bool) -> tuple[set[str], dict[str, str]]:
    """(keys that are switches, {key of a flag a config file cannot set: its action})."""

    def keys(flag: CliFlag) -> set[str]:
        if not all_spellings:
            return {flag.dest}
        return {flag.dest} | {n[2:].replace("-", "_") for n in flag.names}

    switches = {k for f in table.flags if f.action == "store_true" for k in keys(f)}
    one_value = [f for f in table.flags if f.action == "custom" and f.nargs == 1]
    supported = [f for f in table.flags if f.action in ("store", "store_true")]
    if all_spellings:
        supported += one_value
    usable = {k for f in supported for k in keys(f)}
    unsupported = {
        k: f.action
        for f in table.flags
        if f not in supported and "--config" not in f.names
        for k in keys(f)
        if k not in usable
    }
    return switches, unsupported
