"""The shape of the package: one room per job, imports only run downward, small modules and
functions. `python -m tests.test_structure` prints the drawing."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "supervisor"

# Floors, lowest first. A room may import rooms on lower floors only; testing (the simulation)
# stands apart: it imports nothing of the product but the atomic file writer, and only the shell
# that chooses the `sim` backend imports it.
FLOORS: dict[str, float] = {
    "__init__": 0,
    "core": 0,
    "errors": 0,
    "atomic_file": 0.5,  # plain file I/O, no import of ours: any writer of state may use it
    "log": 1,
    "config": 1,
    "adapters": 1,
    "testing": 1.5,
    "preflight": 2,
    "group": 2.5,  # a multi-node group's coordination: the run loop calls it
    "run": 3,
    "memory": 4,
    "commands": 5,
    "cli": 6,
    "__main__": 7,
}
MAX_TOP_LEVEL_MODULES = 8
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def room_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imported_rooms(path: Path) -> set[str]:
    """The rooms of supervisor/ that `path` imports, lazy imports inside functions included."""
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module == "supervisor":
                names = [f"supervisor.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "supervisor" and len(parts) > 1:
                room = parts[1]
                is_room = (PACKAGE / room).is_dir() or (PACKAGE / f"{room}.py").is_file()
                rooms.add(room if is_room else "__init__")  # `from supervisor import __version__`
    return rooms


def edges() -> dict[str, set[str]]:
    """room -> the other rooms it imports."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        room = room_of(path)
        graph[room] |= imported_rooms(path) - {room}
    return graph


def drawing() -> str:
    """The rooms floor by floor, each with the rooms it imports."""
    graph = edges()
    lines = []
    for floor in sorted(set(FLOORS.values()), reverse=True):
        for room in sorted(r for r, f in FLOORS.items() if f == floor):
            below = ", ".join(sorted(graph.get(room, ())))
            lines.append(f"floor {floor:>3g}  {room:<12} -> {below or '-'}")
    return "\n".join(lines)


def test_every_room_has_a_floor():
    assert set(edges()) <= set(FLOORS), drawing()


def test_no_import_runs_back_up_or_sideways():
    upward = [
        f"{src} (floor {FLOORS[src]:g}) imports {dst} (floor {FLOORS[dst]:g})"
        for src, targets in edges().items()
        for dst in targets
        if FLOORS[dst] >= FLOORS[src]
    ]
    assert upward == [], "\n".join(upward) + "\n\n" + drawing()


def test_the_simulation_imports_nothing_of_the_product_but_the_file_writer():
    assert edges()["testing"] <= {"atomic_file"}


def test_at_most_eight_modules_sit_directly_under_the_package():
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, modules


def _python_files() -> list[Path]:
    return [p for d in ("supervisor", "tests", "scripts") for p in (ROOT / d).rglob("*.py")]


def test_no_module_is_longer_than_400_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in _python_files()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_function_of_the_product_or_its_scripts_is_longer_than_60_lines():
    long = []
    for path in _python_files():
        if path.is_relative_to(ROOT / "tests"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {length}")
    assert long == []


if __name__ == "__main__":
    print(drawing())
