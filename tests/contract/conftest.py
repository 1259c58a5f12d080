"""The contract suite reads SGLang's released source, unpacked by `scripts/contract`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def contract_versions() -> list[str]:
    raw = os.environ.get("SGLANG_CONTRACT_VERSIONS", "")
    return [v for v in raw.split(",") if v]


def source_of(version: str) -> Path:
    """sglang/ of the release, as scripts/contract unpacked it."""
    root = Path(os.environ["SGLANG_CONTRACT_SOURCES"]) / version / "sglang"
    if not root.is_dir():
        pytest.skip(f"no source of SGLang {version} in {root}: run scripts/contract {version}")
    return root


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "version" in metafunc.fixturenames:
        versions = contract_versions()
        if not versions:
            metafunc.parametrize(
                "version",
                [pytest.param("", marks=pytest.mark.skip(reason="run scripts/contract"))],
            )
        else:
            metafunc.parametrize("version", versions)
