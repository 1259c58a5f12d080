"""Faults of the configuration and of the network port: every one is refused with its exit
code, naming the problem, before anything is launched (or, for a port taken while the server
was down, recovered once the port is free); none leaves anything behind."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.faults.support import assert_invariants, faulted, recovered, refused
from tests.testing.support import stranger_on

pytestmark = pytest.mark.slow


def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo.toml"
    os.mkfifo(path)
    return path


def latin1(tmp_path: Path) -> Path:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[run]\nname = "caf\xe9"\n')
    return path


CONFIG_FAULTS: dict[str, dict[str, Any]] = {
    "health path answering 404": {
        "options": ("--health-path", "/no-such-path"),
        "code": 2,
        "reason": "answers 404 on the health path",
    },
    "a bare number as a size": {
        "overrides": {"preflight": {"reserve": 445}},
        "code": 2,
        "reason": "445 has no unit",
    },
    "GPU memory of 0": {
        "overrides": {"host": {"gpu_memory": "0GB"}},
        "code": 2,
        "reason": "gpu_memory",
    },
    "a TP the heads cannot be split over": {
        "server_args": ("--tp", "3"),
        "options": ("--auto-size",),  # which cannot fix it, and must not hide it
        "code": 1,
        "reason": "attention_heads failed",
    },
}


@pytest.mark.parametrize("name", list(CONFIG_FAULTS))
def test_a_config_fault_is_refused_naming_it(
    name: str, tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    fault = CONFIG_FAULTS[name]
    kwargs = {k: fault[k] for k in ("options", "overrides", "server_args") if k in fault}
    with faulted(tmp_path, free_port, simulated_process_guard, **kwargs) as sup:
        refused(sup, fault["code"], fault["reason"])
        if fault["code"] != 2 or "404" not in fault["reason"]:
            assert sup.events("launching") == [], "refused before any launch"
    assert_invariants(tmp_path, sup, shm_record)


@pytest.mark.parametrize(("make", "reason"), [(fifo, "a FIFO"), (latin1, "is not UTF-8")])
def test_a_config_file_that_cannot_be_read_as_toml_is_exit_2(
    make, reason, tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    config = make(tmp_path)  # the last --config given wins
    with faulted(
        tmp_path, free_port, simulated_process_guard, options=("--config", str(config))
    ) as sup:
        refused(sup, 2, reason, timeout_s=30)
    assert_invariants(tmp_path, sup, shm_record)


def test_a_misspelt_option_before_the_double_dash_is_exit_2_never_an_sglang_flag(
    tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    with faulted(
        tmp_path, free_port, simulated_process_guard, options=("--helth-interval", "1s")
    ) as sup:
        assert sup.wait_exit() == 2
        assert "No such option '--helth-interval'" in sup.log_text()
        assert "--health-interval" in sup.log_text()
    assert_invariants(tmp_path, sup, shm_record)


@contextmanager
def taken(port: int) -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen(1)
        yield holder


def test_a_port_in_use_at_start_is_refused_naming_the_port_even_with_auto_size(
    tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    with (
        taken(free_port),
        faulted(tmp_path, free_port, simulated_process_guard, options=("--auto-size",)) as sup,
    ):
        fatal = refused(sup, 1, "port failed")
        assert "a smaller --hicache-size cannot fix port" in fatal["reason"]
        assert sup.events("auto_sized") == []
    assert_invariants(tmp_path, sup, shm_record)


def test_a_port_taken_while_the_server_is_down_is_retried_until_it_is_free(
    tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    """Between a death and the relaunch someone binds the port: the relaunch fails (uvicorn
    cannot bind its port; the holder never answers, so SGLang's warm-up gives up, here after
    one try, and kills its tree) and is retried; once the port is free, it comes back."""
    run = {"backoff_initial": "2s", "backoff_max": "2s", "max_restarts": 20}
    with faulted(
        tmp_path,
        free_port,
        simulated_process_guard,
        overrides={"run": run},
        scenario={"warmup_tries": 1},
    ) as sup:
        sup.wait_event("ready")
        os.kill(sup.schedulers()["sglang::scheduler_TP1"], signal.SIGKILL)
        sup.wait_event("restarting")  # the tree is gone: the port is free for 2 s
        with taken(free_port):
            sup.wait_event("server_failed", count=2)
            assert "address already in use" in sup.log_text()
        recovered(sup, ready_count=2)
    assert_invariants(tmp_path, sup, shm_record)


def test_a_foreign_server_answering_on_the_port_is_never_taken_for_ready(
    tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    """After the pre-flight found the port free, another server takes it and answers /health
    200 while ours loads: the socket that answers is not the tree's, so the launch is never
    ready; it ends as port_in_use naming the holder (this test's process), twice, exit 4."""
    with faulted(tmp_path, free_port, simulated_process_guard, scenario={"startup_s": 5.0}) as sup:
        sup.wait_event("launching")
        with stranger_on(free_port) as seen:
            fatal = refused(sup, 4, "port_in_use")
        assert "GET /health" in seen
        assert sup.events("ready") == []
        foreign = sup.events("foreign_listener")
        assert foreign, sup.log_text()[-2000:]
        assert foreign[0]["holder_pid"] == os.getpid()
        assert f"127.0.0.1:{free_port}" in foreign[0]["detail"]
        failed = sup.events("server_failed")
        assert [e["failure"] for e in failed] == ["port_in_use", "port_in_use"]
        assert "port is taken by another process" in failed[0]["hint"]
        unhealthy = sup.events("unhealthy")[0]
        assert unhealthy["cause"] == "port_in_use"
        assert f"pid {os.getpid()}" in unhealthy["detail"]
        assert fatal["exit_code"] == 4
    assert_invariants(tmp_path, sup, shm_record)
