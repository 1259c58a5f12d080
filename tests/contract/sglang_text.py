"""The strings of an SGLang release's source as templates: what it can print, what it names.

A log line is built from an f-string, a %-format or a `.format` template; each string literal
becomes a template whose formatted parts match anything. A line the supervisor recognises is
then "printable by that release" when some template matches it. Read with `ast` and text
search only; nothing of SGLang is imported.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_HOLE = "\x00"
_PERCENT = re.compile(r"%[-#0 +]*(?:\d+|\*)?(?:\.\d+)?[sdifgrxXeE]")
_BRACES = re.compile(r"\{[^{}]*\}")
# A template must carry this much literal text to count: "{}" alone matches every line.
_MIN_LITERAL = 12


@dataclass(frozen=True, slots=True)
class Template:
    text: str  # literal parts, formatted parts as _HOLE
    path: Path

    @property
    def pattern(self) -> re.Pattern[str]:
        return _compile(self.text)


@functools.cache
def _compile(text: str) -> re.Pattern[str]:
    return re.compile(".*?".join(re.escape(part) for part in text.split(_HOLE)))


def _templates(tree: ast.AST) -> Iterator[str]:
    parts_of_fstrings = {
        id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield from _expand(node)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in parts_of_fstrings  # a piece of an f-string is not a line
        ):
            yield _BRACES.sub(_HOLE, _PERCENT.sub(_HOLE, node.value))


def _expand(node: ast.JoinedStr) -> list[str]:
    """An f-string's templates: `{'a' if c else 'b'}` gives one template per branch."""
    out = [""]
    for value in node.values:
        if isinstance(value, ast.Constant):
            choices = [str(value.value)]
        elif isinstance(value, ast.FormattedValue) and _literal_branches(value.value):
            choices = _literal_branches(value.value)
        else:
            choices = [_HOLE]
        out = [head + choice for head in out for choice in choices][:16]
    return out


def _literal_branches(node: ast.expr) -> list[str]:
    if (
        isinstance(node, ast.IfExp)
        and isinstance(node.body, ast.Constant)
        and isinstance(node.orelse, ast.Constant)
    ):
        return [str(node.body.value), str(node.orelse.value)]
    return []


class Source:
    """One release's `sglang/` tree."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._texts: dict[Path, str] = {}

    def text(self, path: Path) -> str:
        if path not in self._texts:
            self._texts[path] = path.read_text(encoding="utf-8", errors="replace")
        return self._texts[path]

    def files(self) -> list[Path]:
        return sorted(self.root.rglob("*.py"))

    def files_containing(self, word: str) -> list[Path]:
        """The .py files whose text contains `word` (case-insensitive)."""
        low = word.lower()
        return [p for p in self.files() if low in self.text(p).lower()]

    @functools.cache  # noqa: B019 - one Source per release, kept for the session
    def templates(self, path: Path) -> tuple[Template, ...]:
        try:
            tree = ast.parse(self.text(path))
        except SyntaxError:
            return ()
        return tuple(Template(t, path) for t in _templates(tree))

    def constants(self, path: Path) -> str:
        """Every string literal of a file, joined: where a phrase's words are looked for."""
        return "\n".join(t.text for t in self.templates(path))

    def printing(self, line: str, anchor: str) -> list[Template]:
        """Templates of files containing `anchor` that can produce `line`."""
        found = []
        for path in self.files_containing(anchor):
            for template in self.templates(path):
                literal = len(template.text.replace(_HOLE, ""))
                if literal >= _MIN_LITERAL and template.pattern.search(line):
                    found.append(template)
        return found

    def string_constants(self, path: Path) -> set[str]:
        try:
            tree = ast.parse(self.text(path))
        except SyntaxError:
            return set()
        return {
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }


@functools.cache
def source(root: Path) -> Source:
    return Source(root)
