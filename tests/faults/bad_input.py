"""What the bad-input tables share: a config that passes every check (planning facts only: no
/proc, no GPU, no ledger), and the CLI run in-process with the no-traceback rule asserted on
every call. docs/faults.md "Bad input" lists each case with its test."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from supervisor import log as sup_log
from supervisor.cli import main
from supervisor.config import SupervisorConfig
from supervisor.config.loader import toml_key
from supervisor.testing.lws_config import config_toml, merge

ROOT = Path(__file__).resolve().parents[2]
QWEN = ROOT / "configs" / "models" / "qwen3-8b" / "config.json"
FACTS = ["--mem-available", "445GB", "--gpus", "8", "--gpu-memory", "80GB", "--weights", "16GB"]
ARGV = ["--model-path", "Qwen/Qwen3-8B", "--tp", "8"]


def logging_as_it_was(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """For an autouse fixture: the commands configure the process's logging; leave it as
    found for the next test."""
    monkeypatch.setattr(sup_log, "_format", sup_log.configured_format())
    yield
    structlog.reset_defaults()
    sup_log.register_secrets(())


BASE: dict[str, dict[str, Any]] = {
    "server": {"args": ARGV, "model_config": str(QWEN)},
    "host": {"mem_available": "445GB", "gpus": 8, "gpu_memory": "80GB"},
    "preflight": {"weights": "16GB", "ledger_dir": ""},
    "run": {"name": "bad-input", "state_dir": "{state}"},
    "gpu": {"backend": "none"},
}


def write_config(tmp_path: Path, overrides: dict[str, dict[str, Any]] | None = None) -> Path:
    """A config that check-config and `run --dry-run` pass, with `overrides` (section by
    section, key by key) over it."""
    path = tmp_path / "run.toml"
    sections = merge(BASE, overrides or {})
    path.write_text(config_toml(sections, {"state": str(tmp_path / "state")}))
    return path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`sglang-supervisor ARGV` in-process: (exit code, stdout, stderr); never a traceback."""
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    assert "internal error" not in err, err
    code = exc.value.code
    assert isinstance(code, int)
    return code, out, err


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The message of a refusal: exit 2, one line of text (clipped), no traceback."""
    code, _out, err = cli(capsys, *argv)
    assert code == 2, err
    assert len(err) < 10_000, f"{len(err)} characters on stderr"
    return err


def preflight(
    *options: str, model: str | Path | None = QWEN, argv: tuple[str, ...] = tuple(ARGV)
) -> list[str]:
    """`preflight` of `argv` on the planned box with `options` (before --); `model` is the
    --model-config (None: none, the model is looked up by its path)."""
    model_option = ["--model-config", str(model)] if model is not None else []
    return ["preflight", *FACTS, *model_option, *options, "--", *argv]


def config_fields(kind: str) -> list[tuple[str, str]]:
    """(section, key) of every config field of `kind`: "duration", "size", "float", "int",
    "text" (a string or a list of strings)."""
    out = []
    for section in dataclasses.fields(SupervisorConfig):
        cls = typing.get_type_hints(SupervisorConfig)[section.name]
        hints = typing.get_type_hints(cls)
        for fld in dataclasses.fields(cls):
            hint = hints[fld.name]
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            base = args[0] if args else hint
            if fld.name.endswith("_s"):
                found = "duration"
            elif fld.name.endswith("_bytes"):
                found = "size"
            elif base is float:
                found = "float"
            elif base is int:
                found = "int"
            elif base is str or (
                typing.get_origin(base) is tuple and typing.get_args(base)[:1] == (str,)
            ):
                found = "text"
            else:
                continue
            if found == kind:
                out.append((section.name, toml_key(fld.name)))
    return out
