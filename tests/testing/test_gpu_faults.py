"""Sick simulated GPUs from outside: `fake_gpu inject`, the reset's rules (nvidia-smi -r), NVLink
peer sets, and the scenario's `gpu_fault` on a serving rank."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pynvml
import pytest

from supervisor.testing import gpu_events, gpu_faults, gpu_state
from supervisor.testing.fake_gpu_reset import EXIT_GPU_LOST, EXIT_OK, EXIT_OTHER, reset
from tests.testing.support import fake_gpu, run_gpu_tool
from tests.waiting import wait_until


@pytest.fixture
def peers(make_gpu_state) -> Path:
    """Four GPUs in two NVLink pairs (0-1, 2-3) that must be reset pair by pair."""
    made: Path = make_gpu_state(4, nvlink_peers=2, per_gpu_reset=False)
    return made


def test_a_reset_repairs_what_a_reset_repairs_and_keeps_the_rest(gpu_state_dir):
    for fault in ("remap-pending", "remap-failed", "retired-pending", "reset-required", "dbe"):
        gpu_faults.inject(gpu_state_dir, 5, fault)
    gpu_faults.inject(gpu_state_dir, 5, "recovery-action", "gpu-reset")
    gpu_faults.inject(gpu_state_dir, 5, "persistence-off")
    assert reset(gpu_state_dir, "5")[0] == EXIT_OK
    health = gpu_faults.read_health(gpu_state_dir, 5)
    assert health.remapped_rows == (0, 1, 0, 1)  # the remap took effect; a failed one stays
    assert not health.retired_pages_pending
    assert not health.reset_required
    assert health.ecc == {"volatile": (0, 0), "aggregate": (0, 1)}
    assert health.recovery_action == pynvml.NVML_GPU_RECOVERY_ACTION_NONE
    assert not health.persistence  # a setting, not a fault a reset clears
    assert health.faults() == ["remap-failed", "persistence-off"]


@pytest.mark.parametrize("how", ["xid 79", "lost"])
def test_a_lost_gpu_cannot_be_reset_and_nothing_is_reset(gpu_state_dir, how):
    fault, *value = how.split()
    gpu_faults.inject(gpu_state_dir, 1, fault, *value)
    gpu_faults.inject(gpu_state_dir, 0, "remap-pending")
    code, message = reset(gpu_state_dir, "0,1")
    assert code == EXIT_GPU_LOST
    assert "GPU is lost.  Reboot the system to recover this GPU" in message
    assert "00000000:28:00.0" in message
    assert gpu_faults.read_health(gpu_state_dir, 0).remapped_rows[2] == 1  # all or nothing


def test_nvlink_peers_without_per_gpu_reset_must_be_reset_together(peers):
    gpu_faults.inject(peers, 0, "remap-pending")
    code, message = reset(peers, "0")
    assert code == EXIT_OTHER
    assert "GPU 00000000:28:00.0 (index 1)" in message  # the missing peer, named
    assert "reset 0,1 together" in message
    assert gpu_faults.read_health(peers, 0).remapped_rows[2] == 1
    assert gpu_state.peer_set(peers, 0) == (0, 1)
    assert reset(peers, ["0", "1"]) == (
        EXIT_OK,
        "GPU 00000000:18:00.0 was successfully reset.\n"
        "GPU 00000000:28:00.0 was successfully reset.\nAll done.",
    )
    assert gpu_faults.read_health(peers, 0).remapped_rows[2] == 0
    alias = run_gpu_tool("supervisor.testing.fake_gpu_reset", "-r", "-i", "3,2", state_dir=peers)
    assert alias.returncode == EXIT_OK, alias.stdout
    cli = fake_gpu("reset", "2", "3", "--dir", str(peers))
    assert (cli.returncode, cli.stdout) == (EXIT_OK, alias.stdout)


def test_nvlink_peers_with_per_gpu_reset_reset_one_by_one(make_gpu_state):
    state = make_gpu_state(4, nvlink_peers=4)
    assert gpu_state.peer_set(state, 2) == (2,)
    assert reset(state, "2")[0] == EXIT_OK


def test_a_process_on_any_gpu_of_the_set_refuses_the_whole_reset(peers):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        gpu_state.register_holder(peers, 1, 1 << 30, pid=holder.pid)
        gpu_faults.inject(peers, 0, "remap-pending")
        code, message = reset(peers, "0,1")
        assert code == EXIT_OTHER
        assert "GPU 00000000:28:00.0: In use by another client" in message
        assert gpu_faults.read_health(peers, 0).remapped_rows[2] == 1
    finally:
        holder.kill()
        holder.wait()


def test_create_makes_nvlink_groups_and_list_shows_them_with_faults(tmp_path):
    state = tmp_path / "gpus"
    made = fake_gpu(
        "create", "4", "--dir", str(state), "--nvlink-peers", "2", "--reset-peers-together"
    )
    assert made.returncode == 0, made.stderr
    assert [(g.nvlink_group, g.per_gpu_reset) for g in gpu_state.read_gpus(state)] == [
        (0, False),
        (0, False),
        (1, False),
        (1, False),
    ]
    assert "    NVLink group 1 (reset together)\n" in made.stdout
    gpu_faults.inject(state, 3, "remap-pending")
    listed = fake_gpu("list", "--dir", str(state))
    assert "    faults: remap-pending\n" in listed.stdout
    remade = fake_gpu("create", "4", "--dir", str(state))  # replaced GPUs are healthy
    assert remade.returncode == 0
    assert gpu_faults.read_health(state, 3) == gpu_faults.SimHealth()


@pytest.mark.parametrize(
    ("args", "says", "check"),
    [
        (["xid", "79", "--gpu", "2"], "GPU 2: lost", lambda h: h.lost),
        (["xid", "48", "0"], "GPU 0: dbe 1, recovery-action gpu-reset", lambda h: h.ecc),
        (["remap-pending", "1"], "GPU 1: remap-pending", lambda h: h.remapped_rows[2]),
        (["recovery-action", "reboot", "1"], "GPU 1: recovery-action node-reboot", lambda h: True),
        (
            ["unsupported", "nvmlDeviceGetRemappedRows", "1"],
            "GPU 1: unsupported nvmlDeviceGetRemappedRows",
            lambda h: h.unsupported == ("nvmlDeviceGetRemappedRows",),
        ),
        (["fabric-incomplete", "--gpu", "3"], "GPU 3: fabric-incomplete", lambda h: True),
    ],
)
def test_inject_puts_the_fault_on_the_gpu(gpu_state_dir, args, says, check):
    result = fake_gpu("inject", *args, state_dir=gpu_state_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(says)
    gpu = int(result.stdout.split(":")[0].removeprefix("GPU "))
    assert check(gpu_faults.read_health(gpu_state_dir, gpu))
    cleared = fake_gpu("inject", "clear", str(gpu), state_dir=gpu_state_dir)
    assert cleared.stdout == f"GPU {gpu}: healthy\n"
    assert gpu_faults.read_health(gpu_state_dir, gpu) == gpu_faults.SimHealth()


def test_an_xid_injection_queues_exactly_one_event(gpu_state_dir):
    assert fake_gpu("inject", "xid", "79", "--gpu", "2", state_dir=gpu_state_dir).returncode == 0
    assert fake_gpu("inject", "remap-pending", "2", state_dir=gpu_state_dir).returncode == 0
    events = gpu_events.read_events(gpu_state_dir, 0)
    assert [(e.gpu_index, e.event_type, e.data) for e in events] == [
        (2, pynvml.nvmlEventTypeXidCriticalError, 79)
    ]


def test_inject_help_lists_every_fault(gpu_state_dir):
    helped = fake_gpu("inject", "--help")
    assert helped.returncode == 0
    for name, fault in gpu_faults.FAULTS.items():
        assert f"  {name} {fault.metavar or ''}".rstrip() in helped.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["bogus", "1"], "argument FAULT: invalid choice: 'bogus'"),
        (["xid", "--gpu", "1"], "xid: takes XID"),
        (["xid", "x", "1"], "xid: not an Xid number: 'x'"),
        (["lost"], "lost: name one GPU"),
        (["lost", "1", "--gpu", "2"], "lost: name one GPU"),
        (["lost", "1", "2"], "lost: name one GPU"),
        (["lost", "9"], "no GPU 9 in"),
        (["lost", "one"], "lost: GPU not an integer: 'one'"),
        (["lost", "--gpu", "-1"], "must be at least 0: -1"),
        (["recovery-action", "panic", "1"], "unknown action 'panic'; one of none, gpu-reset"),
        (["unsupported", "nvmlFoo", "1"], "'nvmlFoo' is not a pynvml per-device call"),
        (["lost", "1", "--dir", "{d}/missing"], "does not exist; create simulated GPUs"),
    ],
)
def test_inject_bad_input_exits_2_naming_the_problem(gpu_state_dir, tmp_path, args, says):
    args = [a.replace("{d}", str(tmp_path)) for a in args]
    result = fake_gpu("inject", *args, state_dir=gpu_state_dir)
    assert result.returncode == 2
    assert says in result.stderr
    assert "Traceback" not in result.stderr
    assert all(gpu_faults.read_health(gpu_state_dir, i).faults() == [] for i in range(8))
    assert gpu_events.read_events(gpu_state_dir, 0) == []


def test_inject_without_a_state_dir_exits_2():
    result = fake_gpu("inject", "lost", "1")
    assert result.returncode == 2
    assert "inject: no state dir: pass --dir DIR or set FAKE_GPU_STATE_DIR" in result.stderr


def test_a_serving_rank_puts_the_scenarios_fault_on_its_own_gpu(start_fake_server, gpu_state_dir):
    server = start_fake_server(
        ["--tp-size", "2", "--base-gpu-id", "4"],
        scenario={"gpu_fault": {"rank": 1, "after_s": 0, "kind": "xid", "code": 79}},
        state_dir=gpu_state_dir,
    )
    # The health first, then its event: two writes, so both are waited for.
    wait_until(lambda: gpu_faults.read_health(gpu_state_dir, 5).lost, what="GPU 5 lost")
    events = wait_until(
        lambda: gpu_events.read_events(gpu_state_dir, 0), what="the Xid event recorded"
    )
    assert [(e.gpu_index, e.data) for e in events] == [(5, 79)]
    assert not gpu_faults.read_health(gpu_state_dir, 4).lost
    # Only the driver's view changed: the rank carries on serving.
    wait_until(lambda: server.status() == 200, what="server up")


def test_concurrent_injections_lose_no_update(gpu_state_dir):
    def count_dbes() -> None:
        for _ in range(5):
            gpu_faults.inject(gpu_state_dir, 0, "dbe")

    workers = [threading.Thread(target=count_dbes) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
    assert gpu_faults.read_health(gpu_state_dir, 0).ecc["volatile"] == (0, 40)
    assert len(gpu_events.read_events(gpu_state_dir, 0)) == 40


def test_a_damaged_health_file_is_a_healthy_gpu_and_a_reset_rewrites_it(gpu_state_dir):
    path = gpu_state_dir / gpu_state.HEALTH_DIR / "gpu2.json"
    path.parent.mkdir()
    path.write_text('{"lost": tru')
    assert gpu_faults.read_health(gpu_state_dir, 2) == gpu_faults.SimHealth()
    assert reset(gpu_state_dir, "2")[0] == EXIT_OK
    assert gpu_faults.SimHealth.from_json(json.loads(path.read_text())) == gpu_faults.SimHealth()
