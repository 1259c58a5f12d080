"""A regular expression's shape, checked for what makes a backtracking search linear in its text.

Python's `re` backtracks and holds the GIL while it does: a pattern that is quadratic on some
line stops every thread of the supervisor. Timing a pattern proves nothing on a loaded machine,
so this reads its parse tree instead and refuses the shapes that make the work grow faster than
the text:

- an unbounded repeat of anything but one character (`(\\w+)+`, `(?:ab)*`): nested repeats;
- a backreference (what it matches is unknown here);
- two unbounded repeats that can match the same character with nothing mandatory between them
  (`\\w+\\w+`, `\\s*[ \\t]*`): adjacent overlapping repeats, quadratic in one attempt;
- an unbounded repeat that is not the pattern's last element and may be entered inside a run of
  what it matches (`.*host pool`, `(['"]?)(\\w+)=`): a search retries it from every character of
  the run, rescanning the run each time. A repeat is "entered at a run's start" when, walking
  back from it over characters it also matches, one meets a character it cannot match, a
  lookbehind that excludes its characters, `\\b` (for word characters) or `^`;
- a pattern that begins with a variable-width element no lookbehind pins (`[^:]{0,200}:`): the
  search may reach the same later repeat from many starts.

What passes costs, per character of the text, a constant bounded by the pattern (each run is
scanned by O(1) attempts, each attempt backtracks at most once over it). Bounded repeats
(`{0,80}`) cost at most their bound.
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass, field
from typing import Any

if sys.version_info >= (3, 11):
    from re import _constants as C  # noqa: N812
    from re import _parser as sre_parse
else:  # pragma: no cover - 3.10
    import sre_constants as C  # noqa: N812
    import sre_parse

# The characters classes are compared over: Latin, Greek, punctuation, CJK punctuation, kana,
# some ideographs, full-width forms; enough to tell \w, \s, \d and the classes used here apart.
_RANGES = ((0, 0x250), (0x370, 0x400), (0x2000, 0x2070), (0x3000, 0x3100), (0x4E00, 0x4F00))
UNIVERSE = frozenset(c for lo, hi in (*_RANGES, (0xFF00, 0xFFF0)) for c in range(lo, hi))
BOUNDED_MAX = 1000  # a bounded repeat above this is treated as unbounded


@functools.cache
def _category(code: Any, flags: int) -> frozenset[int]:
    regex = {
        C.CATEGORY_DIGIT: r"\d",
        C.CATEGORY_NOT_DIGIT: r"\D",
        C.CATEGORY_SPACE: r"\s",
        C.CATEGORY_NOT_SPACE: r"\S",
        C.CATEGORY_WORD: r"\w",
        C.CATEGORY_NOT_WORD: r"\W",
    }[code]
    compiled = re.compile(regex, flags & re.ASCII)
    return frozenset(c for c in UNIVERSE if compiled.fullmatch(chr(c)))


WORD = _category(C.CATEGORY_WORD, 0)


def _cased(chars: set[int], flags: int) -> frozenset[int]:
    if not flags & re.IGNORECASE:
        return frozenset(chars)
    out = set(chars)
    for c in chars:
        out |= {ord(x) for x in (chr(c).lower(), chr(c).upper()) if len(x) == 1}
    return frozenset(out)


def _class(items: Any, flags: int) -> frozenset[int]:
    chars: set[int] = set()
    negate = False
    for op, av in items:
        if op is C.NEGATE:
            negate = True
        elif op is C.LITERAL:
            chars.add(int(av))
        elif op is C.RANGE:
            lo, hi = av
            chars |= set(range(lo, hi + 1)) & UNIVERSE
        elif op is C.CATEGORY:
            chars |= _category(av, flags)
        else:
            raise ValueError(f"class item {op} not understood")
    cased = _cased(chars, flags)
    return UNIVERSE - cased if negate else cased


@dataclass
class Item:
    """One element of a pattern's sequence."""

    kind: str  # char | repeat | complex | branch | at | assert | backref
    chars: frozenset[int] = frozenset()  # char, repeat: what one character may be
    lo: int = 1
    hi: int = 1  # -1: unbounded
    body: list[Item] = field(default_factory=list)  # complex, assert
    alts: list[list[Item]] = field(default_factory=list)  # branch
    code: Any = None  # at: the position; assert: (direction, negative)

    @property
    def unbounded(self) -> bool:
        return self.kind in ("repeat", "complex") and self.hi == -1


def _items(tree: Any, flags: int) -> list[Item]:
    """The elements of a parsed (sub)pattern, groups flattened into their sequence."""
    out: list[Item] = []
    op: Any
    av: Any
    for op, av in tree:
        if op is C.LITERAL:
            out.append(Item("char", _cased({int(av)}, flags)))
        elif op is C.NOT_LITERAL:
            out.append(Item("char", UNIVERSE - _cased({int(av)}, flags)))
        elif op is C.ANY:
            out.append(Item("char", UNIVERSE if flags & re.DOTALL else UNIVERSE - {10}))
        elif op is C.IN:
            out.append(Item("char", _class(av, flags)))
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT, getattr(C, "POSSESSIVE_REPEAT", None)):
            lo, hi, sub = av
            body = _items(sub, flags)
            high = -1 if hi is C.MAXREPEAT or hi > BOUNDED_MAX else int(hi)
            if len(body) == 1 and body[0].kind == "char":
                out.append(Item("repeat", body[0].chars, int(lo), high))
            else:
                out.append(Item("complex", lo=int(lo), hi=high, body=body))
        elif op is C.SUBPATTERN:
            _group, add, delete, sub = av
            out += _items(sub, (flags | add) & ~delete)
        elif op is getattr(C, "ATOMIC_GROUP", None):
            out += _items(av, flags)
        elif op is C.BRANCH:
            out.append(Item("branch", alts=[_items(alt, flags) for alt in av[1]]))
        elif op is C.AT:
            out.append(Item("at", lo=0, hi=0, code=av))
        elif op in (C.ASSERT, C.ASSERT_NOT):
            direction, sub = av
            body = _items(sub, flags)
            out.append(Item("assert", lo=0, hi=0, body=body, code=(direction, op is C.ASSERT_NOT)))
        elif op in (C.GROUPREF, C.GROUPREF_EXISTS):
            out.append(Item("backref", lo=0, hi=-1))
        else:
            raise ValueError(f"pattern element {op} not understood")
    return out


def _behind(chars: frozenset[int], before: list[Item]) -> str:
    """Walking back from a repeat of `chars`: "guard" (it is entered where a run of its
    characters begins), "start" (it may be entered inside one) or "overlap" (an overlapping
    unbounded repeat is next to it)."""
    adjacent, walked_word = True, chars <= WORD
    for item in reversed(before):
        if item.kind == "at":
            if item.code in (C.AT_BEGINNING, C.AT_BEGINNING_STRING):
                return "guard"
            return "guard" if item.code is C.AT_BOUNDARY and walked_word else "start"
        if item.kind == "assert":
            direction, negative = item.code
            if direction >= 0:
                continue  # a lookahead says nothing about the character before
            if len(item.body) != 1 or item.body[0].kind != "char":
                return "start"
            seen = item.body[0].chars
            return "guard" if (chars <= seen if negative else not seen & chars) else "start"
        if item.kind == "branch":
            return _behind_branch(chars, item, adjacent)
        if item.kind not in ("char", "repeat"):
            return "start"
        if not item.chars & chars:
            if item.lo >= 1:
                return "guard"
            continue
        if item.unbounded:
            return "overlap" if adjacent else "start"
        if not item.chars <= chars:
            return "start"
        walked_word &= item.chars <= WORD
        adjacent = adjacent and item.lo == 0
    return "start"


def _behind_branch(chars: frozenset[int], branch: Item, adjacent: bool) -> str:
    """A branch before the repeat guards it when every alternative ends with a character it
    cannot match."""
    for alt in branch.alts:
        last = next((i for i in reversed(alt) if i.kind not in ("at", "assert")), None)
        if last is None or last.kind not in ("char", "repeat") or last.lo < 1:
            return "start"
        if last.chars & chars:
            return "overlap" if adjacent and last.unbounded else "start"
    return "guard"


def _check(items: list[Item], prefix: list[Item], at_tail: bool, out: list[str]) -> None:
    for k, item in enumerate(items):
        before = prefix + items[:k]
        tail = at_tail and k == len(items) - 1
        if item.kind == "backref":
            out.append("a backreference")
        elif item.kind == "complex":
            if item.unbounded:
                out.append("an unbounded repeat of a sub-pattern (nested repeats)")
            _check(item.body, before, False, out)
        elif item.kind == "branch":
            for alt in item.alts:
                _check(alt, before, tail, out)
        elif item.kind == "assert":
            _check(item.body, [], False, out)
        elif item.unbounded:
            verdict = _behind(item.chars, before)
            if verdict == "overlap":
                out.append("adjacent unbounded repeats that match the same characters")
            elif verdict == "start" and not tail:
                out.append("an unbounded repeat a search may enter inside a run of its text")


def _has_unbounded(items: list[Item]) -> bool:
    return any(
        i.unbounded or _has_unbounded(i.body) or any(_has_unbounded(a) for a in i.alts)
        for i in items
    )


def _leading(items: list[Item], prefix: list[Item], out: list[str]) -> None:
    """Before an unbounded repeat, the first element that consumes text is of fixed width, or
    pinned by a lookbehind: else many starts may reach that repeat at the same place."""
    for k, item in enumerate(items):
        if item.kind in ("at", "assert"):
            continue
        rest = items[k + 1 :]
        if item.kind == "branch":
            for alt in item.alts:
                _leading(alt + rest, prefix + items[:k], out)
        elif item.kind == "repeat" and not item.unbounded and item.lo < item.hi:
            if _has_unbounded(rest) and _behind(item.chars, prefix + items[:k]) != "guard":
                out.append("a variable-width start no lookbehind pins")
        elif item.kind == "complex" and item.lo < item.hi and _has_unbounded(rest):
            out.append("a variable-width start no lookbehind pins")
        return


def problems(pattern: re.Pattern[str] | re.Pattern[bytes]) -> list[str]:
    """What keeps `pattern` from a search linear in its text (empty: none)."""
    parsed: Any = sre_parse.parse(pattern.pattern, pattern.flags)  # type: ignore[arg-type]
    items = _items(parsed, pattern.flags)
    out: list[str] = []
    _check(items, [], True, out)
    _leading(items, [], out)
    return out
