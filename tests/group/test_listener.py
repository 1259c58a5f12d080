"""The one listener in group mode (supervisor/run/metrics.py): always on, on the pod's IP when
`[http] listen` is empty, fatal when it cannot bind; /healthz and /readyz on every run that has a
listener, and the group's endpoints on the leader's."""

from __future__ import annotations

import dataclasses
import io
import socket
from pathlib import Path

import pytest
import requests
import structlog

from supervisor import log as sup_log
from supervisor.config import RunSettings
from supervisor.config.metrics_sections import HttpConfig
from supervisor.errors import ConfigError
from supervisor.group.board import GroupBoard
from supervisor.group.setup import leader_url, listen_address
from supervisor.run.metrics import serve_metrics
from tests.group.support import TOKEN, spec
from tests.run.runner_support import settings


def with_listener(tmp_path: Path, listen: str, *, group: bool) -> RunSettings:
    base = settings(tmp_path)
    config = dataclasses.replace(base.config, http=HttpConfig(listen=listen))
    return dataclasses.replace(base, config=config, group=spec(2, 0) if group else None)


@pytest.mark.parametrize(
    ("listen", "group", "env", "address"),
    [
        ("", False, {"POD_IP": "10.0.0.7"}, None),
        ("", True, {"POD_IP": "10.0.0.7"}, ("10.0.0.7", 9400)),
        ("", True, {"POD_IP": "fd00::7"}, ("fd00::7", 9400)),
        ("", True, {}, ("0.0.0.0", 9400)),
        ("127.0.0.1:9555", True, {"POD_IP": "10.0.0.7"}, ("127.0.0.1", 9555)),
        ("127.0.0.1:9555", False, {}, ("127.0.0.1", 9555)),
    ],
)
def test_where_the_listener_binds(listen, group, env, address):
    assert listen_address(HttpConfig(listen=listen), spec() if group else None, env) == address


def test_a_worker_reports_to_the_leaders_port_or_its_own():
    base = with_listener(Path("/nonexistent"), "127.0.0.1:9555", group=True).config
    worker = spec(2, 1)
    assert leader_url(worker, base, {}) == "http://127.0.0.1:9555/group/report"
    other = dataclasses.replace(base, group=dataclasses.replace(base.group, leader_port=9600))
    assert leader_url(worker, other, {}) == "http://127.0.0.1:9600/group/report"
    pod = dataclasses.replace(base, http=HttpConfig())
    assert leader_url(worker, pod, {"POD_IP": "10.0.0.9"}) == "http://127.0.0.1:9400/group/report"


def test_a_port_in_use_is_fatal_in_group_mode(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = with_listener(tmp_path, f"127.0.0.1:{port}", group=True)
        with pytest.raises(ConfigError) as err, serve_metrics(run):
            pass
    assert err.value.exit_code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in str(err.value)
    assert "group mode needs the supervisor's listener" in str(err.value)


@pytest.fixture
def tapped():
    """The log configured as `run` does: its events reach the sinks."""
    sup_log.configure_logging("json", "info", stream=io.StringIO())
    yield
    structlog.reset_defaults()


def test_one_box_serves_the_probes_beside_the_metrics(tmp_path, free_port, tapped):
    run = with_listener(tmp_path, f"127.0.0.1:{free_port}", group=False)
    base = f"http://127.0.0.1:{free_port}"
    with serve_metrics(run):
        assert requests.get(f"{base}/healthz", timeout=10).json()["live"] is True
        assert requests.get(f"{base}/readyz", timeout=10).status_code == 503
        structlog.get_logger("test").info("launching")
        structlog.get_logger("test").info("ready")
        assert requests.get(f"{base}/readyz", timeout=10).json()["ready"] is True
        assert requests.get(f"{base}/metrics", timeout=10).status_code == 200
        assert requests.post(f"{base}/group/report", timeout=10).status_code == 404


def test_the_leaders_listener_serves_the_group(tmp_path, free_port):
    run = with_listener(tmp_path, f"127.0.0.1:{free_port}", group=True)
    board = GroupBoard(2, TOKEN)
    base = f"http://127.0.0.1:{free_port}"
    with serve_metrics(run, board):
        auth = {"Authorization": f"Bearer {TOKEN}"}
        status = requests.get(f"{base}/group/status", headers=auth, timeout=10)
        assert status.json()["missing"] == [0, 1]
        ready = requests.get(f"{base}/readyz", timeout=10).json()
        assert ready["reason"] == "the group has not decided to launch yet"
        assert ready["ready"] is False
