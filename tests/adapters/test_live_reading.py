"""The tree's memory in the metrics is read at the scrape, not taken from the watchdog's last
`memory_report`; a read that hangs never holds the scrape, which then shows the reported value;
the /proc fallback visits the tree with a cap."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.adapters import live_reading
from supervisor.adapters.live_reading import LiveReading, proc_tree_bytes, tree_memory_source
from supervisor.adapters.metrics import SupervisorMetrics
from supervisor.run.metrics import tree_memory_plugins
from tests.adapters.test_metrics import P, samples
from tests.fakes.server import FakeServer
from tests.waiting import wait_until

TREE = (P + "tree_memory_bytes", ())
# A fresh read is waited for as long as it takes here (a loaded machine is slow to start a
# thread); the wait only bounds a read that hangs, and that test sets its own.
PATIENT_S = 60.0


@pytest.fixture
def metrics() -> SupervisorMetrics:
    return SupervisorMetrics("qwen", "9.9.9", lambda _argv: 0)


def _tree_bytes(metrics: SupervisorMetrics) -> float | None:
    return samples(metrics.exposition()[0].decode()).get(TREE)


def test_the_scrape_shows_the_tree_as_it_is_now_without_waiting_for_a_report(metrics):
    reading = LiveReading(PATIENT_S)
    metrics.live_gauge("tree_memory_bytes", reading.read)
    now = {"bytes": 2_190_000_000}
    metrics({"event": "memory_report", "available_bytes": 1e10, "tree_charged_bytes": 7.8e6})
    assert _tree_bytes(metrics) == 7.8e6  # no server to read: the report's value
    reading.set_source(lambda: now["bytes"])
    assert _tree_bytes(metrics) == 2_190_000_000
    now["bytes"] = 3_000_000_000  # the tree grew; no event since
    assert _tree_bytes(metrics) == 3_000_000_000
    reading.set_source(None)
    assert _tree_bytes(metrics) == 7.8e6


@pytest.fixture
def stuck() -> Iterator[threading.Event]:
    release = threading.Event()
    yield release
    release.set()


def test_a_read_that_hangs_never_holds_the_scrape_and_only_one_is_in_flight(metrics, stuck):
    started: list[int] = []

    def hangs() -> int:
        started.append(1)
        stuck.wait()
        return 5

    reading = LiveReading(wait_s=0.01)
    metrics.live_gauge("tree_memory_bytes", reading.read)
    metrics({"event": "memory_report", "available_bytes": 1e10, "tree_charged_bytes": 4.0})
    reading.set_source(hangs)
    assert _tree_bytes(metrics) == 4.0  # the reported value while the read hangs
    assert _tree_bytes(metrics) == 4.0
    wait_until(lambda: started != [], what="the hanging read under way")
    assert started == [1]  # the second scrape waited on the same read, started no other
    stuck.set()


def test_a_failed_read_keeps_the_reported_value(metrics):
    def fails() -> int:
        raise OSError("gone")

    reading = LiveReading(PATIENT_S)
    metrics.live_gauge("tree_memory_bytes", reading.read)
    metrics({"event": "memory_report", "available_bytes": 1e10, "tree_charged_bytes": 9.0})
    reading.set_source(fails)
    assert _tree_bytes(metrics) == 9.0


def _process(proc: Path, pid: int, anon_kib: int, shmem_kib: int, children: dict[int, str]) -> None:
    status = proc / str(pid) / "status"
    status.parent.mkdir(parents=True)
    status.write_text(
        f"Name:\tx\nRssAnon:\t{anon_kib} kB\nRssFile:\t999 kB\nRssShmem:\t{shmem_kib} kB\n"
    )
    for tid, kids in children.items():
        task = proc / str(pid) / "task" / str(tid)
        task.mkdir(parents=True)
        (task / "children").write_text(kids)


def test_without_a_cgroup_the_tree_is_summed_from_proc_with_a_cap(tmp_path, monkeypatch):
    proc = tmp_path / "proc"
    # main 10 -> ranks 11 (forked from a second thread) and 12 -> 13; 99 is no member.
    _process(proc, 10, 100, 0, {10: "12 ", 20: "11"})
    _process(proc, 11, 200, 1000, {11: ""})
    _process(proc, 12, 300, 0, {12: "13"})
    _process(proc, 13, 1, 2, {13: ""})
    _process(proc, 99, 10**6, 0, {99: ""})
    assert proc_tree_bytes(10, proc) == (100 + 1200 + 300 + 3) * 1024  # RssFile not counted
    assert proc_tree_bytes(42, proc) is None  # the main process is gone
    monkeypatch.setattr(live_reading, "MAX_TREE_PROCESSES", 2)
    assert proc_tree_bytes(10, proc) in {(100 + 1200) * 1024, (100 + 300) * 1024}


def test_the_cgroups_charge_is_one_read_and_wins_over_proc(tmp_path):
    server = FakeServer(pid=10, run_id="r", ranks=0)
    server.kernel_charged_bytes = 12345
    assert tree_memory_source(server, tmp_path / "no-proc")() == 12345
    server.kernel_charged_bytes = None
    _process(tmp_path / "proc", 10, 4, 0, {10: ""})
    assert tree_memory_source(server, tmp_path / "proc")() == 4 * 1024


def test_the_runs_component_reads_the_launched_tree_until_it_stops(metrics):
    plugins = tree_memory_plugins(metrics, PATIENT_S)
    server = FakeServer(pid=10, run_id="r", ranks=0)
    server.kernel_charged_bytes = 777
    (factory,) = plugins.components
    component = factory(server, lambda _event: None, None)  # type: ignore[arg-type]
    assert component is not None
    metrics({"event": "memory_report", "available_bytes": 1e10, "tree_charged_bytes": 1.0})
    component.start()
    assert _tree_bytes(metrics) == 777
    server.kernel_charged_bytes = 888
    assert _tree_bytes(metrics) == 888
    component.stop()
    assert _tree_bytes(metrics) == 1.0
    assert tree_memory_plugins(None).components == ()
