"""Secrets in the shapes an operator writes them: a `--token` and a URL's password in the GPU
reset command, a `--password` and a `--client-secret=` in a hook, SGLang's
`--ssl-keyfile-password`. The commands echo what they were called with, as chatty tools do.
Each output that once showed one is checked on its own, over two real runs (a reset that works
and one that fails, exit 6) and a dry run; nothing any of them wrote holds one."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from supervisor.testing import gpu_state, shm
from tests.e2e.run_support import ROOT, SERVER_COMMAND, Supervisor, write_config
from tests.faults.support import SECRETS, SERVER_ARGS, assert_invariants, faulted, stop
from tests.testing.support import MARKER_ENV, fake_server_env, remove_recorded_shm

pytestmark = pytest.mark.slow

TOKEN = "rt-reset-token-4242"  # reset_command --token
URL_PASSWORD = "url-pw-8686aa"  # reset_command's endpoint https://ops:URL_PASSWORD@...
HOOK_PASSWORD = "hook-pw-5151bb"  # a hook's --password
HOOK_SECRET = "hook-secret-777cc"  # a hook's --client-secret=
SSL_PASSWORD = "ssl-keyfile-pw-3131"  # SGLang's --ssl-keyfile-password
SHAPED = (TOKEN, URL_PASSWORD, HOOK_PASSWORD, HOOK_SECRET, SSL_PASSWORD)
EVERY_SECRET = (*SECRETS, *SHAPED)

# A tool that says what it was called with, then resets the GPU (fake_gpu_reset) or fails.
TOOL = r"""
import sys
mode, args = sys.argv[1], sys.argv[2:]
print("called with", " ".join(args), flush=True)
if "--password" in args:
    print("logged in with", args[args.index("--password") + 1], flush=True)
if mode == "reset":
    from supervisor.testing.fake_gpu_reset import main
    sys.exit(main([args[-1]]))
sys.exit(1 if mode == "fail" else 0)
"""


@dataclass
class Finished:
    """What one run left: its log's events, its state files, and how it ended."""

    exit_code: int
    log_text: str
    events: list[dict[str, Any]]
    state_dir: Path
    root: Path
    files: dict[str, bytes] = field(default_factory=dict)

    def named(self, name: str) -> list[dict[str, Any]]:
        found = [e for e in self.events if e.get("event") == name]
        assert found, f"no {name} event (last: {self.log_text[-1500:]})"
        return found

    def state_file(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state_dir / name).read_text())
        return data


def assert_masked(text: str, *, shown: str = "***") -> None:
    assert shown in text, text
    for secret in EVERY_SECRET:
        assert secret not in text, f"{secret!r} in {text!r}"


def tool_command(tool: Path, mode: str, *args: str) -> list[str]:
    return [sys.executable, str(tool), mode, *args]


def reset_command(tool: Path, mode: str) -> str:
    endpoint = f"https://ops:{URL_PASSWORD}@hv.local/reset"
    return shlex.join(tool_command(tool, mode, "--token", TOKEN, "--endpoint", endpoint, "{index}"))


def hook_command(tool: Path) -> list[str]:
    return tool_command(
        tool, "hook", "--password", HOOK_PASSWORD, f"--client-secret={HOOK_SECRET}", "{kind}"
    )


@contextlib.contextmanager
def isolated(root: Path) -> Iterator[tuple[str, Path]]:
    """A marker and a /dev/shm record of this module's own (the per-test ones are not set up
    yet when a module fixture runs); every marked process gone and the record cleaned after."""
    marker = uuid.uuid4().hex
    fd, name = tempfile.mkstemp(prefix="fake-sglang-shm-", suffix=".txt")
    os.close(fd)
    record = Path(name)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(MARKER_ENV, marker)
        patch.setenv(shm.RECORD_ENV, str(record))
        try:
            yield marker, record
        finally:
            remove_recorded_shm(record)
            record.unlink(missing_ok=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def finish(sup: Supervisor, exit_code: int, root: Path, record: Path) -> Finished:
    # Nothing left behind; the secrets are each test's own subject.
    assert_invariants(root, sup, record, secrets=())
    files = {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file() and p.suffix != ".toml"}
    return Finished(exit_code, sup.log_text(), sup.events(), sup.state_dir, root, files)


def kill_rank(sup: Supervisor) -> None:
    sup.wait_event("ready")
    os.kill(sup.schedulers()["sglang::scheduler_TP1"], signal.SIGKILL)


def run_with_reset(root: Path, mode: str, hooks: dict[str, list[str]]) -> Finished:
    """A rank killed while its GPU memory stays held: the reset command runs (`mode`)."""
    tool = root / "tool.py"
    tool.write_text(TOOL)
    gpus = root / "gpus"
    gpu_state.create_gpus(gpus, 2)
    overrides: dict[str, dict[str, Any]] = {
        "gpu": {"reset_command": reset_command(tool, mode), "release_timeout": "1s"},
        "hooks": hooks,
    }
    with isolated(root) as (marker, record):
        with faulted(
            root,
            free_port(),
            marker,
            scenario={"gpu_stuck": True},
            overrides=overrides,
            gpus=gpus,
            server_args=(*SERVER_ARGS, "--ssl-keyfile-password", SSL_PASSWORD),
        ) as sup:
            kill_rank(sup)
            if mode == "reset":
                sup.wait_event("ready", count=2, timeout_s=60)
                sup.wait_event("hook_done", count=2)  # on_ready, after each launch
                stop(sup)
                code = 0
            else:
                code = sup.wait_exit(timeout_s=60)
        return finish(sup, code, root, record)


@pytest.fixture(scope="module")
def reset_ok(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    root = tmp_path_factory.mktemp("reset-ok")
    return run_with_reset(root, "reset", {"on_ready": hook_command(root / "tool.py")})


@pytest.fixture(scope="module")
def reset_fails(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    root = tmp_path_factory.mktemp("reset-fails")
    hook = hook_command(root / "tool.py")
    finished = run_with_reset(root, "fail", {"on_fatal": hook, "on_incident": hook})
    assert finished.exit_code == 6, finished.log_text[-2000:]
    return finished


# -- the reset command -----------------------------------------------------------------------


def test_gpu_reset_done_detail(reset_ok: Finished):
    (done, *_) = reset_ok.named("gpu_reset_done")
    assert_masked(done["detail"], shown="--token ***")


def test_gpu_reset_failed_detail(reset_fails: Finished):
    (failed, *_) = reset_fails.named("gpu_reset_failed")
    assert_masked(failed["detail"], shown="--token ***")
    assert "https://ops:***@hv.local/reset" in failed["detail"]


def test_gpu_release_failed_reason(reset_fails: Finished):
    (failed, *_) = reset_fails.named("gpu_release_failed")
    assert_masked(failed["reason"], shown="--token ***")


def test_fatal_reason(reset_fails: Finished):
    fatal = reset_fails.named("fatal")[-1]
    assert fatal["exit_code"] == 6
    assert_masked(fatal["reason"], shown="--token ***")


def test_incident_written_summary(reset_fails: Finished):
    (written, *_) = reset_fails.named("incident_written")
    assert_masked(written["summary"], shown="--token ***")


def test_the_incident_file(reset_fails: Finished):
    path = Path(reset_fails.named("incident_written")[0]["path"])
    assert_masked(path.read_text())


def test_state_json_last_failure_hint(reset_fails: Finished):
    hint = reset_fails.state_file("state.json")["last_failure_hint"]
    assert_masked(hint, shown="--token ***")


def test_status_json(reset_fails: Finished):
    assert_masked(json.dumps(reset_fails.state_file("status.json")))


# -- the hooks -------------------------------------------------------------------------------


def test_hook_done_command(reset_ok: Finished):
    for done in reset_ok.named("hook_done"):
        assert_masked(done["command"], shown="--password *** --client-secret=***")


def test_hook_done_output(reset_ok: Finished):
    """The hook echoes its password alone too: masked as a known secret, not by its shape."""
    for done in reset_ok.named("hook_done"):
        assert_masked(done["output"], shown="logged in with ***")


def test_hook_done_after_a_fatal_and_an_incident(reset_fails: Finished):
    hooks = {e["hook"] for e in reset_fails.named("hook_done")}
    assert hooks == {"on_fatal", "on_incident"}
    for done in reset_fails.named("hook_done"):
        assert_masked(done["command"] + done["output"])


# -- SGLang's --ssl-keyfile-password -------------------------------------------------------------


def test_ssl_keyfile_password_in_the_settings_event(reset_ok: Finished):
    (settings,) = reset_ok.named("settings")
    assert_masked(json.dumps(settings["server_args"]), shown='"--ssl-keyfile-password", "***"')


def test_ssl_keyfile_password_in_the_launching_events(reset_ok: Finished):
    for launching in reset_ok.named("launching"):
        assert_masked(json.dumps(launching["argv"]), shown='"--ssl-keyfile-password", "***"')


def test_ssl_keyfile_password_in_the_status_and_the_incident(reset_fails: Finished):
    assert_masked(json.dumps(reset_fails.state_file("status.json")))
    for incident in reset_fails.state_dir.glob("incident-*.json"):
        assert_masked(incident.read_text())


def test_no_file_either_run_wrote_holds_a_secret(reset_ok: Finished, reset_fails: Finished):
    for finished in (reset_ok, reset_fails):
        assert finished.files
        for path, data in finished.files.items():
            for secret in EVERY_SECRET:
                assert secret.encode() not in data, f"{secret!r} in {path}"


# -- run --dry-run ---------------------------------------------------------------------------


def test_run_dry_run(tmp_path: Path):
    tool = tmp_path / "tool.py"
    overrides: dict[str, dict[str, Any]] = {
        "gpu": {"reset_command": reset_command(tool, "reset")},
        "hooks": {"on_fatal": hook_command(tool), "on_ready": hook_command(tool)},
    }
    config = write_config(tmp_path, tmp_path / "state", overrides)
    argv = [sys.executable, "-m", "supervisor", "run", "--config", str(config), "--dry-run"]
    argv += ["--server-command", SERVER_COMMAND, "--", "--model-path", "fake/model", "--tp", "2"]
    argv += ["--api-key", SECRETS[0], "--ssl-keyfile-password", SSL_PASSWORD]
    for log_format in ("console", "json"):
        done = subprocess.run(
            [*argv[:6], "--log-format", log_format, *argv[6:]],
            env=fake_server_env(None),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert_masked(done.stdout + done.stderr)
        assert "--ssl-keyfile-password" in done.stdout  # the flags are shown, their values not
        assert "--client-secret=***" in done.stdout
