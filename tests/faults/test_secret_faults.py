"""Secrets the server's own output reveals: a token from the environment the supervisor was
started with (systemd's Environment=, an exported HF_TOKEN), a Bearer token, an Authorization
header, SGLang's own print of its api key. None reaches a log line or a file."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.faults.support import API_KEY, SECRETS, assert_invariants, faulted, recovered

pytestmark = pytest.mark.slow

EXPORTED = "hf_exported_token_5678"  # in the environment `run` was started with
BEARER = "eyJhbGciOiJIUzI1NiJ9.fault"

LINES: dict[str, str] = {
    "an exported HF_TOKEN printed": "HF_TOKEN=$HF_TOKEN",
    "a password of the environment printed": "connecting with $FAULT_DB_PASSWORD",
    "a Bearer token printed": f"GET /v1/models Authorization: Bearer {BEARER}",
    "an Authorization header printed": "headers={'Authorization': 'Basic $FAULT_DB_PASSWORD'}",
    "a key=value pair printed": "config: api_token=$FAULT_DB_PASSWORD retries=3",
}


@pytest.mark.parametrize("name", list(LINES))
def test_a_secret_in_the_server_s_output_is_masked_everywhere(
    name: str, tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    scenario = {"log_lines": [LINES[name]]}
    with faulted(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario=scenario,
        env={"HF_TOKEN": EXPORTED},
    ) as sup:
        sup.wait_event("ready")
        # ... and again after a crash: the relaunched server prints it too.
        os.kill(sup.schedulers()["sglang::scheduler_TP1"], signal.SIGKILL)
        recovered(sup)
        lines = [e["line"] for e in sup.events("server_output") if "server_args" not in e["line"]]
        printed = [line for line in lines if "***" in line]
        assert len(printed) >= 2, "the line was printed, masked, by each launch"
    assert_invariants(tmp_path, sup, shm_record, secrets=(*SECRETS, EXPORTED, BEARER))


def test_sglang_s_own_print_of_its_api_key_is_masked(
    tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    with faulted(tmp_path, free_port, simulated_process_guard) as sup:
        recovered(sup, ready_count=1)
        assert "'api_key': '***'" in sup.log_text()
        assert API_KEY not in sup.log_text()
    assert_invariants(tmp_path, sup, shm_record)
