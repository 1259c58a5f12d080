"""The cgroups a supervisor under test makes, found by its instance name, and removed.

A supervisor makes `sglang-supervisor.<instance>` under its own v2 cgroup (the test process's,
which it inherits) and `sglang-supervisor.<instance>.server` under its v1 memory cgroup. Instance
names are unique per test, so concurrent test sessions never touch each other's groups.
"""

from __future__ import annotations

import time
from pathlib import Path

from supervisor.adapters.cgroup import PREFIX, CgroupError, discover


def instance_cgroups(instance: str) -> list[Path]:
    """The groups of `instance` that exist now."""
    try:
        host = discover()
    except CgroupError:
        return []
    paths = [host.v2_dir / f"{PREFIX}{instance}"]
    if host.memory_v1_dir is not None:
        paths.append(host.memory_v1_dir / f"{PREFIX}{instance}.server")
    return [p for p in paths if p.is_dir()]


def _remove(path: Path) -> None:
    for child in sorted(
        (p for p in path.iterdir() if p.is_dir()), key=lambda p: len(p.parts), reverse=True
    ):
        _remove(child)
    kill = path / "cgroup.kill"
    if kill.exists() and (path / "cgroup.procs").read_text().split():
        kill.write_text("1")
    for _ in range(200):  # bounded: killed tasks leave the group within milliseconds
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.05)


def remove_instance_cgroups(instance: str) -> list[Path]:
    """Kill what is in `instance`'s groups and remove them; returns the groups that existed."""
    found = instance_cgroups(instance)
    for path in found:
        _remove(path)
    return found
