"""Shell completion as the README documents it: click's `_SGLANG_SUPERVISOR_COMPLETE`, through
the lazily loaded subcommands."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _complete(words: str, cword: int) -> list[str]:
    env = {
        **os.environ,
        "COMP_WORDS": words,
        "COMP_CWORD": str(cword),
        "_SGLANG_SUPERVISOR_COMPLETE": "bash_complete",
    }
    out = subprocess.run(
        [sys.executable, "-c", "from supervisor.cli import main; main()", *words.split()[1:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [line.split(",", 1)[1] for line in out.splitlines() if "," in line]


@pytest.mark.parametrize(
    ("words", "cword", "expected"),
    [
        ("sglang-supervisor re", 1, "reset-state"),
        ("sglang-supervisor run --health-i", 2, "--health-interval"),
        ("sglang-supervisor preflight --print", 2, "--print-args"),
    ],
)
def test_bash_completion_offers_commands_and_options(words: str, cword: int, expected: str) -> None:
    assert expected in _complete(words, cword)


def test_the_bash_script_is_printed_for_sourcing() -> None:
    env = {**os.environ, "_SGLANG_SUPERVISOR_COMPLETE": "bash_source"}
    script = subprocess.run(
        [sys.executable, "-c", "from supervisor.cli import main; main()"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "complete -o nosort -F _sglang_supervisor_completion sglang-supervisor" in script
