"""Keep secrets out of logs, state files and reports: env values and secrets inside text lines.

Secrets are the values of `--api-key`/`--admin-api-key` (sglang_args.SECRET_FLAGS) and of every
environment variable with a secret name (the server's own and the supervisor's, which the
server inherits: systemd's Environment=/EnvironmentFile=, an exported HF_TOKEN). A name is
secret when one of its `_`-separated parts is KEY, TOKEN, SECRET, PASSWORD, PASSWD,
CREDENTIAL(S) or APIKEY: HF_TOKEN and AWS_SECRET_ACCESS_KEY are, TOKENIZERS_PARALLELISM is not.
Text whose secrets are not known in advance is also masked by shape: `--api-key X`,
`NAME=value` for a secret NAME, `Bearer X`, `Authorization: X`, and `'api_key': 'X'`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from supervisor.core.sglang_args import LaunchPlan

MASK = "***"
SECRET_NAME_PARTS = frozenset(
    {"KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "APIKEY"}
)
# An environment value this short would mask ordinary words in every line (a secret-named
# variable set to "1" or "true"); a real credential is longer.
MIN_ENV_SECRET_LEN = 8

# Values end at white space or a quote, so a masked token inside quoted text keeps its quotes.
_SECRET_FLAG = re.compile(r"""(--(?:admin-)?api-key(?:=|\s+))([^\s'"]+)""")
_ASSIGNMENT = re.compile(r"""\b([A-Za-z_][A-Za-z0-9_]*)=([^\s'"]+)""")
_BEARER = re.compile(r"\b(Bearer\s+)([A-Za-z0-9._~+/=-]+)", re.IGNORECASE)
# The whole credential after "Authorization:" (a scheme and its value), up to a quote or the end.
_AUTH_HEADER = re.compile(
    r"\b(Authorization\s*[:=][ \t]*)(?![ \t]|Bearer\b)([^'\"\n]+)", re.IGNORECASE
)
# A mapping's key/value in repr or JSON: 'api_key': 'x', "hf_token": "x", admin_api_key='x'.
_QUOTED_ITEM = re.compile(
    r"""(['"]?)(\w+)\1(\s*[:=]\s*)(['"])([^'"]*)\4""",
)


def is_secret_name(name: str) -> bool:
    parts = {part for part in re.split(r"[^A-Za-z0-9]+", name.upper()) if part}
    return bool(parts & SECRET_NAME_PARTS) or name.upper().endswith("APIKEY")


def _mask_assignment(match: re.Match[str]) -> str:
    name, value = match.group(1), match.group(2)
    return f"{name}={MASK}" if is_secret_name(name) and value != MASK else match.group(0)


def _mask_quoted(match: re.Match[str]) -> str:
    quote, name, sep, vquote, value = match.groups()
    if not is_secret_name(name) or not value or value == MASK:
        return match.group(0)
    return f"{quote}{name}{quote}{sep}{vquote}{MASK}{vquote}"


def redact_line(line: str) -> str:
    """Hide secrets recognisable by their shape (see the module docstring)."""
    line = _SECRET_FLAG.sub(rf"\1{MASK}", line)
    line = _BEARER.sub(rf"\1{MASK}", line)
    line = _AUTH_HEADER.sub(rf"\1{MASK}", line)
    line = _QUOTED_ITEM.sub(_mask_quoted, line)
    return _ASSIGNMENT.sub(_mask_assignment, line)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` with the values of secret-named variables replaced by ***."""
    return {k: (MASK if is_secret_name(k) else v) for k, v in env.items()}


def secret_values(plan: LaunchPlan | None, env: Mapping[str, str]) -> tuple[str, ...]:
    """Every secret value the server will see: API keys from argv, secret-named env values."""
    values: set[str] = set()
    if plan is not None:
        values |= {v for v in (plan.api_key, plan.admin_api_key) if v}  # any length: explicit
    values |= {v for k, v in env.items() if is_secret_name(k) and len(v) >= MIN_ENV_SECRET_LEN}
    # Longest first so that a secret containing another is masked whole.
    return tuple(sorted(values, key=len, reverse=True))


class Redactor:
    """Masks known secret values, then secrets by shape, inside arbitrary text."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: Sequence[str] = tuple(sorted(set(secrets), key=len, reverse=True))

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return redact_line(text)
