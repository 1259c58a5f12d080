"""`run` against the simulated server: what SGLang logs about its pools is read back, filed for
the next pre-flight; a worker node's stop does not wait for a drain that never comes."""

from __future__ import annotations

import json
import signal
import urllib.request

import pytest

from tests.e2e.run_support import supervisor

pytestmark = pytest.mark.slow


def test_sglang_s_own_sizing_lines_are_filed_for_the_next_preflight(
    tmp_path, free_port, simulated_process_guard
):
    with supervisor(tmp_path, free_port, simulated_process_guard) as sup:
        sup.wait_event("ready")
        measured = sup.wait_event("sizing_measured")
        url = f"http://127.0.0.1:{free_port}/server_info"
        with urllib.request.urlopen(url, timeout=5) as answer:
            info = json.load(answer)
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
    assert measured["device_tokens"] == info["max_total_num_tokens"]
    records = json.loads((sup.state_dir / "measured-sizing.json").read_text())["records"]
    (record,) = records
    assert record["measurement"]["device_tokens"] == info["max_total_num_tokens"]
    assert record["deployment"]["tp_size"] == 2


def test_a_worker_node_is_stopped_after_the_worker_grace(
    tmp_path, free_port, simulated_process_guard
):
    """--node-rank 1: SGLang's main process only logs the SIGTERM and waits for rank 0."""
    args = ("--tp", "4", "--nnodes", "2", "--node-rank", "1")
    options = ("--worker-stop-grace", "0.5s")
    with supervisor(
        tmp_path, free_port, simulated_process_guard, server_args=args, options=options
    ) as sup:
        sup.wait_event("ready")
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
        assert sup.tree() == []
    stopping = sup.events("stopping")[0]
    assert stopping["grace_s"] == 0.5
    lines = [e["line"] for e in sup.events("server_output")]
    assert any("SIGTERM received on node_rank 1" in line for line in lines)
