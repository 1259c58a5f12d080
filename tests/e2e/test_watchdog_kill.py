"""The memory watchdog against the simulated server: real processes, real /proc, real kills."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from supervisor.adapters.clock import SystemClock
from supervisor.core.events import MemoryAction, WatchdogEvent
from supervisor.core.readings import ProcessInfo
from supervisor.memory.watchdog import MemoryWatchdog
from supervisor.run.gpu_wait import ReleaseLimits, measure_baselines, wait_for_gpu_release
from tests.e2e.watchdog_support import launched, sim_sensor, system_holders, tree_limits
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

MiB = 2**20


# Host levels far below anything this box reaches: these tests exercise the tree budget with
# the real /proc/meminfo, never a host-wide emergency on a shared machine.
def _charged(tree: tuple[ProcessInfo, ...]) -> int:
    return sum(p.charged_bytes for p in tree)


def test_a_leak_in_one_rank_kills_the_whole_group_before_budget_plus_margin(
    tmp_path: Path, free_port: int, make_gpu_state: Callable[..., Path]
):
    gpus = make_gpu_state(2)
    scenario = {
        "startup_s": 0.1,
        "leak": {"rank": 1, "bytes_per_s": 8 * MiB, "after_s": 0.8, "max_bytes": 48 * MiB},
        "gpu_release_delay_s": 0.5,
    }
    with launched(["--tp-size", "2"], scenario, port=free_port, state_dir=gpus) as run:
        sensor = sim_sensor(gpus)
        try:
            baselines = measure_baselines(sensor, [0, 1])
            wait_until(run.ready, timeout_s=30, what="simulated server ready")
            ranks = [p for p in run.server.tree() if p.title.startswith("sglang::scheduler")]
            assert len(ranks) == 2
            expected = _charged(run.server.tree())
            limits = tree_limits(expected)
            dog = MemoryWatchdog(
                run.server,
                limits,
                post=run.events.put,
                gpu_snapshot=sensor.last_snapshot,
                state_dir=tmp_path,
                run_id=run.server.run_id,
            )
            old_pids = [p.pid for p in run.server.tree()]
            dog.start()
            event = run.events.get(timeout=30)
            assert isinstance(event, WatchdogEvent)
            assert event.action is MemoryAction.KILLED
            # Every process of the group was signalled, not just the leaking rank.
            assert {p.pid for p in ranks} <= set(event.pids)
            wait_until(lambda: not run.live_tree(), timeout_s=10, what="killed tree gone")
            peak = max(r.tree_charged_bytes for r in dog.history)
            assert limits.tree_kill_bytes is not None
            assert peak < limits.tree_kill_bytes
            # The watchdog's own thread sees the tree gone at its next look: a stop before that
            # look ends its watch unseen (a loaded machine starves the thread).
            wait_until(lambda: dog.gone_at_s is not None, timeout_s=30, what="tree gone, seen")
            dog.stop()

            incident = json.loads(Path(event.incident_path or "").read_text())
            assert incident["kind"] == "memory_kill"
            assert incident["thresholds"]["tree_kill_bytes"] == limits.tree_kill_bytes
            assert incident["top_processes"][0]["title"] == "sglang::scheduler_TP1"
            assert incident["ticks"]
            assert incident["meminfo"]
            assert any("fired up" in line for line in incident["server_log_tail"])
            assert incident["next"][0]["step"] == "tree_gone"

            # The killed ranks' GPU memory is released after the simulated delay: wait, then go.
            result = wait_for_gpu_release(
                sensor,
                [0, 1],
                old_pids,
                clock=SystemClock(),
                holders=system_holders(),
                baselines=baselines,
                limits=ReleaseLimits(timeout_s=20),
            )
            assert result.ok, result.reason
            assert result.reset_gpus == ()
        finally:
            sensor.close()


def _fs_type(path: Path) -> str:
    """The file system type of the longest mount point above `path` (/proc/self/mountinfo)."""
    best, kind = "", ""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mount, fs = fields[4], fields[fields.index("-") + 1]
        if str(path).startswith(mount.rstrip("/") + "/") and len(mount) > len(best):
            best, kind = mount, fs
    return kind


@pytest.fixture
def disk_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on a disk-backed file system: a file on tmpfs is shared memory, not a
    file's pages (a /tmp on tmpfs would turn the weights into RssShmem)."""
    if _fs_type(tmp_path) not in ("tmpfs", "ramfs"):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir=Path(__file__).parent) as name:
        if _fs_type(Path(name)) in ("tmpfs", "ramfs"):
            pytest.skip("no disk-backed directory to map a file from")
        yield Path(name)


def test_mmapped_file_pages_never_trigger_a_kill(tmp_path: Path, free_port: int, disk_dir: Path):
    """A process of the tree maps and reads a 64 MiB file (like ranks mmapping safetensors):
    its RssFile grows far past the budget's margin, yet nothing is charged and nothing killed."""
    data = disk_dir / "weights.bin"
    data.write_bytes(b"\1" * (64 * MiB))
    hog_code = (
        "import mmap, sys, time\n"
        "f = open(sys.argv[1], 'rb')\n"
        "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
        "total = sum(m[i] for i in range(0, len(m), 4096))\n"
        "print('mapped', total, flush=True)\n"
        "time.sleep(30)\n"
    )
    hog = subprocess.Popen(
        [sys.executable, "-c", hog_code, str(data)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert hog.stdout is not None
        assert hog.stdout.readline().startswith("mapped")
        with launched(
            ["--tp-size", "1"], {"startup_s": 0.1}, port=free_port, state_dir=None
        ) as run:
            wait_until(run.ready, timeout_s=30, what="simulated server ready")
            reader = run.server.proc

            def with_hog(tree: tuple[ProcessInfo, ...]) -> tuple[ProcessInfo, ...]:
                return (*tree, *reader.processes([hog.pid]))

            expected = _charged(with_hog(run.server.tree()))
            limits = tree_limits(expected)
            dog = MemoryWatchdog(
                run.server,
                limits,
                post=run.events.put,
                tree_view=with_hog,
                state_dir=tmp_path,
            )
            for _ in range(20):
                dog.tick()
            hog_info = [p for p in dog.tree if p.pid == hog.pid]
            assert hog_info
            assert hog_info[0].rss_file_bytes >= 60 * MiB
            assert run.events.empty()
            assert dog.killed_at_s is None
            assert run.live_tree()
    finally:
        hog.kill()
        hog.wait()
        if hog.stdout is not None:
            hog.stdout.close()
