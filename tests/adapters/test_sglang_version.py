"""The installed SGLang version from its dist-info/egg-info, without importlib.metadata: fake
site-packages directories, importlib.metadata as the reference, and the probe another
interpreter runs."""

from __future__ import annotations

import importlib.metadata
import sys
import venv
from pathlib import Path

import pytest

from supervisor.adapters.sglang_version import installed_sglang_version, sglang_version_on


def metadata(version: str | None, body: str = "") -> str:
    lines = ["Metadata-Version: 2.1", "Name: sglang"]
    if version is not None:
        lines.append(f"Version: {version}")
    return "\n".join(lines) + "\n\n" + body


def dist_info(site: Path, name: str, text: str, file: str = "METADATA") -> Path:
    info = site / name
    info.mkdir(parents=True)
    (info / file).write_text(text, encoding="utf-8")
    return site


def reference(paths: list[str]) -> str | None:
    """What importlib.metadata.version("sglang") says when sys.path is `paths`."""
    found = list(importlib.metadata.distributions(name="sglang", path=paths))
    return found[0].version if found else None


def test_version_is_read_from_the_dist_info_metadata(tmp_path):
    site = dist_info(tmp_path / "site", "sglang-0.5.23.dist-info", metadata("0.5.23"))
    assert sglang_version_on([str(site)]) == "0.5.23" == reference([str(site)])


def test_the_first_path_entry_that_has_sglang_wins(tmp_path):
    first = dist_info(tmp_path / "a", "sglang-0.5.21.dist-info", metadata("0.5.21"))
    second = dist_info(tmp_path / "b", "sglang-0.5.23.dist-info", metadata("0.5.23"))
    paths = [str(tmp_path / "missing"), str(tmp_path / "not-a-dir.zip"), str(first), str(second)]
    (tmp_path / "not-a-dir.zip").write_bytes(b"")
    assert sglang_version_on(paths) == "0.5.21" == reference(paths)
    assert sglang_version_on(paths[::-1]) == "0.5.23" == reference(paths[::-1])


@pytest.mark.parametrize(
    ("name", "file"),
    [
        ("sglang-0.5.22.egg-info", "PKG-INFO"),  # setuptools egg-info directory
        ("sglang.egg-info", "PKG-INFO"),  # `pip install -e` of a source tree
        ("SGLang-0.5.22.dist-info", "METADATA"),  # the name as the project spells it
        ("sglang-0.5.22.dist-info", "PKG-INFO"),  # no METADATA: importlib reads PKG-INFO
    ],
)
def test_egg_info_and_other_spellings(tmp_path, name, file):
    site = dist_info(tmp_path / "site", name, metadata("0.5.22"), file=file)
    assert sglang_version_on([str(site)]) == "0.5.22" == reference([str(site)])


def test_an_old_egg_info_file_is_its_own_metadata(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sglang-0.5.19-py3.11.egg-info").write_text(metadata("0.5.19"), encoding="utf-8")
    assert sglang_version_on([str(site)]) == "0.5.19" == reference([str(site)])


def test_lookalikes_and_an_empty_path_are_not_sglang(tmp_path):
    site = dist_info(tmp_path / "site", "sglang_router-0.2.1.dist-info", metadata("0.2.1"))
    dist_info(site, "sglang_kernel-0.3.0.dist-info", metadata("0.3.0"))
    (site / "sglang").mkdir()  # the import package itself is not metadata
    (site / "sglang-0.5.23.txt").write_text("Version: 0.5.23\n", encoding="utf-8")
    assert sglang_version_on([str(site)]) is None is reference([str(site)])
    assert sglang_version_on([]) is None


def test_only_the_header_block_is_read(tmp_path):
    quoting = metadata(None, body="Version: 9.9.9 is quoted in the description\n")
    site = dist_info(tmp_path / "site", "sglang-0.5.23.dist-info", quoting)
    assert sglang_version_on([str(site)]) is None is reference([str(site)])


def test_unreadable_metadata_is_an_unknown_version(tmp_path):
    site = tmp_path / "site"
    info = site / "sglang-0.5.23.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_bytes(b"Name: sglang\nVersion: \xff\xfe\n")
    assert sglang_version_on([str(site)]) is None
    (tmp_path / "empty" / "sglang-0.5.23.dist-info").mkdir(parents=True)
    assert sglang_version_on([str(tmp_path / "empty")]) is None


def test_the_working_directory_is_the_empty_entry(tmp_path, monkeypatch):
    dist_info(tmp_path, "sglang-0.5.20.dist-info", metadata("0.5.20"))
    monkeypatch.chdir(tmp_path)
    assert sglang_version_on([""]) == "0.5.20"


def test_this_interpreter_looks_along_its_sys_path(tmp_path, monkeypatch):
    site = dist_info(tmp_path / "site", "sglang-0.5.23.dist-info", metadata("0.5.23"))
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(site), *sys.path])
    assert installed_sglang_version(None) == "0.5.23"
    assert installed_sglang_version(sys.executable) == "0.5.23"


def test_another_interpreter_runs_the_same_lookup_as_a_probe(tmp_path):
    env = tmp_path / "env"
    venv.create(env, with_pip=False, symlinks=True)
    site = next((env / "lib").glob("python3*/site-packages"))
    dist_info(site, "sglang-0.5.21.dist-info", metadata("0.5.21"))
    # The venv's python resolves to the same binary as this one: still another environment.
    python = str(env / "bin" / "python")
    assert installed_sglang_version(python) == "0.5.21"
    (site / "sglang-0.5.21.dist-info" / "METADATA").unlink()
    (site / "sglang-0.5.21.dist-info").rmdir()
    assert installed_sglang_version(python) is None
    assert "sglang" not in sys.modules
