"""Keep secrets out of logs, state files and reports: env values and secrets inside text lines.

Secrets are the values of `--api-key`/`--admin-api-key` (sglang_args.SECRET_FLAGS) and of any
environment variable whose name contains KEY, TOKEN or SECRET.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from supervisor.core.sglang_args import LaunchPlan

MASK = "***"
_SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET")
# Values this short would mask ordinary words in every line; nobody uses a 3-letter API key.
_MIN_SECRET_LEN = 4


# For text whose secrets are not known in advance (process titles, commands, a server's log):
# flag values and KEY/TOKEN/SECRET environment assignments.
_SECRET_FLAG = re.compile(r"(--(?:admin-)?api-key(?:=|\s+))(\S+)")
_SECRET_ENV = re.compile(r"\b([A-Z0-9_]*(?:KEY|TOKEN|SECRET)[A-Z0-9_]*=)(\S+)")


def redact_line(line: str) -> str:
    """Hide `--api-key X`, `--admin-api-key=X` and `SOMETHING_TOKEN=X` values."""
    return _SECRET_ENV.sub(r"\1***", _SECRET_FLAG.sub(r"\1***", line))


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(part in upper for part in _SECRET_NAME_PARTS)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` with the values of secret-named variables replaced by ***."""
    return {k: (MASK if is_secret_name(k) else v) for k, v in env.items()}


def secret_values(plan: LaunchPlan | None, env: Mapping[str, str]) -> tuple[str, ...]:
    """Every secret value the server will see: API keys from argv, secret-named env values."""
    values: list[str] = []
    if plan is not None:
        values += [v for v in (plan.api_key, plan.admin_api_key) if v]
    values += [v for k, v in env.items() if is_secret_name(k) and v]
    # Longest first so that a secret containing another is masked whole.
    return tuple(sorted({v for v in values if len(v) >= _MIN_SECRET_LEN}, key=len, reverse=True))


class Redactor:
    """Masks known secret values inside arbitrary text (server log lines, messages)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: Sequence[str] = tuple(secrets)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text
