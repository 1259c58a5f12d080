"""Read an SGLang release's command line from its source, statically (ast; no torch, no import).

Two layouts exist: up to 0.5.19 the fields are annotated attributes of `ServerArgs` in
`server_args.py`; from 0.5.20 they live in the namespace classes of `arg_groups/fields/*.py`
(those carrying `_NS_PATH`). In both, a field `name: A[T, Arg(...)] = default` (or
`A[T, "help"]`) becomes a flag the way `arg_groups/arg_utils.py`
`add_cli_args_from_dataclass` makes it, and `ServerArgs.add_cli_args` adds a few flags by hand
with `parser.add_argument`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Custom argparse actions of SGLang (arg_groups/argparse_actions.py) and how many values each
# takes by default.
_ACTION_NARGS: dict[str, int | str] = {
    "store_true": 0,
    "store_false": 0,
    "store_const": 0,
    "count": 0,
    "help": 0,
    "version": 0,
    "DeprecatedAction": 0,
    "DeprecatedStoreTrueAction": 0,
    "DeprecatedStoreConstAction": 0,
    "DeprecatedAliasStoreAction": 1,
    "LoRAPathAction": "+",
    "store": 1,
    "append": 1,
}


@dataclass(frozen=True, slots=True)
class Flag:
    """One flag as argparse will see it."""

    names: tuple[str, ...]
    dest: str
    nargs: int | str  # 0 (a switch), 1, or argparse's "?", "*", "+"
    kind: str  # "str" | "int" | "float": the type values are converted to before choices
    choices: tuple[Any, ...] | None  # None: free, or computed at run time (not checked)
    required: bool = False
    action: str = "store"  # "store" | "store_true" | "bool_optional" | "custom" (SGLang's own)


class _Constants:
    """Module-level names bound to literal lists/tuples/sets, across the files read."""

    def __init__(self, trees: list[ast.Module]) -> None:
        self.values: dict[str, Any] = {}
        for tree in trees:
            for node in tree.body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target = node.targets[0]
                    value = node.value
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    target, value = node.target, node.value
                else:
                    continue
                if isinstance(target, ast.Name):
                    literal = self.literal(value)
                    if literal is not None:
                        self.values[target.id] = literal

    def literal(self, node: ast.AST) -> Any:
        """The value of a literal (or of names bound to literals); None when not static."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            items = [self.literal(e) for e in node.elts]
            return None if any(i is None for i in items) else list(items)
        if isinstance(node, ast.Name):
            return self.values.get(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.literal(node.left), self.literal(node.right)
            if isinstance(left, list) and isinstance(right, list):
                return left + right
            return None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("list", "tuple", "set", "sorted")
            and len(node.args) == 1
        ):
            return self.literal(node.args[0])
        return None


def _keywords(call: ast.Call) -> dict[str, ast.expr]:
    return {k.arg: k.value for k in call.keywords if k.arg is not None}


def _unwrap(node: ast.expr) -> tuple[ast.expr, bool]:
    """(the type inside Optional[...] / X | None, whether it was optional)."""
    if isinstance(node, ast.Subscript) and _name(node.value) == "Optional":
        return node.slice, True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        for side, other in ((node.left, node.right), (node.right, node.left)):
            if isinstance(other, ast.Constant) and other.value is None:
                return side, True
    return node, False


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _kind(node: ast.expr) -> str:
    name = _name(node)
    return name if name in ("int", "float") else "str"


def _field_flag(name: str, node: ast.AnnAssign, consts: _Constants) -> Flag | None:
    """The flag `add_cli_args_from_dataclass` makes of one annotated field (None: no flag)."""
    ann = node.annotation
    if not (isinstance(ann, ast.Subscript) and _name(ann.value) in ("A", "Annotated")):
        return None
    parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
    raw_type, metas = parts[0], parts[1:]
    meta = next((m for m in metas if isinstance(m, ast.Call) and _name(m.func) == "Arg"), None)
    if meta is None and not any(
        isinstance(m, ast.Constant) and isinstance(m.value, str) for m in metas
    ):
        return None
    kw = _keywords(meta) if meta is not None else {}
    if consts.literal(kw["no_cli"]) if "no_cli" in kw else False:
        return None
    cli_name = consts.literal(kw["cli_name"]) if "cli_name" in kw else None
    names: tuple[str, ...] = (str(cli_name or "--" + name.replace("_", "-")),)
    names += tuple(consts.literal(kw["aliases"]) or ()) if "aliases" in kw else ()
    choices = consts.literal(kw["choices"]) if "choices" in kw else None
    required_kw = consts.literal(kw["required"]) if "required" in kw else None
    has_default = node.value is not None
    if "action" in kw:
        action = consts.literal(kw["action"]) or _name(kw["action"])
        action_kw = kw.get("action_kwargs")
        nargs = _ACTION_NARGS.get(str(action), 1)
        if isinstance(action_kw, ast.Dict):
            extra = {
                consts.literal(k): consts.literal(v)
                for k, v in zip(action_kw.keys, action_kw.values, strict=True)
                if k is not None
            }
            if "nargs" in extra:
                nargs = extra["nargs"] if extra["nargs"] is not None else 1
        if action == "BooleanOptionalAction":
            # argparse adds a `--no-NAME` for every long name; both take no value.
            negated = tuple("--no-" + n[2:] for n in names if n.startswith("--"))
            return Flag(names + negated, name, 0, "str", None, False, "bool_optional")
        kind_of = "store_true" if action == "store_true" else "custom"
        return Flag(names, name, nargs, "str", _tuple(choices), False, kind_of)
    inner, _optional = _unwrap(raw_type)
    if isinstance(inner, ast.Subscript) and _name(inner.value) == "Literal":
        values = consts.literal(
            inner.slice if isinstance(inner.slice, ast.Tuple) else ast.Tuple([inner.slice])
        )
        values = choices or values
        kind = "int" if values and isinstance(values[0], int) else "str"
        return Flag(names, name, 1, kind, _tuple(values), False)
    if (
        isinstance(inner, ast.Subscript)
        and _name(inner.value) in ("List", "list")
        and "type_parser" not in kw
    ):
        nargs = consts.literal(kw["nargs"]) if "nargs" in kw else "+"
        return Flag(names, name, nargs or "+", _kind(inner.slice), _tuple(choices), False)
    if _name(inner) == "bool":
        return Flag(names, name, 0, "str", None, False, "store_true")
    given_nargs: Any = consts.literal(kw["nargs"]) if "nargs" in kw else None
    required = required_kw is True or (required_kw is None and not has_default)
    kind = "str" if "type_parser" in kw else _kind(inner)
    nargs_out = given_nargs if given_nargs is not None else 1
    return Flag(names, name, nargs_out, kind, _tuple(choices), required)


def _tuple(values: Any) -> tuple[Any, ...] | None:
    return tuple(values) if isinstance(values, list) else None


def _manual_flags(function: ast.FunctionDef, consts: _Constants) -> list[Flag]:
    """The flags `add_cli_args` registers itself with `parser.add_argument(...)`."""
    out = []
    for node in ast.walk(function):
        if not (isinstance(node, ast.Call) and _name(node.func) == "add_argument"):
            continue
        names = tuple(
            a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
        )
        if not names or not all(n.startswith("--") for n in names):
            continue
        kw = _keywords(node)
        action = consts.literal(kw["action"]) if "action" in kw else None
        action = action or (_name(kw["action"]) if "action" in kw else "store")
        nargs: Any = _ACTION_NARGS.get(str(action), 1)
        if "nargs" in kw:
            given = consts.literal(kw["nargs"])
            nargs = 1 if given is None else given
        dest = consts.literal(kw["dest"]) if "dest" in kw else names[0][2:].replace("-", "_")
        kind = _kind(kw["type"]) if "type" in kw else "str"
        choices = consts.literal(kw["choices"]) if "choices" in kw else None
        required = consts.literal(kw["required"]) is True if "required" in kw else False
        how = action if action in ("store", "store_true") else "custom"
        out.append(Flag(names, str(dest), nargs, kind, _tuple(choices), required, how))
    return out


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def read_flags(srt: Path) -> dict[str, Flag]:
    """Every flag of `sglang.launch_server` in the release unpacked at `srt` (sglang/srt), by its
    first name."""
    server_args = _parse(srt / "server_args.py")
    fields_dir = srt / "arg_groups" / "fields"
    field_trees = (
        [_parse(p) for p in sorted(fields_dir.glob("*.py"))] if fields_dir.is_dir() else []
    )
    extra = [_parse(p) for p in (srt / "arg_groups" / "choices.py",) if p.is_file()]
    consts = _Constants([server_args, *field_trees, *extra])
    classes: list[ast.ClassDef] = []
    if field_trees:
        for tree in field_trees:
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and _declares(node, "_NS_PATH"):
                    classes.append(node)
    else:
        classes = [
            n for n in server_args.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"
        ]
    flags: dict[str, Flag] = {}
    for cls in classes:
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                flag = _field_flag(node.target.id, node, consts)
                if flag is not None:
                    flags[flag.names[0]] = flag
    server = next(
        n for n in server_args.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"
    )
    add = next(
        n for n in server.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args"
    )
    for flag in _manual_flags(add, consts):
        flags[flag.names[0]] = flag
    return flags


def _declares(cls: ast.ClassDef, attribute: str) -> bool:
    for node in cls.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == attribute for t in targets):
            return True
    return False
