"""`run --log-format json` end to end: every line it writes is a JSON event, through a start
and stop, a pre-flight refusal, SGLang rejecting its flags and a usage error; every event after
the launch names the run and the server; the README's jq recipe selects what it says."""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.run_support import ROOT, Supervisor, supervisor

pytestmark = pytest.mark.slow


def every_line_is_an_event(sup: Supervisor) -> list[dict[str, Any]]:
    """Each line of the run's stdout and stderr parsed as a JSON event (fails naming the line)."""
    events = []
    for number, line in enumerate(sup.log_text().splitlines(), 1):
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"line {number} is not JSON: {line!r}")
        assert isinstance(event, dict), line
        assert "event" in event, line
        events.append(event)
    return events


def readme_jq_recipe() -> list[str]:
    """The arguments of `jq` in the README's journal recipe (the journalctl line into jq)."""
    text = (ROOT / "README.md").read_text()
    lines = [line for line in text.splitlines() if "journalctl" in line and "| jq " in line]
    assert len(lines) == 1, lines
    return shlex.split(lines[0].split("| jq ", 1)[1], comments=True)


def test_a_start_and_stop_logs_only_json_and_every_event_after_launch_names_run_and_server(
    tmp_path: Path, free_port: int, simulated_process_guard: str
):
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        overrides={"watchdog": {"enabled": True}},  # its thread's events must say it too
    ) as sup:
        sup.wait_event("ready")
        sup.wait_event("memory_report")
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
    events = every_line_is_an_event(sup)
    names = [e["event"] for e in events]
    launched = events[names.index("server_launched")]
    run = (launched["run_id"], launched["pid"])
    watched = events[names.index("server_launched") : names.index("stopped") + 1]
    assert {"watchdog_started", "watchdog_limits", "memory_report", "ready"} <= {
        e["event"] for e in watched
    }
    assert [e["event"] for e in watched if (e.get("run_id"), e.get("server_pid")) != run] == []
    outputs = [e for e in events if e["event"] == "server_output"]
    assert outputs
    assert all((e["run_id"], e["server_pid"]) == run for e in outputs)
    report = events[names.index("preflight_report")]
    assert report["verdict"] == "fit"
    assert isinstance(report["host_required_bytes"], int)
    assert all(set(c) == {"name", "status", "detail"} for c in report["checks"])
    check_the_readme_jq_recipe(sup.log_path, events)


def check_the_readme_jq_recipe(log_path: Path, events: list[dict[str, Any]]) -> None:
    """The recipe drops SGLang's lines and keeps every supervisor event, in order."""
    wanted = [e for e in events if e["event"] != "server_output"]
    names = [e["event"] for e in wanted]
    # The watchdog's thread may log between the two (a memory_warn on a crowded host).
    assert names[-1] == "stopped"
    assert names.index("ready") < names.index("stopping") < len(names) - 1
    assert len(wanted) < len(events)
    jq = shutil.which("jq")
    if jq is None:
        pytest.skip("jq is not installed: the README's recipe itself was not run")
    done = subprocess.run(
        [jq, *readme_jq_recipe()],
        input=log_path.read_bytes(),
        capture_output=True,
        check=True,
        timeout=30,
    )
    assert [json.loads(line) for line in done.stdout.decode().splitlines()] == wanted


def test_a_preflight_refusal_is_a_report_event_and_a_fatal_event_not_a_table(
    tmp_path: Path, free_port: int, simulated_process_guard: str
):
    with supervisor(tmp_path, free_port, simulated_process_guard, server_args=("--tp", "3")) as sup:
        assert sup.wait_exit() == 1
    events = every_line_is_an_event(sup)
    assert "NO FIT" not in sup.log_text()
    (report,) = [e for e in events if e["event"] == "preflight_report"]
    assert report["verdict"] == "no-fit"
    failed = [c["name"] for c in report["checks"] if c["status"] == "fail"]
    assert "attention_heads" in failed
    assert isinstance(report["host_budget_bytes"], int)
    fatal = events[-1]
    assert (fatal["event"], fatal["exit_code"]) == ("fatal", 1)
    assert "attention_heads failed" in fatal["reason"]
    assert "detail" not in fatal  # the table's content is the report event's fields


@pytest.mark.parametrize(
    ("case", "code"),
    [("sglang rejects a flag", 3), ("a misspelt option", 2)],
)
def test_a_fatal_exit_leaves_only_json_lines_ending_with_the_fatal_event(
    tmp_path: Path, free_port: int, simulated_process_guard: str, case: str, code: int
):
    if case == "a misspelt option":
        kwargs: dict[str, Any] = {"options": ("--helth-interval", "1s")}
    else:
        kwargs = {
            "scenario": {"bad_flags": ["--no-such-flag"]},
            "server_args": ("--tp", "2", "--no-such-flag"),
            "overrides": {"host": {"sglang_version": "0.9.0"}},
        }
    with supervisor(tmp_path, free_port, simulated_process_guard, **kwargs) as sup:
        assert sup.wait_exit() == code
    events = every_line_is_an_event(sup)
    assert (events[-1]["event"], events[-1]["exit_code"]) == ("fatal", code)
    assert events[-1]["level"] == "error"


def test_raw_server_output_passes_sglang_s_lines_through_prefixed_and_masked(
    tmp_path: Path, free_port: int, simulated_process_guard: str
):
    api_key = "sk-raw-output-key-123456"
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        server_args=("--tp", "2", "--api-key", api_key),
        overrides={"log": {"server_output": "raw"}},
    ) as sup:
        sup.wait_event("ready")
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
    lines = sup.log_text().splitlines()
    raw = [line for line in lines if line.startswith("[sglang] ")]
    assert raw
    assert all(isinstance(json.loads(line), dict) for line in lines if line not in raw)
    assert sup.events("server_output") == []
    assert any("'api_key': '***'" in line for line in raw)  # SGLang printed it: masked
    assert api_key not in sup.log_text()
