"""SGLang's own `--config FILE.yaml` (launch_server's, not the supervisor's TOML), read as SGLang
reads it: PyYAML's safe loader, a `.yaml`/`.yml` suffix, a mapping at the root
(utils/server_args_config_parser.py `ConfigArgumentMerger`). core/sglang_cli.py merges it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.nodes import MappingNode, Node, SequenceNode

from supervisor.atomic_file import NotRegularFile, open_regular
from supervisor.core.bounded import MAX_NESTING
from supervisor.errors import ConfigError

_MAX_BYTES = 1 << 20  # a flags file; anything larger is a mistake, not a config
# Nodes of the document with every alias expanded. A flags file has tens; 9 aliases of 9
# aliases of ... (a "billion laughs") are 393 bytes that expand to 9^9 (a 2.4 GB argv, 29 s):
# the 1 MiB cap on the file does not bound what its aliases mean.
MAX_EXPANDED_NODES = 10_000


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader (what SGLang reads with) that refuses, before anything is built,
    a document nesting deeper than MAX_NESTING (its composer recurses once per level) and one
    whose aliases expand past MAX_EXPANDED_NODES nodes or refer to themselves."""

    def __init__(self, stream: str | bytes) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if self._depth >= MAX_NESTING:
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise ComposerError(None, None, f"nested more than {MAX_NESTING} levels deep", mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Node | None:
        node = super().compose_document()
        problem = None if node is None else expansion_problem(node)
        if node is not None and problem is not None:
            raise ComposerError(None, None, problem, node.start_mark)
        return node


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def expansion_problem(root: Node) -> str | None:
    """Why the document under `root` expands too far, or None: its size and depth with every
    alias expanded, counted over the node graph (each node once, bottom up), not by expanding."""
    size: dict[int, int] = {}
    height: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            children = _children(node)
            size[key] = 1 + sum(size[id(c)] for c in children)
            height[key] = 1 + max((height[id(c)] for c in children), default=0)
            if size[key] > MAX_EXPANDED_NODES:
                return f"its aliases expand to more than {MAX_EXPANDED_NODES:,} nodes"
            if height[key] > MAX_NESTING:
                return f"its aliases nest it more than {MAX_NESTING} levels deep"
            continue
        if key in size:
            continue
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                return "an alias refers to a node that contains it"
            if id(child) not in size:
                stack.append((child, False))
    return None


def config_path_of(argv: Sequence[str]) -> str | None:
    """The file after `--config` (SGLang looks for that exact token), or None."""
    indexes = [i for i, token in enumerate(argv) if token == "--config"]
    if not indexes or indexes[0] + 1 >= len(argv):
        return None  # none, or a malformed one: the argv reader says so in SGLang's words
    return argv[indexes[0] + 1]


def load_sglang_config(argv: Sequence[str]) -> Mapping[str, Any] | None:
    """The mapping of the YAML file `argv` names with `--config` (None: no --config).

    A relative path is taken from this process's working directory, which the server inherits.

    Raises:
        ConfigError: the file is missing, unreadable, not YAML, or not a mapping; the message
            names the file and, for a syntax error, the line.
    """
    name = config_path_of(argv)
    if name is None:
        return None
    path = Path(name)
    where = f"launch_server --config {name}"
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ConfigError(f"{where}: Config file must be YAML format, got: {path.suffix!r}")
    try:
        with open_regular(path) as fh:
            data = fh.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{where}: Config file not found: {name}") from None
    except NotRegularFile as exc:  # a FIFO would block the read for ever
        raise ConfigError(f"{where}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    if len(data) > _MAX_BYTES:
        raise ConfigError(f"{where}: larger than {_MAX_BYTES} bytes; not a flags file")
    try:
        loaded = yaml.load(data, Loader=_BoundedLoader)  # a SafeLoader: safe_load's
    except RecursionError:  # belt and braces: the composer's depth is bounded above
        raise ConfigError(f"{where}: nested more than {MAX_NESTING} levels deep") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        raise ConfigError(f"{where}:{line} {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{where}: Config file must contain a dictionary at root level")
    return {str(k): v for k, v in loaded.items()}
