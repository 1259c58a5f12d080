"""Which filesystem a directory is on (the file storage backend's): mountinfo's longest matching
mount point, for a directory SGLang has yet to create too."""

from __future__ import annotations

from pathlib import Path

from supervisor.adapters.host import HostProbe


def probe_with_mounts(tmp_path: Path, *mounts: tuple[str, str]) -> HostProbe:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    lines = [
        f"{20 + i} 1 0:{i} / {point.replace(' ', chr(92) + '040')} rw,relatime shared:1 - {fs} "
        f"{fs} rw"
        for i, (point, fs) in enumerate(mounts)
    ]
    (proc / "self" / "mountinfo").write_text("\n".join(lines) + "\n")
    return HostProbe(proc_root=proc)


def test_the_longest_mount_point_above_the_directory_names_its_filesystem(tmp_path):
    shm = tmp_path / "ram disk"
    shm.mkdir()
    probe = probe_with_mounts(tmp_path, ("/", "ext4"), (str(shm), "tmpfs"))
    found = probe.read_filesystem(str(shm / "hicache" / "not-yet"))
    assert found.fs_type == "tmpfs"
    assert found.path == str(shm / "hicache" / "not-yet")
    assert found.free_bytes is not None
    assert found.free_bytes >= 0
    assert probe.read_filesystem(str(tmp_path)).fs_type == "ext4"


def test_a_mount_over_the_same_point_wins_and_a_sibling_prefix_does_not_match(tmp_path):
    data = tmp_path / "data"
    (tmp_path / "data2").mkdir()
    data.mkdir()
    mounts = (("/", "xfs"), (str(data), "ext4"), (str(data), "tmpfs"))
    probe = probe_with_mounts(tmp_path, *mounts)
    assert probe.read_filesystem(str(data / "kv")).fs_type == "tmpfs"
    assert probe.read_filesystem(str(tmp_path / "data2")).fs_type == "xfs"


def test_an_unreadable_mountinfo_gives_no_type(tmp_path):
    found = HostProbe(proc_root=tmp_path / "absent").read_filesystem(str(tmp_path))
    assert found.fs_type is None
