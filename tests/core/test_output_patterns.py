"""Every pattern that reads the server's output, or masks a log value, is linear in its text:
its shape is checked (tests/core/pattern_shape.py), and the checker is shown to refuse the
quadratic shapes this project once had. No timing: a loaded machine proves nothing either way;
scripts/bench_output.py measures."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from types import ModuleType

import pytest

from supervisor.core import measured
from tests.core.pattern_shape import problems

# Where the server's lines go (adapters/output_pump.py -> the sink: the log's scrub and
# renderers, the status fold's load progress, the sizing reader; the tail: classify, incidents).
MODULES = (
    "supervisor.adapters.output_lines",
    "supervisor.core.clip",
    "supervisor.core.redact",
    "supervisor.core.secret_names",
    "supervisor.core.log_phases",
    "supervisor.core.load_progress",
    "supervisor.core.measured",
    "supervisor.core.classify",
    "supervisor.core.log_text",
    "supervisor.core.status",
    "supervisor.core.hooks",
    "supervisor.core.metrics_map",
    "supervisor.log",
)
_RE_CALLS = {"compile", "match", "search", "fullmatch", "sub", "subn", "finditer", "findall"}


def _literal_calls(module: ModuleType) -> list[re.Pattern[str] | re.Pattern[bytes]]:
    """The patterns written inline as `re.search(r"...", ...)` and the like."""
    found: list[re.Pattern[str] | re.Pattern[bytes]] = []
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        named_re = isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
        if named_re and node.func.attr in _RE_CALLS and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str | bytes):
                flags = 0
                if len(node.args) > 1 or node.keywords:
                    flags = re.IGNORECASE  # the only flag these modules pass; checked stricter
                found.append(re.compile(first.value, flags))
    return found


def output_patterns() -> dict[str, re.Pattern[str] | re.Pattern[bytes]]:
    out: dict[str, re.Pattern[str] | re.Pattern[bytes]] = {}
    for name in MODULES:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if isinstance(value, re.Pattern):
                out[f"{name}.{attr}"] = value
        for i, pattern in enumerate(_literal_calls(module)):
            out[f"{name} inline #{i}"] = pattern
    for i, text in enumerate(measured.SIZING_PATTERNS):  # compiled by the first SizingLog
        out[f"supervisor.core.measured.SIZING_PATTERNS[{i}]"] = re.compile(text)
    return out


PATTERNS = output_patterns()


def test_the_modules_that_read_server_output_have_patterns_to_check():
    assert len(PATTERNS) >= 20, sorted(PATTERNS)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_each_pattern_on_server_output_has_a_linear_shape(name: str):
    assert problems(PATTERNS[name]) == [], PATTERNS[name].pattern


# The quadratic shapes of earlier versions (and textbook ones): each must be refused.
QUADRATIC = {
    "the old mapping-item mask (a word run retried from every character)": (
        r"""(['"]?)(\w+)\1(\s*[:=]\s*)(['"])([^'"]*)\4""",
        0,
    ),
    "the old host-pool phrase (.* retried after every 'allocating ')": (
        r"allocating .*host pool",
        re.IGNORECASE,
    ),
    "the old tqdm meter (its description retried from every character)": (
        r"(?P<desc>[^:\r\n]*):\s*(?P<percent>\d{1,3})%",
        0,
    ),
    "the old graph-capture phrase (a lazy run over spaces)": (
        r"\bcapture [\w -]*?graph (begin|end)\.",
        re.IGNORECASE,
    ),
    "the old sizing phrase": (r"KV Cache is allocated\. .*#tokens: (\d+)", 0),
    "a bounded but unpinned start before a repeat": (r"[^:]{0,200}:\s*x[^|]*\|", 0),
    "nested repeats": (r"(\w+)+$", 0),
    "nested repeats of a group": (r"(?:ab|a)*c", 0),
    "adjacent overlapping repeats": (r"\w+\w+x", 0),
    "adjacent overlapping repeats through an optional": (r"=\s*,?[ \t]*x", 0),
    "a repeat entered anywhere in a run": (r"\w+=", 0),
    "a repeat that matches its opening character": (r"\[[^\]]*\]", 0),
    "a repeat before an end that may fail": (r"=[^\s]+$", 0),
}


@pytest.mark.parametrize("name", sorted(QUADRATIC))
def test_the_checker_refuses_quadratic_shapes(name: str):
    text, flags = QUADRATIC[name]
    assert problems(re.compile(text, flags)) != []


@pytest.mark.parametrize(
    "text",
    [
        r"\b\w+=",  # entered at a word's start only
        r"(?<![\w-])--[a-z][\w-]*=\S+",  # a lookbehind pins it
        r"=[^\s]+",  # last: a search that reaches it succeeds
        r"\[[^\[\]]*\]",  # a character it cannot match before it
        r"\d{1,3}%",  # bounded
    ],
)
def test_the_checker_accepts_linear_shapes(text: str):
    assert problems(re.compile(text)) == []


# Lines that made an earlier pattern quadratic (minutes each, the suite's timeout fails them):
# every reader of server output goes through each, and what it says of them is checked. No
# time is measured.
PATHOLOGICAL = {
    "a 200,000-character word": "x" * 200_000,
    "200,000 CJK characters": "漢字かな交じり文" * 25_000,
    "a word run before an equals sign, many times": "ab'cd " * 40_000,
    "'allocating ' with no host pool": "allocating " * 20_000,
    "'capture ' with no graph": "capture " * 25_000,
    "'Load weight end.' with no numbers": "Load weight end. mem " * 10_000,
    "colons and percents with no meter": ": 5%|" * 40_000 + "x" * 1000,
    "flags with no values": "--a-token-" * 20_000,
    "URLs with no user": "a://b:c" * 30_000,
    "quotes with no end": "'api_key': '" + "v" * 200_000,
}


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_pathological_lines_pass_through_every_reader(name: str):
    from supervisor.core.load_progress import LoadProgress, read_meter
    from supervisor.core.log_phases import read_mark
    from supervisor.core.measured import SizingLog
    from supervisor.core.redact import Redactor, redact_line

    line = PATHOLOGICAL[name]
    assert redact_line(line) == line  # nothing secret in any of them
    assert Redactor(["sk-not-there-1234"])(line) == line
    mark = read_mark(line)
    assert (mark.mark.value if mark else None) == ("weights_loaded" if "weight" in name else None)
    assert read_meter(line) is None
    assert LoadProgress.begin(0.0).feed(line, 1.0).done is None
    sizing = SizingLog()
    sizing.feed(line)
    assert not sizing.measurement().complete
