"""`sglang-supervisor run` end to end against the simulated server: ready, stop, SIGKILL of the
supervisor, escapees, leftovers of an earlier run, secrets."""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

import pytest
import requests

from tests.e2e.run_support import CONTAINMENT, expected_cgroup_mode, marked_pids, supervisor
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def test_ready_sends_ready_1_and_sigterm_stops_everything_with_exit_0(
    tmp_path, free_port, simulated_process_guard
):
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        notify=True,
        server_args=("--tp", "2", "--api-key", "sk-e2e-api-key-123"),
        env={"WATCHDOG_USEC": "1000000"},
    ) as sup:
        sup.wait_event("ready")
        wait_until(
            lambda: any("READY=1" in d for d in sup.received()),
            timeout_s=10,
            what="READY=1 datagram",
        )
        ready = next(d for d in sup.received() if "READY=1" in d)
        assert "STATUS=ready" in ready
        before_ready = sup.received()[: sup.received().index(ready)]
        assert any(d.startswith("EXTEND_TIMEOUT_USEC=") for d in before_ready)
        assert any(d.startswith("STATUS=loading") for d in before_ready)
        wait_until(lambda: "WATCHDOG=1" in sup.received(), timeout_s=10, what="WATCHDOG=1")
        assert set(sup.schedulers()) == {"sglang::scheduler_TP0", "sglang::scheduler_TP1"}
        mode = sup.events("server_launched")[0]["mode"]
        assert mode == ("/proc" if CONTAINMENT == "off" else expected_cgroup_mode())
        state = sup.state()
        assert state["run_id"] == sup.events("ready")[0]["run_id"]
        assert {p["pid"] for p in state["server_pids"]} >= set(sup.schedulers().values())

        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
        assert sup.tree() == []
        assert any(d.startswith("STOPPING=1") for d in sup.received())
        names = [e["event"] for e in sup.events() if e["event"] != "server_output"]
        for expected in ("settings", "launching", "loading", "ready", "stopping", "stopped"):
            assert expected in names
        # Secrets never reach the log or the state file; SGLang prints the api key in clear.
        assert "'api_key': '***'" in sup.log_text()
        for text in (sup.log_text(), (sup.state_dir / "state.json").read_text()):
            assert "sk-e2e-api-key-123" not in text
            assert "hf_e2e_secret_token" not in text
        assert sup.events("settings")[0]["server_env"] == {"HF_TOKEN": "***"}


def test_a_request_in_flight_when_run_gets_sigterm_completes_with_200(
    tmp_path, free_port, simulated_process_guard
):
    """The stop drains: SIGTERM reaches SGLang's main process only, which finishes the request
    before it exits; its schedulers are never signalled, so nothing is seen as a crash."""
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario={"request_s": 4.0},
        server_args=("--tp", "2", "--enable-metrics"),
    ) as sup:
        sup.wait_event("ready")
        base = f"http://127.0.0.1:{free_port}"
        answers: list[object] = []

        def ask() -> None:
            try:
                answers.append(requests.post(f"{base}/generate", json={}, timeout=30).status_code)
            except requests.RequestException as exc:  # the request was lost
                answers.append(repr(exc))

        def in_flight() -> bool:
            metrics = requests.get(f"{base}/metrics", timeout=5).text
            return re.search(r"sglang:num_running_reqs\{[^}]*\} 1\b", metrics) is not None

        client = threading.Thread(target=ask)
        client.start()
        wait_until(in_flight, timeout_s=10, what="the request in flight")
        sup.signal(signal.SIGTERM)
        client.join(timeout=30)
        assert answers == [200]
        assert sup.wait_exit() == 0
        assert sup.tree() == []
        output = [e["line"] for e in sup.events("server_output")]
        assert any("Draining requests and shutting down" in line for line in output)
        assert any("Remaining number of requests 1" in line for line in output)
        assert not any("crashed with exit code" in line for line in output)
        assert sup.events("server_failed") == []


def test_sigterm_while_loading_exits_0_and_leaves_nothing(
    tmp_path, free_port, simulated_process_guard
):
    with supervisor(
        tmp_path, free_port, simulated_process_guard, scenario={"startup_s": 60}
    ) as sup:
        sup.wait_event("loading")
        wait_until(lambda: len(sup.schedulers()) == 2, timeout_s=20, what="ranks spawned")
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
        assert sup.tree() == []
        assert not sup.events("ready")


def test_sigkill_of_the_supervisor_takes_the_tree_down_and_the_next_start_cleans_up(
    tmp_path, free_port, simulated_process_guard
):
    """PDEATHSIG takes the tree; tokenizer workers have none (SGLang), and multiprocessing's
    resource tracker lives as long as they hold its pipe, so they stay in the server cgroup
    until the next start of the instance kills them and, at its stop, removes the groups (the
    harness checks that none is left)."""
    args = ("--tp", "2", "--tokenizer-worker-num", "2")
    with supervisor(tmp_path, free_port, simulated_process_guard, server_args=args) as sup:
        sup.wait_event("ready")
        assert len(sup.tree()) >= 3
        # Ready comes with the first worker warm; the second may still be starting (a spawn
        # child that dies with its parent before it has a title), as in uvicorn.
        wait_until(
            lambda: (
                sum(t.startswith("sglang::tokenizer_worker") for t in _titles(sup.tree()).values())
                == 2
            ),
            timeout_s=30,
            what="both tokenizer workers up",
        )
        sup.signal(signal.SIGKILL)
        sup.wait_exit()

        def only_survivors_left() -> dict[int, str] | None:
            left = _titles(sup.tree())
            others = [t for t in left.values() if not _survives_pdeathsig(t)]
            return left if left and not others else None

        survivors = wait_until(only_survivors_left, timeout_s=5, what="the rest of the tree gone")
        assert survivors is not None
        assert sum(t.startswith("sglang::tokenizer_worker") for t in survivors.values()) == 2
        with supervisor(tmp_path, free_port, simulated_process_guard) as again:
            again.wait_event("ready")
            cleaned = again.events("cgroup_leftovers_killed") + again.events("leftovers_killed")
            assert cleaned, "the workers the first supervisor left were not cleaned"
            assert not any(_alive(p) for p in survivors)
            again.signal(signal.SIGTERM)
            assert again.wait_exit() == 0


@pytest.mark.parametrize("kind", ["setsid", "double_fork"])
def test_escapees_of_the_group_are_found_and_killed_at_stop(
    tmp_path, free_port, simulated_process_guard, kind
):
    scenario = {"orphan": {"kind": kind, "after_s": 0.0, "lifetime_s": 600}}
    with supervisor(tmp_path, free_port, simulated_process_guard, scenario=scenario) as sup:
        sup.wait_event("ready")
        pgids = wait_until(
            lambda: g if len(g := {_pgid(p) for p in sup.tree()} - {None}) >= 2 else None,
            timeout_s=20,
            what="an orphan outside the server's process group",
        )
        assert pgids is not None
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
        assert sup.tree() == []


def test_a_leftover_of_an_earlier_run_is_killed_before_the_new_launch(
    tmp_path, free_port, simulated_process_guard
):
    state_dir = tmp_path / "shared-state"
    scenario = {"orphan": {"kind": "setsid", "after_s": 0.0, "lifetime_s": 600}}
    marker = simulated_process_guard
    with supervisor(tmp_path, free_port, marker, scenario=scenario, state_dir=state_dir) as first:
        first.wait_event("ready")
        wait_until(
            lambda: len({_pgid(p) for p in first.tree()} - {None}) >= 2,
            timeout_s=20,
            what="the orphan",
        )
        first.signal(signal.SIGKILL)
        first.wait_exit()
        # The server tree follows the supervisor (PDEATHSIG); the escapee does not.
        leftover = wait_until(
            lambda: t if len(t := first.tree()) == 1 else None,
            timeout_s=10,
            what="only the escapee left",
        )
        assert leftover is not None
        with supervisor(tmp_path, free_port, marker, state_dir=state_dir) as second:
            # In a cgroup the escapee is still in our server group and is killed with it as the
            # containment starts (dead before the scan for leftovers); in /proc mode the scan
            # finds it by its marker and kills it.
            contained = second.wait_event("containment")["mode"] != "/proc"
            found, killed = (
                ("cgroup_leftovers_killed",) * 2
                if contained
                else ("leftovers_found", "leftovers_killed")
            )
            assert leftover[0] in second.wait_event(found)["pids"]
            second.wait_event("ready")
            assert leftover[0] not in marked_pids(marker)
            events = [e["event"] for e in second.events()]
            assert events.index(killed) < events.index("launching")
            if contained:
                assert "leftovers_found" not in events  # dead already: nothing more to find
            second.signal(signal.SIGTERM)
            assert second.wait_exit() == 0


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_a_server_ignoring_sigterm_is_killed_after_the_grace_or_at_a_second_signal(
    tmp_path, free_port, simulated_process_guard
):
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario={"ignore_sigterm": True},
        options=("--stop-grace", "1s"),
    ) as sup:
        sup.wait_event("ready")
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
        assert sup.tree() == []
        assert not sup.events("stop_escalated")
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario={"ignore_sigterm": True},
        options=("--stop-grace", "60s"),
    ) as sup:
        sup.wait_event("ready")
        sup.signal(signal.SIGTERM)
        sup.wait_event("stopping")
        sup.signal(signal.SIGINT)
        assert sup.wait_exit(timeout_s=20) == 0
        assert sup.events("stop_escalated")[0]["signal"] == "SIGINT"
        assert sup.tree() == []


def _titles(pids: list[int]) -> dict[int, str]:
    out = {}
    for pid in pids:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        out[pid] = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _survives_pdeathsig(title: str) -> bool:
    return title.startswith("sglang::tokenizer_worker") or "resource_tracker" in title
