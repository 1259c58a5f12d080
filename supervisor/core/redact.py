"""Keep secrets out of logs, state files and reports, in every shape they come in.

By value: the secrets `run` knows are masked wherever they appear (Redactor), even a piece of
one left at either side of a line's cut (core/clip.py). They are the values of SGLang's secret
flags (sglang_flags.is_secret_flag: --api-key, --admin-api-key, --ssl-keyfile-password, any
flag that takes a string and has a secret name), of every environment variable with a secret
name (the server's and the supervisor's own, which the server inherits), of the secrets in the
operator's commands (gpu reset_command, hooks: command_secrets) and the group token. A value
found by its name alone (environment, commands) is masked everywhere from MIN_ENV_SECRET_LEN
characters on: a variable set to "1" would mask every "1"; a shorter one is still masked
wherever its shape shows it.

By shape, for the secrets nobody told us about (core/secret_names.py says which names are):
    --NAME V, --NAME=V, --NAME 'V'  a flag with a secret name: --token, --password, --hf-token,
                                    --x-api-key, --ssl-keyfile-password (not --ssl-keyfile, a
                                    path; nor SGLang's --speculative-token-map)
    NAME=V                          an assignment to a secret name: HF_TOKEN=..., api_token=...
    'NAME': 'V', "NAME": "V", NAME='V'   a mapping item in repr or JSON (SGLang's server_args)
    Bearer V, Authorization: V      an HTTP credential
    scheme://user:V@host            a URL's password
A command is masked word by word first (redact_words): the word after a secret flag is masked
whatever it holds (spaces, quotes), then the joined words by shape.

Bounded work: every pattern here runs in time linear in its text. Each unbounded repeat is the
last thing its pattern matches, or is entered only where a run of what it matches begins (after
a character it cannot match, a lookbehind or a word boundary), and no two repeats that could
match the same characters follow each other; tests/core/test_output_patterns.py checks that
shape on every pattern that reads server output. The text is cut before it gets here
(adapters/output_lines.py, supervisor/log.py).
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence

from supervisor.core.clip import cut_marks
from supervisor.core.secret_names import is_secret_name
from supervisor.core.sglang_args import LaunchPlan

__all__ = [
    "MASK",
    "MIN_ENV_SECRET_LEN",
    "Redactor",
    "command_secrets",
    "is_secret_name",
    "redact_command",
    "redact_env",
    "redact_line",
    "redact_words",
    "secret_values",
]

MASK = "***"
# A value found by its name alone this short would mask ordinary words in every line (a
# secret-named variable set to "1" or "true"); a real credential is longer.
MIN_ENV_SECRET_LEN = 8
# A known secret's piece at a cut is masked from this many characters on.
MIN_FRAGMENT_LEN = 4

# A value: quoted (its quotes kept) or up to white space or a quote.
_VALUE = r"""('[^'\n]*'|"[^"\n]*"|[^\s'"]+)"""
_FLAG = re.compile(r"(?<![\w-])(--[A-Za-z0-9][\w-]*)(=|[ \t]+)" + _VALUE)
_ASSIGNMENT = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_]*)=" + _VALUE)
_BEARER = re.compile(r"\b(Bearer\s+)([A-Za-z0-9._~+/=-]+)", re.IGNORECASE)
# The whole credential after "Authorization:" (a scheme and its value), up to a quote or the end.
_AUTH_HEADER = re.compile(
    r"\b(Authorization\s*[:=][ \t]*)(?!Bearer\b)([^'\"\s][^'\"\n]*)", re.IGNORECASE
)
# A mapping's key/value in repr or JSON: 'api_key': 'x', "hf_token": "x", admin_api_key='x'.
# The quotes are matched as classes and compared in _mask_quoted (a backreference would make
# the pattern's shape unprovable).
_QUOTED_ITEM = re.compile(r"""(?<![\w'"])(['"]?)(\w+)(['"]?)(\s*[:=]\s*)(['"])([^'"]*)(['"])""")
_URL_USERINFO = re.compile(r"(?<![\w+.-])([A-Za-z][A-Za-z0-9+.-]*://)([^\s/@]+)@")
PATTERNS = (_FLAG, _ASSIGNMENT, _BEARER, _AUTH_HEADER, _QUOTED_ITEM, _URL_USERINFO)


@functools.cache
def _exempt_flags() -> frozenset[str]:
    """SGLang's flags with a secret word in their name that hold no secret (a number, a path)."""
    from supervisor.core.sglang_args import secret_flag_names
    from supervisor.core.sglang_versions import rules_for_version

    table = rules_for_version(None).cli().table
    named = {n for f in table.flags for n in f.names if is_secret_name(n[2:])}
    return frozenset(named - secret_flag_names(table))


def is_secret_flag_name(name: str) -> bool:
    """`--name` holds a secret: a secret name, and not one of SGLang's flags that does not."""
    return name.startswith("--") and is_secret_name(name[2:]) and name not in _exempt_flags()


def _unquoted(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" else value


def _masked(value: str) -> str:
    """`value` replaced by ***, its quotes kept."""
    quote = value[0] if value != _unquoted(value) else ""
    return f"{quote}{MASK}{quote}"


def _mask_flag(match: re.Match[str]) -> str:
    name, sep, value = match.groups()
    if not is_secret_flag_name(name) or _unquoted(value) == MASK:
        return match.group(0)
    return f"{name}{sep}{_masked(value)}"


def _mask_assignment(match: re.Match[str]) -> str:
    name, value = match.groups()
    if not is_secret_name(name) or _unquoted(value) == MASK:
        return match.group(0)
    return f"{name}={_masked(value)}"


def _mask_quoted(match: re.Match[str]) -> str:
    quote, name, close, sep, vquote, value, vclose = match.groups()
    if quote != close or vquote != vclose or not is_secret_name(name):
        return match.group(0)
    if not value or value == MASK:
        return match.group(0)
    return f"{quote}{name}{quote}{sep}{vquote}{MASK}{vquote}"


def _mask_url(match: re.Match[str]) -> str:
    scheme, userinfo = match.groups()
    user, sep, password = userinfo.partition(":")
    if not sep or not password or password == MASK:
        return match.group(0)
    return f"{scheme}{user}:{MASK}@"


def redact_line(line: str) -> str:
    """Hide secrets recognisable by their shape (see the module docstring)."""
    line = _FLAG.sub(_mask_flag, line)
    line = _BEARER.sub(rf"\1{MASK}", line)
    line = _AUTH_HEADER.sub(rf"\1{MASK}", line)
    line = _URL_USERINFO.sub(_mask_url, line)
    line = _QUOTED_ITEM.sub(_mask_quoted, line)
    return _ASSIGNMENT.sub(_mask_assignment, line)


def _word_secrets(words: Sequence[str]) -> Iterable[tuple[int, str, bool]]:
    """(index, value, whether the value ends its word) of each secret the words of a command
    hold by their shape."""
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if is_secret_flag_name(name) and eq:
            yield i, value, True
        elif is_secret_flag_name(word) and i + 1 < len(words):
            yield i + 1, words[i + 1], True
        elif eq and name.isidentifier() and is_secret_name(name):
            yield i, value, True
        elif "://" in word:
            for match in _URL_USERINFO.finditer(word):
                yield i, match.group(2).partition(":")[2], False


def redact_words(words: Sequence[str]) -> tuple[str, ...]:
    """A command's words with every secret in them masked (see the module docstring)."""
    out = list(words)
    for i, value, at_end in _word_secrets(words):
        if at_end and value and value != MASK:
            out[i] = out[i][: len(out[i]) - len(value)] + MASK
    return tuple(w if w == MASK else redact_line(w) for w in out)  # URLs, Bearer, JSON


def redact_command(words: Sequence[str]) -> str:
    """A command as shown in events and reports: its words masked and joined as a shell would
    read them (a mask is not quoted for the `*` in it: `--token ***`, not `--token '***'`)."""
    stand_in = "MASKEDVALUE7f3a"  # a word shlex leaves bare
    quoted = (shlex.quote(w.replace(MASK, stand_in)) for w in redact_words(words))
    return redact_line(" ".join(quoted).replace(stand_in, MASK))


def command_secrets(words: Sequence[str]) -> tuple[str, ...]:
    """The secrets a command's words hold by their shape, to be masked wherever they appear."""
    return tuple(v for _i, v, _end in _word_secrets(words) if len(v) >= MIN_ENV_SECRET_LEN)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` with the values of secret-named variables replaced by ***."""
    return {k: (MASK if is_secret_name(k) else v) for k, v in env.items()}


def secret_values(
    plan: LaunchPlan | None,
    env: Mapping[str, str],
    commands: Iterable[Sequence[str]] = (),
) -> tuple[str, ...]:
    """Every secret value the server and the operator's commands will see: the secret flags'
    values, secret-named env values, and the secrets in `commands` (reset command, hooks)."""
    values: set[str] = set()
    if plan is not None:
        values |= {v for v in plan.secrets if v}  # any length: explicit
    values |= {v for k, v in env.items() if is_secret_name(k) and len(v) >= MIN_ENV_SECRET_LEN}
    for words in commands:
        values |= set(command_secrets(words))
    # Longest first so that a secret containing another is masked whole.
    return tuple(sorted(values, key=len, reverse=True))


def _fragment_at_end(text: str, secret: str) -> int:
    """How many of the last characters of `text` begin `secret` (0: none worth masking)."""
    window = text[-(len(secret) - 1) :] if len(secret) > 1 else ""
    start = window.find(secret[0])
    while start != -1 and len(window) - start >= MIN_FRAGMENT_LEN:
        if secret.startswith(window[start:]):
            return len(window) - start
        start = window.find(secret[0], start + 1)
    return 0


def _mask_cut_fragments(text: str, secrets: Sequence[str]) -> str:
    """Mask a known secret's head before a cut mark and its tail after one."""
    for start, end in reversed(cut_marks(text)):
        head, mark, tail = text[:start], text[start:end], text[end:]
        for secret in secrets:
            if n := _fragment_at_end(head, secret):
                head = head[:-n] + MASK
            reversed_tail = tail[: len(secret)][::-1]
            if n := _fragment_at_end(reversed_tail, secret[::-1]):
                tail = MASK + tail[n:]
        text = head + mark + tail
    return text


class Redactor:
    """Masks known secret values (pieces of them at a cut too), then secrets by shape."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: Sequence[str] = tuple(sorted(set(secrets), key=len, reverse=True))

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        if self._secrets and "…[cut " in text:
            text = _mask_cut_fragments(text, self._secrets)
        return redact_line(text)
