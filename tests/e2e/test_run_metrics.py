"""`run` with [http] listen and [metrics] textfile, end to end on the simulated server: a scrape
before and after a restart, a port already in use, the textfile at exit."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.run_support import supervisor

pytestmark = pytest.mark.slow

P = "sglang_supervisor_"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "name"))
            out[(sample.name, labels)] = sample.value
    return out


def total(samples: Samples, name: str) -> float:
    return sum(v for (n, _labels), v in samples.items() if n == name)


def scrape(port: int) -> Samples:
    answer = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert answer.status_code == 200
    return parse(answer.text)


def test_a_scrape_before_and_after_a_rank_crash_shows_the_restart(
    tmp_path, free_port, simulated_process_guard
):
    # Port 0: the listener takes a free port itself and logs it (no race for a free port).
    overrides = {"http": {"listen": "127.0.0.1:0"}}
    with supervisor(tmp_path, free_port, simulated_process_guard, overrides=overrides) as sup:
        metrics_port = sup.wait_event("http_listening")["port"]
        assert metrics_port not in (0, free_port)
        sup.wait_event("ready")
        before = scrape(metrics_port)
        assert before[(P + "server_state", (("state", "ready"),))] == 1
        assert total(before, P + "restarts_total") == 0
        assert before[(P + "startup_duration_seconds_count", ())] == 1
        assert before[(P + "hicache_size_bytes_per_rank", ())] == 0  # no HiCache in this argv
        started_at = before[(P + "server_start_time_seconds", ())]

        os.kill(sup.schedulers()["sglang::scheduler_TP1"], signal.SIGKILL)
        failure = sup.wait_event("restarting")["failure"]
        sup.wait_event("ready", count=2)
        after = scrape(metrics_port)
        assert after[(P + "restarts_total", (("reason", failure),))] == 1
        assert total(after, P + "restarts_total") == 1
        assert after[(P + "server_exits_total", (("kind", failure),))] == 1
        assert after[(P + "server_state", (("state", "ready"),))] == 1
        assert after[(P + "startup_duration_seconds_count", ())] == 2
        assert after[(P + "server_start_time_seconds", ())] > started_at
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0


def test_a_metrics_port_in_use_is_a_warning_and_the_run_goes_on_writing_its_textfile(
    tmp_path: Path, free_port, simulated_process_guard
):
    textfile = tmp_path / "sglang.prom"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        overrides = {
            "http": {"listen": f"127.0.0.1:{port}"},
            "metrics": {"textfile": str(textfile)},
        }
        with supervisor(tmp_path, free_port, simulated_process_guard, overrides=overrides) as sup:
            failed = sup.wait_event("metrics_listen_failed")
            assert failed["port"] == port
            assert failed["level"] == "warning"
            sup.wait_event("ready")
            sup.signal(signal.SIGTERM)
            assert sup.wait_exit() == 0
    # Written a last time at exit: the stop is there.
    final = parse(textfile.read_text())
    assert final[(P + "server_state", (("state", "stopped"),))] == 1
    assert final[(P + "server_exits_total", (("kind", "stopped"),))] == 1
    assert final[(P + "startup_duration_seconds_count", ())] == 1
    assert sorted(p.name for p in tmp_path.glob("sglang.prom*")) == ["sglang.prom"]
