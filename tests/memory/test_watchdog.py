"""watchdog.MemoryWatchdog ticks driven by a scripted server tree and host (no processes)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from supervisor import log as sup_log
from supervisor.adapters.host import HostProbe, HostReadError
from supervisor.core.classify import FailureKind
from supervisor.core.events import KillReason, MemoryAction, WatchdogEvent
from supervisor.core.policy import Level, Limits
from supervisor.core.readings import HostMemory, ProcessInfo
from supervisor.memory.watchdog import MemoryWatchdog, system_host_source
from tests.fakes import FakeClock

GB = 10**9
KILLED, TERMINATED = MemoryAction.KILLED, MemoryAction.TERMINATED


class FakeTree:
    """A server whose ranks' memory the test sets; records signals and kills."""

    def __init__(self, ranks: int = 4, shmem: int = 40 * GB, file_bytes: int = 0) -> None:
        self.pid = 1000
        self.ranks = {
            1001 + i: {"anon": 2 * GB, "shmem": shmem, "file": file_bytes} for i in range(ranks)
        }
        self.killed: list[KillReason] = []
        self.terminations: list[KillReason] = []
        self.scans = 0
        self.kernel_charged_bytes: int | None = None  # a cgroup's memory.stat; None: /proc

    def info(self, pid: int) -> ProcessInfo:
        mem = self.ranks[pid]
        return ProcessInfo(
            pid=pid,
            ppid=self.pid,
            pgid=self.pid,
            state="S",
            title=f"sglang::scheduler_TP{pid - 1001}",
            rss_anon_bytes=mem["anon"],
            rss_shmem_bytes=mem["shmem"],
            rss_file_bytes=mem["file"],
        )

    def tree(self) -> tuple[ProcessInfo, ...]:
        self.scans += 1
        if self.killed:
            return ()
        return tuple(self.info(pid) for pid in self.ranks)

    def refresh(self, known: Iterable[ProcessInfo]) -> tuple[ProcessInfo, ...]:
        pids = [p.pid for p in known]
        return () if self.killed else tuple(self.info(p) for p in pids if p in self.ranks)

    def kill_all(self, reason: KillReason) -> tuple[int, ...]:
        self.killed.append(reason)
        return tuple(self.ranks)

    def terminate(self, reason: KillReason) -> None:
        self.terminations.append(reason)

    def charged_bytes(self) -> int | None:
        return self.kernel_charged_bytes

    @property
    def memory_released(self) -> int:
        return len(self.killed)

    def tail(self) -> tuple[str, ...]:
        return ("loading", "server args: --api-key hunter2 --tp 4", "HF_TOKEN=abc123 set")

    def charged(self) -> int:
        return sum(m["anon"] + m["shmem"] for m in self.ranks.values())


class SimHost:
    """MemAvailable = total − other use − the tree's charge (what the demo does too)."""

    def __init__(self, total: int = 449 * GB, other: int = 20 * GB) -> None:
        self.total = total
        self.other = other

    def __call__(self, tree: Sequence[ProcessInfo]) -> HostMemory:
        used = self.other + sum(p.charged_bytes for p in tree)
        return HostMemory(total_bytes=self.total, available_bytes=self.total - used)


LIMITS = Limits(
    warn=Level(bytes_=8 * GB),
    terminate=Level(bytes_=4 * GB),
    kill=Level(bytes_=2 * GB),
    tree_budget_bytes=170 * GB,
    tree_kill_bytes=200 * GB,
    psi_full_warn_percent=None,
)


def make(
    tree: FakeTree,
    tmp_path: Path | None,
    limits: Limits = LIMITS,
    host=None,
    clock: FakeClock | None = None,
):
    events: list[WatchdogEvent] = []
    clock = clock or FakeClock()
    dog = MemoryWatchdog(
        tree,
        limits,
        post=events.append,
        read_host=host or SimHost(),
        read_psi=lambda: None,
        state_dir=tmp_path,
        run_id="run-1",
        clock=clock,
    )
    return dog, events, clock


def run_ticks(dog: MemoryWatchdog, clock: FakeClock, tree: FakeTree, leak_bytes_per_s: float):
    """Tick at the watchdog's own pace while rank 0 leaks; returns the peak charge seen."""
    peak = tree.charged()
    for _ in range(10_000):
        decision = dog.tick()
        if tree.killed:
            return peak
        clock.now += decision.next_interval_s
        tree.ranks[1001]["anon"] += int(leak_bytes_per_s * decision.next_interval_s)
        peak = max(peak, tree.charged())
    raise AssertionError("the watchdog never killed the leaking tree")


def test_a_leak_in_one_rank_kills_the_whole_group_before_budget_plus_margin(tmp_path: Path):
    tree = FakeTree()
    dog, events, clock = make(tree, tmp_path)
    peak = run_ticks(dog, clock, tree, leak_bytes_per_s=2 * GB)
    assert tree.killed
    assert tree.killed[0].failure is FailureKind.MEMORY_KILL
    assert peak < LIMITS.tree_kill_bytes
    assert [(e.action, e.failure) for e in events] == [(KILLED, FailureKind.MEMORY_KILL)]
    assert events[0].pids == (1001, 1002, 1003, 1004)


def test_the_incident_file_explains_the_kill_and_hides_secrets(tmp_path: Path):
    tree = FakeTree()
    dog, events, clock = make(tree, tmp_path)
    run_ticks(dog, clock, tree, leak_bytes_per_s=2 * GB)
    path = Path(events[0].incident_path or "")
    assert path.parent == tmp_path
    data = json.loads(path.read_text())
    assert data["kind"] == "memory_kill"
    assert data["decision"]["verdict"] == "kill"
    assert "budget plus margin" in data["decision"]["reason"]
    assert data["thresholds"]["tree_kill_bytes"] == 200 * GB
    assert len(data["ticks"]) >= 2
    assert data["decision"]["tree_growth_bytes_per_s"] > 0
    assert data["top_processes"][0]["pid"] == 1001  # the leaking rank first
    assert data["meminfo"]  # the real /proc/meminfo of this box
    assert "gpu_snapshot" in data
    text = path.read_text()
    assert "hunter2" not in text
    assert "abc123" not in text
    assert data["server_log_tail"][1].endswith("--api-key *** --tp 4")
    assert data["run_id"] == "run-1"


def test_mmapped_file_pages_never_trigger_anything(tmp_path: Path):
    # 300 GB of RssFile per rank (mmapped weights): reclaimable, counted as available by the host.
    tree = FakeTree(file_bytes=300 * GB)
    dog, events, clock = make(tree, tmp_path)
    for _ in range(50):
        decision = dog.tick()
        clock.now += decision.next_interval_s
    assert not tree.killed
    assert not tree.terminations
    assert events == []


def test_host_memory_below_terminate_sends_sigterm_once_then_kills_after_the_grace(tmp_path: Path):
    tree = FakeTree()
    # 449 − 20 − 168 = 261 GB available; a 258 GB foreign hog leaves 3 GB: below terminate.
    dog, events, clock = make(tree, tmp_path, host=SimHost(other=278 * GB))
    dog.tick()
    clock.now += 1.0
    dog.tick()
    assert [r.failure for r in tree.terminations] == [FailureKind.MEMORY_KILL]
    assert [e.action for e in events] == [TERMINATED]
    clock.now += LIMITS.terminate_grace_s
    dog.tick()
    assert tree.killed
    assert "grace" in tree.killed[0].detail
    assert [e.action for e in events] == [TERMINATED, KILLED]


def test_the_kill_is_skipped_when_memory_recovers_before_the_signal(tmp_path: Path):
    tree = FakeTree()
    reads = {"n": 0}

    def host(t: Sequence[ProcessInfo]) -> HostMemory:
        reads["n"] += 1
        # First read: 1 GB left (kill); the re-read right before the kill: 100 GB again.
        return HostMemory(total_bytes=449 * GB, available_bytes=GB if reads["n"] == 1 else 100 * GB)

    dog, events, _clock = make(tree, tmp_path, host=host)
    decision = dog.tick()
    assert reads["n"] == 2
    assert decision.verdict.value == "ok"
    assert not tree.killed
    assert events == []


def test_known_pids_are_read_between_full_scans(tmp_path: Path):
    """Idle (1 s ticks): once two scans agree on the members, a full /proc scan every 5 s and
    the known PIDs re-read in between."""
    tree = FakeTree()
    dog, _events, clock = make(tree, tmp_path)
    dog.tick()
    clock.now += 1.0
    dog.tick()
    assert tree.scans == 2  # the second scan confirms the membership
    for _ in range(4):
        clock.now += 1.0
        dog.tick()
    assert tree.scans == 2
    clock.now += 1.5
    dog.tick()
    assert tree.scans == 3


def test_ranks_that_appear_while_loading_are_found_within_a_second_not_read_as_growth(
    tmp_path: Path,
):
    """Ranks spawned after the first scan come with their whole pinned pool; found 5 s late,
    that pool would look like hundreds of GB/s of growth to the trend term."""
    tree = FakeTree(ranks=4)
    late = {pid: tree.ranks.pop(pid) for pid in (1003, 1004)}
    dog, events, clock = make(tree, tmp_path)
    dog.tick()
    clock.now += 1.0
    tree.ranks.update(late)
    dog.tick()
    assert {p.pid for p in dog.tree} == {1001, 1002, 1003, 1004}
    assert events == []
    assert tree.killed == []


def test_the_thread_kills_on_its_first_tick_and_watches_the_tree_go(tmp_path: Path):
    """Started over its budget: the thread kills at once, sees the tree gone, and ends."""
    tree = FakeTree(shmem=60 * GB)  # 4 × 62 GB: far past the 200 GB kill line
    dog, events, _clock = make(tree, tmp_path)
    dog.start()
    assert dog._thread is not None
    dog._thread.join(timeout=30)
    assert not dog.is_running
    assert [e.action for e in events] == [KILLED]
    assert dog.gone_at_s is not None
    steps = [s["step"] for s in json.loads(Path(events[0].incident_path or "").read_text())["next"]]
    assert steps == ["tree_gone"]


def test_a_tree_that_will_not_go_is_noted_in_the_incident(tmp_path: Path):
    class Stubborn(FakeTree):
        def __init__(self, clock: FakeClock) -> None:
            super().__init__(shmem=60 * GB)
            self.clock = clock

        def tree(self) -> tuple[ProcessInfo, ...]:
            self.clock.now += 1.0  # every look takes a second of the fake clock
            return tuple(self.info(pid) for pid in self.ranks)

    clock = FakeClock()
    tree = Stubborn(clock)
    dog, events, _ = make(tree, tmp_path, clock=clock)
    dog.tick()
    dog._after_kill()
    assert dog.gone_at_s is None
    steps = json.loads(Path(events[0].incident_path or "").read_text())["next"]
    assert steps[-1]["step"] == "tree_not_gone"
    assert steps[-1]["pids"] == [1001, 1002, 1003, 1004]


def test_an_unreadable_host_degrades_to_the_last_reading_without_a_crash(tmp_path: Path):
    tree = FakeTree()
    calls = {"n": 0}

    def host(t: Sequence[ProcessInfo]) -> HostMemory:
        calls["n"] += 1
        if calls["n"] > 1:
            raise HostReadError("/proc/meminfo: gone")
        return HostMemory(total_bytes=449 * GB, available_bytes=200 * GB)

    dog, events, clock = make(tree, tmp_path, host=host)
    with capture_logs() as logs:
        for _ in range(3):
            dog.tick()
            clock.now += 1.0
    assert [e["event"] for e in logs].count("watchdog_degraded") == 1
    assert dog.history[-1].available_bytes == 200 * GB
    assert events == []


def test_without_a_state_directory_the_kill_still_happens_but_no_incident_is_written():
    tree = FakeTree(shmem=60 * GB)
    dog, events, _ = make(tree, None)
    dog.tick()
    assert [e.action for e in events] == [KILLED]
    assert events[0].incident_path is None


def test_the_system_host_source_caps_memavailable_by_the_cgroup_headroom(tmp_path: Path):
    proc = tmp_path / "proc"
    (proc / "77").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 1000000 kB\nMemAvailable: 800000 kB\n")
    (proc / "77" / "cgroup").write_text("0::/svc\n")
    cg = tmp_path / "cg"
    (cg / "svc").mkdir(parents=True)
    (cg / "cgroup.controllers").write_text("memory\n")
    (cg / "svc" / "memory.max").write_text(f"{300 * 1024 * 1024}\n")
    (cg / "svc" / "memory.current").write_text(f"{100 * 1024 * 1024}\n")
    (cg / "svc" / "memory.stat").write_text("active_file 0\ninactive_file 0\n")
    read = system_host_source(77, HostProbe(proc_root=proc, cgroup_root=cg))
    mem = read(())
    assert mem.available_bytes == 800000 * 1024
    assert mem.usable_bytes == 200 * 1024 * 1024
    unlimited = system_host_source(77, HostProbe(proc_root=proc, cgroup_root=tmp_path / "none"))
    assert unlimited(()).usable_bytes == 800000 * 1024


def test_the_incident_keeps_as_many_server_lines_as_configured(tmp_path: Path):
    tree = FakeTree(shmem=60 * GB)
    events: list[WatchdogEvent] = []
    dog = MemoryWatchdog(
        tree,
        LIMITS,
        post=events.append,
        read_host=SimHost(),
        read_psi=lambda: None,
        state_dir=tmp_path,
        clock=FakeClock(),
        incident_log_lines=1,
    )
    dog.tick()
    data = json.loads(Path(events[0].incident_path or "").read_text())
    assert data["server_log_tail"] == ["HF_TOKEN=*** set"]


@pytest.fixture
def tapped() -> Iterator[list[dict[str, Any]]]:
    """Every event as the production log's tap sees it (contextvars merged)."""
    seen: list[dict[str, Any]] = []
    sup_log.configure_logging("json", "info", stream=io.StringIO())
    structlog.contextvars.clear_contextvars()

    def sink(event: Mapping[str, Any]) -> None:
        seen.append(dict(event))

    sup_log.add_sink(sink)
    try:
        yield seen
    finally:
        sup_log.remove_sink(sink)
        structlog.reset_defaults()


def test_events_of_the_watchdog_thread_name_the_run_and_the_server(
    tmp_path: Path, tapped: list[dict[str, Any]]
):
    """The main loop's contextvars do not reach the thread: the watchdog binds its own."""
    dog, _events, _clock = make(FakeTree(shmem=60 * GB), tmp_path)
    dog.start()
    assert dog._thread is not None
    dog._thread.join(timeout=30)
    names = [e["event"] for e in tapped]
    assert names[:2] == ["watchdog_started", "server_killed"]
    assert {"incident_written", "server_tree_gone"} <= set(names)  # incident.py's, in the thread
    assert [(e["run_id"], e["server_pid"]) for e in tapped] == [("run-1", 1000)] * len(tapped)


def test_memory_report_names_the_run_and_server_and_keeps_bytes_as_integers(
    tmp_path: Path, tapped: list[dict[str, Any]]
):
    dog, _events, _clock = make(FakeTree(), tmp_path)
    dog.tick()
    report = next(e for e in tapped if e["event"] == "memory_report")
    assert (report["run_id"], report["server_pid"]) == ("run-1", 1000)
    assert isinstance(report["available_bytes"], int)
    assert report["tree_charged_bytes"] == FakeTree().charged()
