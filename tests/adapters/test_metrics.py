"""The metrics adapter: log events in, a Prometheus registry out, scraped over HTTP and parsed
with prometheus_client's own parser; the node_exporter textfile, written atomically."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from supervisor.adapters.http_server import HttpListener
from supervisor.adapters.metrics import SupervisorMetrics, TextfileWriter
from tests.waiting import wait_until

P = "sglang_supervisor_"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, keyed by name and sorted labels (`name` left out)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "name"))
            out[(sample.name, labels)] = sample.value
    return out


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def metrics(clock: Clock) -> SupervisorMetrics:
    return SupervisorMetrics("qwen", "9.9.9", lambda _argv: 80_000_000_000, clock=clock, wall=clock)


@pytest.fixture
def scrape(metrics: SupervisorMetrics) -> Iterator[Callable[[], str]]:
    listener = HttpListener("127.0.0.1", 0)
    listener.route("/metrics", metrics.serve)
    listener.start()

    def get() -> str:
        answer = requests.get(f"http://127.0.0.1:{listener.port}/metrics", timeout=5)
        assert answer.status_code == 200
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return answer.text

    yield get
    listener.close()


def run_story(metrics: SupervisorMetrics, clock: Clock) -> None:
    """A launch that gets ready in 42 s, a rank crash, a restart, a second launch."""
    metrics({"event": "launching", "argv": ["--tp", "2", "--hicache-size", "80"]})
    metrics({"event": "server_launched", "pid": 10})
    metrics({"event": "watchdog_limits", "tree_budget_bytes": 300_000_000_000})
    metrics({"event": "memory_report", "available_bytes": 7e11, "tree_charged_bytes": 2e11})
    clock.now = 42.0
    metrics({"event": "ready"})
    metrics({"event": "health_check", "result": "ready", "duration_s": 0.03, "state": "ready"})
    metrics({"event": "health_check", "result": "timeout", "duration_s": 25.0, "state": "ready"})
    metrics({"event": "unhealthy", "cause": "rank_crash"})
    metrics({"event": "server_failed", "failure": "rank_crash", "hint": "a rank died"})
    metrics({"event": "restarting", "failure": "rank_crash", "delay_s": 10})
    metrics({"event": "gpu_release_done", "elapsed_s": 3.0})
    metrics({"event": "launching", "argv": []})


def test_a_scrape_over_http_shows_what_the_events_said(metrics, clock, scrape):
    before = samples(scrape())
    assert before[(P + "build_info", (("version", "9.9.9"),))] == 1
    assert before[(P + "server_state", (("state", "stopped"),))] == 1
    assert before[(P + "restarts_total", (("reason", "rank_crash"),))] == 0
    # Unknown is absent, never 0: no server, no start time, no memory reading yet.
    assert not any(name == P + "server_start_time_seconds" for name, _ in before)
    assert not any(name == P + "host_memory_available_bytes" for name, _ in before)

    run_story(metrics, clock)
    after = samples(scrape())
    assert after[(P + "restarts_total", (("reason", "rank_crash"),))] == 1
    assert after[(P + "server_exits_total", (("kind", "rank_crash"),))] == 1
    assert after[(P + "server_state", (("state", "launching"),))] == 1
    assert after[(P + "server_state", (("state", "ready"),))] == 0
    assert after[(P + "startup_duration_seconds_count", ())] == 1
    assert after[(P + "startup_duration_seconds_sum", ())] == 42.0
    assert after[(P + "startup_duration_seconds_bucket", (("le", "60.0"),))] == 1
    assert after[(P + "startup_duration_seconds_bucket", (("le", "30.0"),))] == 0
    assert after[(P + "health_check_duration_seconds_count", ())] == 2
    assert after[(P + "health_check_failures_total", (("reason", "timeout"),))] == 1
    assert after[(P + "gpu_release_wait_seconds_sum", ())] == 3.0
    assert after[(P + "tree_budget_bytes", ())] == 3e11
    assert after[(P + "host_memory_available_bytes", ())] == 7e11
    assert after[(P + "hicache_size_bytes_per_rank", ())] == 8e10
    # The tree that died has no start time and no memory any more.
    assert not any(name == P + "tree_memory_bytes" for name, _ in after)
    assert not any(name == P + "server_start_time_seconds" for name, _ in after)


def test_every_sample_names_the_instance(metrics, scrape):
    for family in text_string_to_metric_families(scrape()):
        for sample in family.samples:
            assert sample.labels["name"] == "qwen", sample


def test_openmetrics_is_served_to_who_asks_for_it(metrics):
    body, content_type = metrics.exposition("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")


def test_the_sink_counts_every_event_when_threads_log_at_once(metrics):
    def log_restarts() -> None:
        for _ in range(500):
            metrics({"event": "restarting", "failure": "health_timeout"})

    threads = [threading.Thread(target=log_restarts) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    body, _ = metrics.exposition()
    assert samples(body.decode())[(P + "restarts_total", (("reason", "health_timeout"),))] == 4000


def read_samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return samples(path.read_text())


def test_the_textfile_is_written_at_start_after_a_change_and_at_close(metrics, tmp_path):
    path = tmp_path / "sglang.prom"
    writer = TextfileWriter(metrics.registry, str(path), interval_s=0.05)
    metrics.on_change(writer.changed)
    writer.start()
    try:
        first = wait_until(lambda: path.exists() and read_samples(path), what="the first write")
        assert first[(P + "server_state", (("state", "stopped"),))] == 1
        metrics({"event": "restarting", "failure": "memory_kill"})
        wait_until(
            lambda: read_samples(path)[(P + "restarts_total", (("reason", "memory_kill"),))] == 1,
            what="the change written",
        )
        metrics({"event": "fatal", "exit_code": 5})
    finally:
        writer.close()
    # The last values are there once close() returns, and no temporary file is left beside it.
    assert read_samples(path)[(P + "server_state", (("state", "fatal"),))] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["sglang.prom"]


def test_a_textfile_that_cannot_be_written_is_reported_once_until_it_can_again(metrics, tmp_path):
    errors: list[OSError] = []
    recovered: list[bool] = []
    folder = tmp_path / "collector"
    writer = TextfileWriter(
        metrics.registry,
        str(folder / "sglang.prom"),
        on_error=errors.append,
        on_recovered=lambda: recovered.append(True),
    )
    assert writer.write() is False
    assert writer.write() is False
    assert len(errors) == 1
    assert "No such file or directory" in str(errors[0])
    folder.mkdir()
    assert writer.write() is True
    assert recovered == [True]
    assert read_samples(folder / "sglang.prom")


def test_the_textfile_is_readable_by_node_exporters_user(metrics, tmp_path):
    path = tmp_path / "sglang.prom"
    assert TextfileWriter(metrics.registry, path).write() is True
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


@pytest.mark.parametrize("where", ["final name", "prometheus_client's temp name"])
def test_a_link_planted_beside_the_textfile_is_never_written_through(metrics, tmp_path, where):
    """prometheus_client's write_to_textfile opened `<path>.<pid>.<thread id>` with a plain
    open(): a link planted there made root overwrite its target."""
    collector = tmp_path / "collector"
    collector.mkdir()
    path = collector / "sglang.prom"
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    planted = (
        path if where == "final name" else Path(f"{path}.{os.getpid()}.{threading.get_ident()}")
    )
    planted.symlink_to(target)
    assert TextfileWriter(metrics.registry, path).write() is True
    assert target.read_text() == "keep me\n"
    assert read_samples(path)[(P + "server_state", (("state", "stopped"),))] == 1
    assert not path.is_symlink()
