"""SGLang's log formats as pieces: literal text and placeholders, to render sample lines from.

tests/contract/sglang_text.py asks "can this release print a line like this one" (each formatted
part matches anything). This module goes the other way, for the lines whose numbers the
supervisor reads: it takes each format string of a file apart (an f-string's `JoinedStr`, or a
logger call's %-format and its arguments), and renders it with chosen values in the
placeholders, so that a test can feed the line to the supervisor's own regex and see which
value comes out of which group. Read with `ast` only; nothing of SGLang is imported.

An f-string placeholder that is a choice between strings (`{'a' if c else 'b'}`), a string
concatenation (`{x + ', '}`) or a local name assigned only strings in that file
(`cache_name = f"{label} KV Cache" if label else "KV Cache"`) becomes one format per choice.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

_PERCENT = re.compile(r"%(\([^)]*\))?([-#0 +]*(?:\d+|\*)?(?:\.\d+)?)([diouxXeEfFgGcrsa%])")
_LOGGER_CALLS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical"})
# One format's choices multiply; past this many the rest are not rendered.
_MAX_CHOICES = 16
_MAX_DEPTH = 3  # a name resolved to a format naming another name, and so on


@dataclass(frozen=True, slots=True)
class Hole:
    """One placeholder: the expression SGLang formats there (`ast.unparse`), and its spec."""

    expr: str
    spec: str  # a format spec as `format()` takes it: ".2f", "d", "" (str)


Piece = str | Hole


@dataclass(frozen=True, slots=True)
class Format:
    pieces: tuple[Piece, ...]
    path: Path
    line: int

    @property
    def literal(self) -> str:
        """The literal text alone, placeholders dropped."""
        return "".join(p for p in self.pieces if isinstance(p, str))

    @property
    def holes(self) -> tuple[Hole, ...]:
        return tuple(p for p in self.pieces if isinstance(p, Hole))

    def render(self, fill: Callable[[int, Hole], str]) -> str:
        """The line SGLang prints with `fill(i, hole)` in the i-th placeholder."""
        out, i = [], 0
        for piece in self.pieces:
            if isinstance(piece, str):
                out.append(piece)
            else:
                out.append(fill(i, piece))
                i += 1
        return "".join(out)


def _spec(node: ast.expr | None) -> str:
    if isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values):
        return "".join(str(v.value) for v in node.values if isinstance(v, ast.Constant))
    return ""


def _is_text(node: ast.expr) -> bool:
    """A string-valued expression made only of literals and placeholders."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.IfExp):
        return _is_text(node.body) and _is_text(node.orelse)
    return False


def _is_concatenation(node: ast.expr) -> bool:
    """`x + ', '`: a string put together, not a sum."""
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Add)
        and (_is_text(node.left) or _is_text(node.right))
    )


class _Reader:
    """The formats of one module, with its names assigned only strings."""

    def __init__(self, tree: ast.Module) -> None:
        assigned: dict[str, list[ast.expr]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, []).append(node.value)
        self.names = {
            name: values for name, values in assigned.items() if all(map(_is_text, values))
        }

    def choices(self, node: ast.expr, spec: str, depth: int) -> list[tuple[Piece, ...]]:
        """What one formatted expression can print: literal choices, or one placeholder."""
        if depth < _MAX_DEPTH:
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                return [(node.value,)]
            if isinstance(node, ast.JoinedStr):
                return self.pieces(node.values, depth + 1)
            if isinstance(node, ast.IfExp):
                body = self.choices(node.body, spec, depth + 1)
                return body + self.choices(node.orelse, spec, depth + 1)
            if _is_concatenation(node) and isinstance(node, ast.BinOp):
                left = self.choices(node.left, spec, depth + 1)
                right = self.choices(node.right, spec, depth + 1)
                return [a + b for a in left for b in right][:_MAX_CHOICES]
            if isinstance(node, ast.Name) and node.id in self.names:
                out = [c for v in self.names[node.id] for c in self.choices(v, spec, depth + 1)]
                return out[:_MAX_CHOICES]
        return [(Hole(ast.unparse(node), spec),)]

    def pieces(self, values: list[ast.expr], depth: int) -> list[tuple[Piece, ...]]:
        out: list[tuple[Piece, ...]] = [()]
        for value in values:
            if isinstance(value, ast.FormattedValue):
                options = self.choices(value.value, _spec(value.format_spec), depth)
            elif isinstance(value, ast.Constant):
                options = [(str(value.value),)]
            else:
                options = [(Hole(ast.unparse(value), ""),)]
            out = [head + option for head in out for option in options][:_MAX_CHOICES]
        return out


def _percent_pieces(text: str, args: list[ast.expr]) -> tuple[Piece, ...] | None:
    """A %-format with its arguments as placeholders; None when they do not line up."""
    pieces: list[Piece] = []
    at, used = 0, 0
    for match in _PERCENT.finditer(text):
        pieces.append(text[at : match.start()])
        at = match.end()
        named, flags, kind = match.groups()
        if kind == "%":
            pieces.append("%")
            continue
        if named or "*" in flags or used >= len(args):
            return None
        spec = "" if kind in "sra" else flags + ("d" if kind in "iu" else kind)
        pieces.append(Hole(ast.unparse(args[used]), spec))
        used += 1
    pieces.append(text[at:])
    if used != len(args) or any(isinstance(a, ast.Starred) for a in args):
        return None
    return tuple(p for p in pieces if p != "")


def _percent_formats(node: ast.AST) -> tuple[str, list[ast.expr]] | None:
    """`logger.info("… %d …", n)` or `"… %d …" % (n,)`: the format and its arguments."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _LOGGER_CALLS
        and len(node.args) > 1
        and isinstance(first := node.args[0], ast.Constant)
        and isinstance(first.value, str)
    ):
        return first.value, list(node.args[1:])
    if (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Mod)
        and isinstance(node.left, ast.Constant)
        and isinstance(node.left.value, str)
    ):
        right = node.right
        return node.left.value, list(right.elts) if isinstance(right, ast.Tuple) else [right]
    return None


def formats_of(tree: ast.Module, path: Path) -> Iterator[Format]:
    reader = _Reader(tree)
    specs = {
        id(n.format_spec)
        for n in ast.walk(tree)
        if isinstance(n, ast.FormattedValue) and n.format_spec is not None
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and id(node) not in specs:
            for pieces in reader.pieces(node.values, 0):
                yield Format(tuple(p for p in pieces if p != ""), path, node.lineno)
        elif (found := _percent_formats(node)) is not None:
            pieces_or_none = _percent_pieces(*found)
            if pieces_or_none is not None:
                yield Format(pieces_or_none, path, getattr(node, "lineno", 0))


@functools.cache
def formats(path: Path) -> tuple[Format, ...]:
    """Every format string of one file (a file that does not parse has none)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except SyntaxError:
        return ()
    return tuple(formats_of(tree, path))


def sample_value(index: int, hole: Hole, bound: Mapping[str, int]) -> str:
    """A plausible value for a placeholder, distinct for each: the `bound` ones (expression ->
    its number among the values a regex must extract) far from the others, so that a group
    reading the wrong placeholder cannot come out right by chance."""
    kind = hole.spec[-1:]
    floating = kind != "" and kind in "eEfFgG%"
    if hole.expr in bound:
        n = bound[hole.expr]
        return format(40.5 + 11 * n, hole.spec) if floating else str(654321 + n)
    if floating:
        return format(1.25 + index, hole.spec)
    if kind in ("d", "x", "X", "o"):
        return format(100 + index, hole.spec)
    return f"w{index}"
