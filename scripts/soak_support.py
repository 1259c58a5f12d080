"""What scripts/soak builds on (not a test): the supervisor's JSON log read as it grows, the
processes carrying the soak's marker, /dev/shm, cgroups, a size-limited tmpfs, and the sweep
that leaves nothing of a soak behind."""

from __future__ import annotations

import contextlib
import datetime
import errno
import functools
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from supervisor.testing.procs import cmdline

ROOT = Path(__file__).resolve().parent.parent
MODEL_CONFIG = ROOT / "configs" / "models" / "llama-3-70b" / "config.json"
MARKER_ENV = "FAKE_SGLANG_MARKER"
RUN_ENV = "SGLANG_SUPERVISOR_RUN_ID"  # set by the supervisor on every process of a launch
SHM_DIR = Path("/dev/shm")
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PREFIX = "sglang-supervisor."
MiB = 2**20

T = TypeVar("T")


def poll_until(pred: Callable[[], T | None], timeout_s: float, step_s: float = 0.01) -> T | None:
    """`pred`'s first truthy answer, or None once `timeout_s` has passed: every wait is bounded."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(step_s)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def epoch(event: dict[str, Any]) -> float:
    stamp = str(event.get("timestamp", "")).replace("Z", "+00:00")
    try:
        return datetime.datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return 0.0


class LogTail:
    """The supervisor's JSON log, parsed as it grows. server_output lines are dropped once
    read: a long soak logs hundreds of thousands of them and the checks need none."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self.events: list[dict[str, Any]] = []
        self.last_lines: list[str] = []

    def poll(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            text = raw.decode(errors="replace")
            self.last_lines = [*self.last_lines[-39:], text]
            try:
                event = json.loads(text)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict) and event.get("event") != "server_output":
                self.events.append(event)

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == name]

    def first_after(self, name: str, after_wall_s: float) -> dict[str, Any] | None:
        return next((e for e in self.named(name) if epoch(e) > after_wall_s), None)


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    state: str
    start_ticks: int
    title: str
    run_id: str


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def proc_state(pid: int) -> str | None:
    """/proc state letter, None when the PID is gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def is_live(pid: int, start_ticks: int | None = None) -> bool:
    """Exists, is neither a zombie nor dead, and (given a start time) is the same process."""
    fields = _stat_fields(pid)
    if not fields or fields[0] in "ZXx":
        return False
    return start_ticks is None or int(fields[19]) == start_ticks


def marked(marker: str, *, zombies: bool = False) -> list[Proc]:
    """Processes whose environment carries MARKER_ENV=marker (read as run_support does)."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = _stat_fields(pid)
        if needle not in environ or not fields or (fields[0] in "ZXx" and not zombies):
            continue
        run = next((v for v in environ if v.startswith(f"{RUN_ENV}=".encode())), b"=")
        found.append(
            Proc(
                pid=pid,
                ppid=int(fields[1]),
                pgid=int(fields[2]),
                state=fields[0],
                start_ticks=int(fields[19]),
                title=cmdline(pid),
                run_id=run.split(b"=", 1)[1].decode(),
            )
        )
    return found


def descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(64):  # bounded: a PID chain is never this deep here
        if pid == ancestor:
            return True
        fields = _stat_fields(pid)
        if not fields or int(fields[1]) <= 1:
            return False
        pid = int(fields[1])
    return False


def charged_bytes(pid: int) -> int | None:
    """RssAnon + RssShmem, what the watchdog charges a process with."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    kib = [int(x.split()[1]) for x in lines if x.startswith(("RssAnon:", "RssShmem:"))]
    return sum(kib) * 1024


def kill_marked(marker: str, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL every process carrying the marker until none is left; returns the PIDs seen."""
    seen: set[int] = set()

    def none_left() -> bool:
        procs = marked(marker)
        for proc in procs:
            seen.add(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        return not procs

    poll_until(none_left, timeout_s, step_s=0.05)
    return sorted(seen)


# -- /dev/shm ------------------------------------------------------------------------------


def recorded_segments(record: Path) -> list[str]:
    try:
        return [n for n in dict.fromkeys(record.read_text().splitlines()) if n]
    except FileNotFoundError:
        return []


def creator_pid(name: str) -> int | None:
    """SGLang's rule: sgl_shm_<kind>_<pid>_<rand>, multi_tokenizer_args_<pid>."""
    parts = name.split("_")
    field = parts[-2] if name.startswith("sgl_shm_") and len(parts) >= 4 else parts[-1]
    return int(field) if field.isdigit() else None


def orphaned_segments(record: Path) -> list[str]:
    """Recorded segments still in /dev/shm whose creator PID no longer exists at all (a zombie
    or a recycled PID counts as alive, as in SGLang's sweep: never a false alarm)."""
    out = []
    for name in recorded_segments(record):
        pid = creator_pid(name)
        if pid is not None and proc_state(pid) is None and (SHM_DIR / name).exists():
            out.append(name)
    return out


def remove_segments(names: Iterable[str]) -> list[str]:
    removed = []
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            (SHM_DIR / name).unlink()
            removed.append(name)
    return removed


# -- cgroups -------------------------------------------------------------------------------


def instance_cgroups(instance: str) -> list[Path]:
    """`find /sys/fs/cgroup -maxdepth 4 -name "sglang-supervisor.<instance>*"`, deepest first."""
    found: list[Path] = []
    level = [CGROUP_ROOT]
    for _ in range(4):
        below: list[Path] = []
        for directory in level:
            with contextlib.suppress(OSError):
                below += [Path(e.path) for e in os.scandir(directory) if e.is_dir()]
        found += [p for p in below if p.name.startswith(f"{CGROUP_PREFIX}{instance}")]
        level = [p for p in below if not p.name.startswith(CGROUP_PREFIX)]
    nested = [Path(r) / d for g in found for r, ds, _ in os.walk(g) for d in ds]
    return sorted({*found, *nested}, key=lambda p: len(p.parts), reverse=True)


def remove_cgroups(instance: str) -> list[Path]:
    """Kill what is left in the instance's groups and remove them, leaves first."""
    groups = instance_cgroups(instance)
    for group in groups:
        with contextlib.suppress(OSError, ValueError):
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        poll_until(functools.partial(_rmdir, group), 5.0, step_s=0.05)
    return groups


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


# -- a small file system that can be filled ------------------------------------------------


def mount_tmpfs(path: Path, size_bytes: int) -> str | None:
    """Mount a tmpfs of `size_bytes` at `path`; None, or why it could not (not root, say)."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "soak", str(path)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return None if result.returncode == 0 else (result.stderr.strip() or "mount failed")


def unmount(path: Path) -> None:
    """Unmount, lazily when something still holds it open (a killed process not reaped yet)."""
    for argv in (["umount", str(path)], ["umount", "-l", str(path)]):
        if not os.path.ismount(path):
            return
        subprocess.run(argv, capture_output=True, timeout=30, check=False)


def fill(path: Path) -> int:
    """Write `path` until the file system says ENOSPC; the bytes written. Unbuffered: a
    buffered file would fail again at close with what it still holds."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (b"\0" * MiB, b"\0" * 4096):
            for _ in range(1 << 16):  # bounded: 64 Ki chunks is more than any tmpfs here
                try:
                    written += os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return written


# -- secrets -------------------------------------------------------------------------------


class SecretScanner:
    """Finds secrets in every file under a directory, reading each file's new bytes only."""

    def __init__(self, root: Path, secrets: dict[str, str], skip: Iterable[Path]) -> None:
        self.root = root
        self.secrets = {name: value.encode() for name, value in secrets.items()}
        self.skip = set(skip)
        self._seen: dict[Path, tuple[int, int, int]] = {}  # inode, size, mtime_ns
        self.reported: set[tuple[Path, str]] = set()

    def scan(self) -> list[str]:
        """New findings, as "<secret name> in <path>"."""
        found = []
        for path in self._files():
            for name in self._scan_file(path):
                if (path, name) not in self.reported:
                    self.reported.add((path, name))
                    found.append(f"{name} in {path}")
        return found

    def _files(self) -> list[Path]:
        out = []
        for directory, _, files in os.walk(self.root):
            out += [Path(directory) / f for f in files]
        return [p for p in out if p not in self.skip and not p.is_symlink()]

    def _scan_file(self, path: Path) -> list[str]:
        try:
            st = path.stat()
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            old = self._seen.get(path)
            if old == key:
                return []
            overlap = max(len(v) for v in self.secrets.values())
            grew = old is not None and old[0] == st.st_ino and st.st_size >= old[1]
            start = max(0, old[1] - overlap) if grew and old is not None else 0
            with path.open("rb") as f:
                f.seek(start)
                data = f.read()
        except OSError:
            return []
        self._seen[path] = key
        return [name for name, value in self.secrets.items() if value in data]
