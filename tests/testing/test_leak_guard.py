"""The suite's leak guard (tests/conftest.py) finds the processes a test would leave behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

from tests.conftest import _marked_processes
from tests.testing.support import MARKER_ENV

_TITLED_SLEEPER = (
    "import os, time; os.environ['SPT_NOENV'] = '1'; import setproctitle; "
    "setproctitle.setproctitle('sglang::scheduler_TP0'); print('titled', flush=True); "
    "time.sleep(60)"
)


def test_a_process_carrying_the_tests_marker_is_found_until_it_dies(simulated_process_guard):
    assert os.environ[MARKER_ENV] == simulated_process_guard
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert proc.pid in [p.pid for p in _marked_processes(simulated_process_guard)]
    finally:
        proc.kill()
        proc.wait()
    assert proc.pid not in [p.pid for p in _marked_processes(simulated_process_guard)]


def test_an_unmarked_child_titled_sglang_is_found_too(simulated_process_guard):
    env = {k: v for k, v in os.environ.items() if k != MARKER_ENV}
    proc = subprocess.Popen(
        [sys.executable, "-c", _TITLED_SLEEPER], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "titled"
        assert proc.pid in [p.pid for p in _marked_processes(simulated_process_guard)]
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_another_tests_marker_is_not_ours(simulated_process_guard):
    env = dict(os.environ, **{MARKER_ENV: "someone-else"})
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        assert proc.pid not in [p.pid for p in _marked_processes(simulated_process_guard)]
    finally:
        proc.kill()
        proc.wait()


_LEAKY_TEST = """
import subprocess, sys

def test_leaks():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print("LEAKED", proc.pid)
"""


def test_a_test_that_leaves_a_process_fails_and_the_process_is_killed(tmp_path):
    test_file = tmp_path / "test_leaky.py"
    test_file.write_text(_LEAKY_TEST)
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            "-s",
            "-q",
            str(test_file),
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stdout
    assert "test left simulated processes alive" in result.stdout
    leaked_pid = int(result.stdout.split("LEAKED", 1)[1].split()[0])
    assert not psutil.pid_exists(leaked_pid) or psutil.Process(leaked_pid).status() == "zombie"
