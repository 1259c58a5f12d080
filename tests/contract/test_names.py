"""The names the supervisor sets, reads or matches exist in the release: environment variables,
process titles, the endpoints it calls."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from supervisor.core import sglang_facts
from tests.contract.conftest import source_of
from tests.contract.sglang_text import source

PACKAGE = Path(__file__).resolve().parents[2] / "supervisor"
# The supervisor's own variables (it sets them in the server's environment to find its tree).
OWN_PREFIX = "SGLANG_SUPERVISOR_"


def _product_strings(pattern: str) -> set[str]:
    """Every match of `pattern` in the string literals of the supervisor (not the simulation)."""
    regex = re.compile(pattern)
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        if "testing" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.update(regex.findall(node.value))
    return found


def test_every_sglang_environment_variable_the_supervisor_names_exists(version: str):
    names = {n for n in _product_strings(r"\bSGLANG_[A-Z0-9_]+") if not n.startswith(OWN_PREFIX)}
    assert sglang_facts.HUGEPAGE_ENV in names  # the scan sees the supervisor's names
    tree = source(source_of(version))
    corpus = "\n".join(tree.text(p) for p in tree.files_containing("SGLANG_"))
    for name in sorted(names):
        assert re.search(rf"\b{name}\b", corpus), f"{name} is not in SGLang {version}"


def test_every_title_prefix_the_supervisor_matches_is_set_by_the_release(version: str):
    prefixes = _product_strings(r"sglang::[a-z_]*")
    assert sglang_facts.SCHEDULER_TITLE_PREFIX in prefixes
    tree = source(source_of(version))
    titles = [
        t.text
        for p in tree.files_containing("setproctitle(")
        for t in tree.templates(p)
        if t.text.startswith("sglang::")
    ]
    for prefix in sorted(prefixes):
        assert any(t.startswith(prefix) for t in titles), f"no title {prefix}* in SGLang {version}"


def test_the_endpoints_the_supervisor_calls_are_routes_of_the_release(version: str):
    http_server = source_of(version) / "srt" / "entrypoints" / "http_server.py"
    routes = _routes(http_server)
    for endpoint in sglang_facts.HEALTH_ENDPOINTS:
        assert endpoint in routes, f"{endpoint} is not a route of SGLang {version}"


def _routes(path: Path) -> set[str]:
    """Paths of `@app.get(...)`/`@app.api_route(...)`-style decorators."""
    routes: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and deco.args:
                    first = deco.args[0]
                    if isinstance(first, ast.Constant) and isinstance(first.value, str):
                        routes.add(first.value)
    return routes
