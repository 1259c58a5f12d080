"""The metrics of one run (supervisor/run/metrics.py): fed by real log events through the tap,
served on [http] listen, written to [metrics] textfile; a port in use costs /metrics only."""

from __future__ import annotations

import dataclasses
import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import structlog
from prometheus_client.parser import text_string_to_metric_families

from supervisor import log as sup_log
from supervisor.config import RunSettings
from supervisor.config.metrics_sections import HttpConfig, MetricsConfig
from supervisor.run.metrics import metrics_problem, serve_metrics
from tests.run.runner_support import ARGS, settings

P = "sglang_supervisor_"


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    sup_log.configure_logging("json", "info", stream=stream)
    yield stream
    structlog.reset_defaults()


def with_metrics(
    tmp_path: Path, listen: str = "", textfile: str = "", config_dir: Path | None = None
) -> RunSettings:
    base = settings(tmp_path)
    config = dataclasses.replace(
        base.config, http=HttpConfig(listen=listen), metrics=MetricsConfig(textfile=textfile)
    )
    return dataclasses.replace(base, config=config, config_dir=config_dir)


def value(text: str, metric: str, /, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == metric and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def events(stream: io.StringIO, name: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [e for e in lines if e["event"] == name]


def test_nothing_is_served_or_tapped_when_both_are_off(tmp_path, log_stream):
    sinks = sup_log._sinks
    with serve_metrics(with_metrics(tmp_path)) as metrics:
        assert metrics is None
        assert sup_log._sinks == sinks


def test_log_events_reach_metrics_scraped_from_the_listener_until_the_run_ends(
    tmp_path, free_port, log_stream
):
    log = structlog.get_logger("t")
    url = f"http://127.0.0.1:{free_port}/metrics"
    with serve_metrics(with_metrics(tmp_path, listen=f"127.0.0.1:{free_port}")) as metrics:
        assert metrics is not None
        assert events(log_stream, "http_listening")[0]["port"] == free_port
        log.info("launching", argv=list(ARGS))
        log.info("server_launched", pid=1)
        log.error("server_failed", failure="rank_crash")
        log.info("restarting", failure="rank_crash", delay_s=0.1)
        text = requests.get(url, timeout=5).text
        assert value(text, P + "restarts_total", name="unit", reason="rank_crash") == 1
        assert value(text, P + "server_state", state="backoff") == 1
        # --hicache-size 40 with the hierarchical cache on, read by SGLang's rules: 40 GB per rank.
        assert value(text, P + "hicache_size_bytes_per_rank") == 40e9
    log.info("restarting", failure="rank_crash")
    assert value(metrics.exposition()[0].decode(), P + "restarts_total", reason="rank_crash") == 1
    with pytest.raises(requests.ConnectionError):
        requests.get(url, timeout=5)


def test_a_port_in_use_is_a_warning_naming_it_and_the_textfile_still_works(tmp_path, log_stream):
    textfile = tmp_path / "node" / "sglang.prom"
    textfile.parent.mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = with_metrics(tmp_path, listen=f"127.0.0.1:{port}", textfile=str(textfile))
        with serve_metrics(run) as metrics:
            assert metrics is not None
            structlog.get_logger("t").info("restarting", failure="memory_kill")
    failed = events(log_stream, "metrics_listen_failed")
    assert len(failed) == 1
    assert failed[0]["port"] == port
    assert failed[0]["level"] == "warning"
    assert f"port {port}" in str(failed[0]["detail"])
    assert value(textfile.read_text(), P + "restarts_total", reason="memory_kill") == 1


def test_a_relative_textfile_is_beside_the_config_file_and_its_folder_must_exist(tmp_path):
    (tmp_path / "etc").mkdir()
    run = with_metrics(tmp_path, textfile="m/sglang.prom", config_dir=tmp_path / "etc")
    assert metrics_problem(run) == (
        f"config key metrics.textfile: {tmp_path / 'etc' / 'm'} is not a directory"
    )
    (tmp_path / "etc" / "m").mkdir()
    assert metrics_problem(run) is None
    with serve_metrics(run):
        pass
    assert (tmp_path / "etc" / "m" / "sglang.prom").read_text().startswith("# HELP")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("--model-path", "m", "--tp", "2"), 0.0),  # no HiCache: none
        (("--model-path", "m", "--enable-hierarchical-cache", "--hicache-ratio", "2"), None),
    ],
)
def test_hicache_size_follows_the_launch_argv(tmp_path, log_stream, argv, expected):
    textfile = tmp_path / "sglang.prom"
    with serve_metrics(with_metrics(tmp_path, textfile=str(textfile))):
        structlog.get_logger("t").info("launching", argv=list(argv))
    assert value(textfile.read_text(), P + "hicache_size_bytes_per_rank") == expected
