"""The flags whose values the supervisor masks, against each release's own words: every flag
SGLang's help calls a password, a secret, a credential or an API key is a secret flag by the
rule (sglang_flags.is_secret_flag), and every secret flag is one of those. The rule reads the
flag's name; this reads what SGLang says the value is, so a secret with an innocent name (or a
name that only looks secret) fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from supervisor.core.sglang_flags import is_secret_flag
from supervisor.core.sglang_versions import table_for
from tests.contract.conftest import source_of

# What a flag's help says when its value is a credential.
_SECRET_HELP = re.compile(r"\bpassword\b|\bsecret\b|\bcredential|\bapi key\b", re.IGNORECASE)


def _string(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _field_help(node: ast.AnnAssign) -> str | None:
    """The help of a field `name: A[T, "help"]` or `A[T, Arg(help="...")]`."""
    ann = node.annotation
    if not (isinstance(ann, ast.Subscript) and isinstance(ann.slice, ast.Tuple)):
        return None
    for meta in ann.slice.elts[1:]:
        if (text := _string(meta)) is not None:
            return text
        if isinstance(meta, ast.Call):
            for keyword in meta.keywords:
                if keyword.arg == "help" and (text := _string(keyword.value)) is not None:
                    return text
    return None


def helps(srt: Path) -> dict[str, str]:
    """Every help text of the release, by the field's dest or the flag's first name."""
    files = [srt / "server_args.py", *sorted((srt / "arg_groups" / "fields").glob("*.py"))]
    out: dict[str, str] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if (text := _field_help(node)) is not None:
                    out[node.target.id] = text
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                names = [s for a in node.args if (s := _string(a)) and s.startswith("--")]
                text = next((_string(k.value) for k in node.keywords if k.arg == "help"), None)
                if names and text:
                    out[names[0]] = text
    return out


def test_every_flag_sglang_calls_a_credential_is_masked_and_no_other(version: str):
    table = table_for(version)
    texts = helps(source_of(version) / "srt")
    said_secret = {
        f.names[0]
        for f in table.flags
        if f.nargs != 0
        and _SECRET_HELP.search(texts.get(f.dest) or texts.get(f.names[0]) or "") is not None
    }
    secret = {f.names[0] for f in table.flags if is_secret_flag(f)}
    assert "--ssl-keyfile-password" in said_secret  # the reader finds SGLang's help texts
    assert said_secret == secret
