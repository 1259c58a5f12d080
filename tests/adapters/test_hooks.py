"""adapters.hooks: a hook runs without a shell with its placeholders filled in, off the logging
thread; a failing, missing or hanging one is logged as hook_failed (the hanging one killed with
its children), secrets in its output are masked, and a reload's commands apply to the next
event."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
from pathlib import Path

import structlog
from structlog.testing import capture_logs

from supervisor import log as sup_log
from supervisor.adapters.hooks import EVENT_ENV, HookRunner, command_problem
from supervisor.testing.procs import alive


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "hook.py"
    path.write_text(body)
    return str(path)


def test_a_hook_gets_its_fields_filled_in_and_the_event_as_json(tmp_path, monkeypatch):
    out = tmp_path / "called.json"
    monkeypatch.setenv("OUT", str(out))
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")  # the supervisor's alone
    hook = script(
        tmp_path,
        "import json, os, sys\n"
        "json.dump({'argv': sys.argv[1:], 'event': json.loads(os.environ['" + EVENT_ENV + "']),"
        " 'notify': os.environ.get('NOTIFY_SOCKET')}, open(os.environ['OUT'], 'w'))\n",
    )
    runner = HookRunner(
        {"on_fatal": (sys.executable, hook, "{instance}", "kind={kind}", "{incident_file}")},
        instance="qwen",
        timeout_s=30.0,
    )
    with capture_logs() as logs:
        runner.sink({"event": "fatal", "exit_code": 6, "reason": "GPU 3 stuck"})
        runner.close()  # waits for the hook
    called = json.loads(out.read_text())
    assert called["argv"] == ["qwen", "kind=gpu_unrecoverable", ""]
    assert called["event"]["reason"] == "GPU 3 stuck"
    assert called["notify"] is None
    assert [e["event"] for e in logs] == ["hook_done"]


def test_a_failing_or_missing_hook_is_logged_and_the_next_one_still_runs(tmp_path):
    fails = script(tmp_path, "import sys\nprint('no route to pager')\nsys.exit(3)\n")
    runner = HookRunner(
        {"on_ready": (sys.executable, fails), "on_incident": (str(tmp_path / "missing"),)},
        instance="qwen",
        timeout_s=30.0,
    )
    with capture_logs() as logs:
        runner.sink({"event": "ready"})
        runner.sink({"event": "incident_written", "kind": "memory_kill", "path": "/x.json"})
        runner.close()
    failed = [e for e in logs if e["event"] == "hook_failed"]
    assert (failed[0]["hook"], failed[0]["exit_code"]) == ("on_ready", 3)
    assert "no route to pager" in failed[0]["output"]
    assert failed[1]["hook"] == "on_incident"
    assert "No such file" in failed[1]["error"]


def test_a_hook_past_its_timeout_is_killed_with_its_children(tmp_path, simulated_process_guard):
    """A plain child and a `setsid` one (both inherit the test's marker: the guard fails the
    test if either survives) die with the hook at its timeout."""
    pids = tmp_path / "pids"
    hangs = script(
        tmp_path,
        "import subprocess, sys, time\n"
        "sleep = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
        "plain = subprocess.Popen(sleep)\n"
        "own = subprocess.Popen(sleep, start_new_session=True)\n"
        f"open({str(pids)!r}, 'w').write(f'{{plain.pid}} {{own.pid}}')\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n",
    )
    runner = HookRunner({"on_ready": (sys.executable, hangs)}, instance="i", timeout_s=5.0)
    with capture_logs() as logs:
        runner.sink({"event": "ready"})
        runner.close()
    failed = next(e for e in logs if e["event"] == "hook_failed")
    assert "timed out after 5 s (killed)" in failed["error"]
    assert "started" in failed["output"]
    children = [int(pid) for pid in pids.read_text().split()]
    assert sorted(failed["killed_pids"]) == sorted(children)
    assert not [pid for pid in children if alive(pid)]


def test_what_a_hook_leaves_running_is_killed_when_it_ends(tmp_path):
    pids = tmp_path / "pids"
    command = ("sh", "-c", 'setsid sleep 60 & echo "$!" > "$0"; echo sent', str(pids))
    runner = HookRunner({"on_ready": command}, instance="i", timeout_s=30.0)
    with capture_logs() as logs:
        runner.sink({"event": "ready"})
        runner.close()
    done = next(e for e in logs if e["event"] == "hook_done")
    assert done["output"].strip() == "sent"
    assert done["killed_pids"] == [int(pids.read_text())]
    assert not alive(int(pids.read_text()))


def test_secrets_in_a_hook_s_output_are_masked_in_the_log(tmp_path):
    stream = io.StringIO()
    sup_log.configure_logging("json", "info", stream=stream)
    sup_log.register_secrets(["hf_hook_secret_value"])
    try:
        leaks = script(tmp_path, "print('token hf_hook_secret_value')\n")
        runner = HookRunner({"on_ready": (sys.executable, leaks)}, instance="i", timeout_s=30.0)
        runner.sink({"event": "ready"})
        runner.close()
    finally:
        sup_log.register_secrets(())
        structlog.reset_defaults()
    done = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert done[-1]["event"] == "hook_done"
    assert done[-1]["output"].strip() == "token ***"
    assert "hf_hook_secret_value" not in stream.getvalue()


def test_new_commands_apply_from_the_next_event(tmp_path):
    out = tmp_path / "out"
    runner = HookRunner({}, instance="i", timeout_s=30.0)
    with capture_logs() as logs:
        runner.sink({"event": "ready"})  # no hook yet: nothing runs
        runner.configure({"on_ready": (sys.executable, "-c", f"open({str(out)!r}, 'w')")}, 5.0)
        runner.sink({"event": "ready"})
        runner.close()
    assert out.exists()
    assert [e["event"] for e in logs] == ["hook_done"]
    assert runner.timeout_s == 5.0


def test_a_program_that_cannot_run_is_named(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("#!/bin/sh\n")
    assert command_problem("on_ready", ()) is None
    assert command_problem("on_ready", (sys.executable, "-V")) is None
    assert command_problem("on_ready", ("sh", "-c", "true")) is None
    assert "not found on PATH" in (command_problem("on_fatal", ("no-such-hook-xyz",)) or "")
    assert "not an executable file" in (command_problem("on_ready", (str(plain),)) or "")
    plain.chmod(plain.stat().st_mode | stat.S_IXUSR)
    assert command_problem("on_ready", (str(plain),)) is None
    assert os.access(plain, os.X_OK)
