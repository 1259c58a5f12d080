"""The real server at TP 1 under `run`: the events through loading and warming to ready,
/generate answers, the KV tokens the supervisor measured are SGLang's own log line's, and
`status` and the metrics say the same; a planned stop leaves nothing behind."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.real_sglang.lane import (
    KV_TOKENS,
    LANE_MARKS,
    Leftovers,
    generate,
    real_supervisor,
    status_json,
)

pytestmark = LANE_MARKS
P = "sglang_supervisor_"


def samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert answer.status_code == 200
    out = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "name"))
            out[(sample.name, labels)] = sample.value
    return out


def test_ready_through_loading_and_warming_with_sglang_s_own_kv_tokens(
    tmp_path: Path, simulated_process_guard: str
):
    left: list[Leftovers] = []
    with real_supervisor(tmp_path, simulated_process_guard, leftovers=left) as sup:
        ready = sup.wait_ready()
        names = [e["event"] for e in sup.events()]
        for state in ("server_launched", "loading", "warming", "ready"):
            assert state in names, (state, names)
        order = [names.index(s) for s in ("server_launched", "loading", "warming", "ready")]
        assert order == sorted(order)

        answer = generate(sup.port, 8, timeout_s=120)
        assert answer.status_code == 200
        assert answer.json()["meta_info"]["completion_tokens"] == 8

        line = sup.wait_output(r"KV Cache is allocated\. .*#tokens: (\d+)")
        assert int(line.group(1)) == KV_TOKENS
        rc, status = status_json(sup.state_dir)
        assert (rc, status["state"]) == (0, "ready")
        launched = sup.events("server_launched")[0]
        assert status["server_pid"] == launched["pid"]
        scraped = samples(sup.metrics_port())
        assert scraped[(P + "server_state", (("state", "ready"),))] == 1
        assert sum(v for (n, _l), v in scraped.items() if n == P + "restarts_total") == 0
        assert status["restart_count"] == 0
        assert scraped[(P + "startup_duration_seconds_count", ())] == 1
        assert ready is not None

        sup.signal(signal.SIGTERM)
        assert sup.wait_exit(timeout_s=120) == 0
        assert any(re.search("SIGTERM received", line) for line in sup.output())
        measured = sup.events("sizing_measured")
        not_measured = sup.events("sizing_not_measured")
    (after,) = left
    assert (after.processes, after.cgroups) == ([], [])
    # Last, so that the rest is checked while these fail. SGLang's CPU lines can say "mem
    # usage=-0.02 GB" (host RAM moved during the load), which the supervisor does not read; and
    # a clean exit leaves SGLang's load snapshot (sglang_loads_*.shm) and multiprocessing's
    # semaphores (sem.mp-*) in /dev/shm, which the supervisor must sweep.
    problems = []
    if [e["device_tokens"] for e in measured] != [KV_TOKENS]:
        problems.append(f"KV tokens not measured: {not_measured}")
    if after.shm:
        problems.append(f"left in /dev/shm: {after.shm}")
    assert problems == []
