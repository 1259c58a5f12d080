"""The measured path's regexes (core/measured.py) bound to the format strings SGLang prints.

The product owns the regexes: every (opening phrase, pattern) and every pattern that
core/measured.py exports is a `Reader` here, found by `readers()` without a list to keep. The
contract owns the bindings: for each reader, the words of SGLang's format (`anchor`), every
file of `sglang/` printing it (`files`), and, per regex group, the expression SGLang formats
into the place that group must read (`groups`, in `ast.unparse` spelling).

`problems()` renders each printing format of each file with distinct values in its placeholders
(tests/contract/sglang_formats.py), reads the line as SizingLog does (the pattern searched after
the phrase), and says what did not come out as SGLang put it in.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from tests.contract.sglang_formats import Format, formats, sample_value
from tests.contract.sglang_text import source


@dataclass(frozen=True, slots=True)
class Reader:
    """One regex of the product: `pattern` searched after `phrase` ("": anywhere)."""

    name: str
    phrase: str
    pattern: str

    def read(self, line: str) -> re.Match[str] | None:
        """As core/measured.py SizingLog._found reads a line."""
        at = line.find(self.phrase)
        return None if at == -1 else re.compile(self.pattern).search(line, at + len(self.phrase))


@dataclass(frozen=True, slots=True)
class Binding:
    name: str  # the reader's constant in core/measured.py
    # SGLang's literal text, each piece within one literal of its source: a format carrying all
    # of the pieces prints the line.
    anchor: tuple[str, ...]
    files: tuple[str, ...]  # every file under sglang/ that prints it
    # Per group of the regex, the expression it must read (a group reads nothing from a format
    # without that expression), or a tuple of its spellings in different releases (an attribute
    # in one, the argument it is set from in another): the first one the format has.
    groups: tuple[str | tuple[str, ...], ...]
    exact: bool = False  # the format's whole literal text is the anchor


SERVER = "srt"  # what `sglang.launch_server` runs; files are named from sglang/
BINDINGS: tuple[Binding, ...] = (
    Binding(
        "WEIGHTS_LINE",
        ("Load weight end. ", "avail mem=", "mem usage="),
        ("srt/model_executor/model_runner.py",),
        ("after_avail_memory", "self.weight_load_mem_usage"),
    ),
    Binding(
        "KV_LINE",
        ("is allocated", ". dtype: ", "#tokens: "),
        ("srt/mem_cache/memory_pool.py",),
        ("self.allocation_label", "num_tokens"),  # no label: "KV Cache is allocated"
    ),
    Binding(
        "HOST_POOL_LINE",
        ("Allocating ", " hierarchical KV host pool: "),
        ("srt/mem_cache/pool_host/base.py",),
        # 0.5.20 formats the constructor's argument, 0.5.23 the attribute set from it.
        (("self.pool_label", "pool_label"), "self.size"),
    ),
    Binding(
        "POOL_END_LINE",
        ("Memory pool end. ", "avail mem="),
        ("srt/mem_cache/kv_cache_configurator.py",),
        ("get_available_gpu_memory(self.device, self.gpu_id)",),
    ),
    Binding(
        "MAMBA_LINE",
        ("Mamba Cache is allocated. ", "max_mamba_cache_size: "),
        ("srt/mem_cache/memory_pool.py",),
        ("size",),
    ),
    Binding(
        "MAMBA_HOST_LINE",
        ("Allocating ", " GB host memory for hierarchical Mamba cache ("),
        ("srt/mem_cache/pool_host/mamba.py",),
        ("requested_bytes / 1000000000.0", "self.size"),  # 0.5.20 prints no slot count
    ),
    # The scheduler's logger prefix (" DP0 PP1 TP3 EP3"), the rank that prints the line.
    Binding("RANK_PATTERN", (" TP",), ("srt/managers/scheduler.py",), ("shown_tp",), exact=True),
)


def _is_line(value: object) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, str) for v in value)


def _has_groups(text: str) -> bool:
    try:
        return re.compile(text).groups > 0
    except re.error:
        return False


def readers(module: ModuleType) -> tuple[list[Reader], list[str]]:
    """Every regex `module` exports, by its public name, and what exported has no name.

    A public (phrase, pattern) pair is a reader, so is a public string that is a regex with a
    group; a public tuple or list of either must hold only those (a regex in it without a name
    of its own cannot be bound)."""
    public = {k: v for k, v in vars(module).items() if not k.startswith("_")}
    lines = {k: v for k, v in public.items() if _is_line(v)}
    patterns = {k: v for k, v in public.items() if isinstance(v, str) and _has_groups(v)}
    found = [Reader(k, *v) for k, v in lines.items()]
    found += [Reader(k, "", v) for k, v in patterns.items()]
    known = {*patterns.values(), *(pattern for _, pattern in lines.values())}
    unnamed = []
    for key, value in public.items():
        if not isinstance(value, tuple | list) or _is_line(value):
            continue
        for i, item in enumerate(value):
            pair = _is_line(item) and item not in lines.values()
            text = isinstance(item, str) and _has_groups(item) and item not in known
            if pair or text:
                unnamed.append(f"{module.__name__}.{key}[{i}] = {item!r} has no public name")
    return found, unnamed


@functools.cache
def _server_files(root: Path) -> tuple[Path, ...]:
    """The server's files (sglang/srt): the benchmarks and multimodal_gen log their own way."""
    return tuple(sorted((root / SERVER).rglob("*.py")))


def _may_print(binding: Binding, text: str) -> bool:
    """A cheap look at the file's text before parsing it: each piece of the anchor is there
    (each sits within one literal of SGLang's source), or, for an exact anchor, a string
    literal opens with it."""
    if binding.exact:
        anchor = "".join(binding.anchor)
        return f'"{anchor}' in text or f"'{anchor}" in text
    return all(piece in text for piece in binding.anchor)


def printers(binding: Binding, root: Path) -> list[Format]:
    """Every format of the server under `root` (a release's sglang/) carrying the anchor."""
    tree = source(root)
    found = []
    for path in _server_files(root):
        if not _may_print(binding, tree.text(path)):
            continue
        for fmt in formats(path):
            if binding.exact:
                if fmt.literal == "".join(binding.anchor):
                    found.append(fmt)
            elif all(word in fmt.literal for word in binding.anchor):
                found.append(fmt)
    return found


def _spellings(group: str | tuple[str, ...]) -> tuple[str, ...]:
    return (group,) if isinstance(group, str) else group


def read_problems(reader: Reader, binding: Binding, fmt: Format, where: str) -> list[str]:
    """What `reader` gets wrong about one format: no match, or a group off its placeholder."""
    holes = {h.expr: h for h in fmt.holes}
    # Each group's expression as this format spells it (None: the format has none of them).
    exprs = [next((e for e in _spellings(g) if e in holes), None) for g in binding.groups]
    if not any(exprs):
        return [f"{where}: none of {binding.groups} in SGLang's format, only {sorted(holes)}"]
    bound = {expr: n for n, expr in enumerate(exprs) if expr is not None}
    line = fmt.render(lambda i, hole: sample_value(i, hole, bound))
    match = reader.read(line)
    if match is None:
        return [f"{where}: {reader.name} {reader.pattern!r} does not read {line!r}"]
    # A group whose expression this format (or this choice of it) lacks must read nothing: an
    # optional part, such as a pool's label where SGLang prints none.
    want = tuple(None if e is None else sample_value(0, holes[e], bound) for e in exprs)
    if match.groups() != want:
        return [f"{where}: {reader.name} reads {match.groups()} from {line!r}, not {want}"]
    return []


def problems(reader: Reader, binding: Binding, root: Path) -> list[str]:
    """Everything `reader` misses of the lines `binding` says the release under `root` prints."""
    found = printers(binding, root)
    files = sorted({str(f.path.relative_to(root)) for f in found})
    out = []
    if files != sorted(binding.files):
        out.append(f"{binding.name}: {binding.anchor} is printed by {files}, not {binding.files}")
    for fmt in found:
        where = f"{fmt.path.relative_to(root)}:{fmt.line}"
        out.extend(read_problems(reader, binding, fmt, where))
    return out


def words(text: str) -> Iterable[tuple[int, int]]:
    """The spans of a regex's literal words (two letters or more; an escape such as \\b or \\d
    is not one)."""
    for match in re.finditer(r"\\.|[A-Za-z]{2,}", text):
        if not match.group().startswith("\\"):
            yield match.span()
