"""adapters.gpu_guard: NVML queries in a worker process, bounded by a deadline (simulated GPUs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from supervisor.adapters.gpu_guard import GuardedGpuSensor, _from_json, _to_json
from supervisor.core.readings import GpuProcess, GpuState
from supervisor.testing import gpu_state

SIM = "supervisor.testing.fake_nvml"
# A read that must be answered gets as long as a loaded 2-core machine may need (a hung one
# costs it in full); a worker's first answer waits for its interpreter and NVML to start.
ANSWER_S = 3.0
START_S = 10.0  # a new worker hung in its NVML start costs this in full


def _sim(state: Path) -> dict[str, str]:
    return {"FAKE_GPU_STATE_DIR": str(state)}


def test_reads_the_simulated_gpus_through_the_worker(make_gpu_state: Callable[..., Path]):
    state = make_gpu_state(2)
    guard = GuardedGpuSensor(SIM, env=_sim(state), timeout_s=5.0)
    try:
        gpus = guard.read_gpus()
        assert gpus is not None
        assert [g.index for g in gpus] == [0, 1]
        assert gpus[0].uuid == gpu_state.gpu_uuid(0)
        snapshot = guard.last_snapshot()
        assert snapshot is not None
        assert snapshot[1] == gpus
    finally:
        guard.close()


def test_a_hanging_nvml_call_answers_unknown_within_the_deadline_and_alerts(
    make_gpu_state: Callable[..., Path],
):
    state = make_gpu_state(1)
    alerts: list[str] = []
    guard = GuardedGpuSensor(
        SIM, env=_sim(state), timeout_s=ANSWER_S, retry_after_s=60.0, on_alert=alerts.append
    )
    try:
        assert guard.read_gpus() is not None  # worker up and answering
        # Longer than the test's own timeout: that read_gpus returns at all shows the caller
        # was not held by the hung call.
        gpu_state.set_nvml_hang(state, 3600.0)
        assert guard.read_gpus() is None
        assert guard.hangs == 1
        assert alerts
        assert "no answer" in alerts[0]
        # Within the retry back-off no new worker is started: answer at once.
        assert guard.read_gpus() is None
        assert guard.hangs == 1
    finally:
        gpu_state.set_nvml_hang(state, None)
        guard.close()


def test_the_retry_wait_is_asked_with_the_hangs_in_a_row_and_an_answer_starts_them_over(
    make_gpu_state: Callable[..., Path],
):
    state = make_gpu_state(1)
    asked: list[int] = []

    def retry_after_s(hangs_in_a_row: int) -> float:
        asked.append(hangs_in_a_row)
        return 0.0  # ask again at once: every read below goes to a worker

    guard = GuardedGpuSensor(
        SIM,
        env=_sim(state),
        timeout_s=ANSWER_S,
        start_timeout_s=START_S,
        retry_after_s=retry_after_s,
    )
    try:
        assert guard.read_gpus() is not None
        gpu_state.set_nvml_hang(state, 3600.0)
        assert guard.read_gpus() is None
        assert guard.read_gpus() is None  # a new worker, hung too
        gpu_state.set_nvml_hang(state, None)
        assert guard.read_gpus() is not None
        gpu_state.set_nvml_hang(state, 3600.0)
        assert guard.read_gpus() is None
        assert asked == [1, 2, 1]
    finally:
        gpu_state.set_nvml_hang(state, None)
        guard.close()


def test_a_worker_that_will_not_exit_at_close_is_killed_and_reaped(
    make_gpu_state: Callable[..., Path],
):
    """Its NVML shutdown hangs: close() kills it, and reaps it too, so its Popen never outlives
    the sensor unwaited (a ResourceWarning "subprocess N is still running" when collected)."""
    state = make_gpu_state(1)
    guard = GuardedGpuSensor(SIM, env=_sim(state), timeout_s=ANSWER_S)
    try:
        assert guard.read_gpus() is not None
        worker = guard._worker
        assert worker is not None
        gpu_state.set_nvml_hang(state, 30.0)
        guard.close()
        assert worker.returncode is not None
        assert not Path(f"/proc/{worker.pid}").exists()  # reaped, not a zombie left behind
    finally:
        gpu_state.set_nvml_hang(state, None)
        guard.close()


def test_snapshots_survive_the_json_round_trip():
    gpus = (
        GpuState(
            index=3,
            uuid="GPU-x",
            name="H200",
            total_bytes=10,
            used_bytes=4,
            numa_node=1,
            processes=(GpuProcess(pid=7, used_bytes=None), GpuProcess(pid=8, used_bytes=2)),
        ),
    )
    assert _from_json(_to_json(gpus)) == gpus
    assert _from_json(_to_json(None)) is None


def test_nvml_hung_from_the_start_is_unknown_after_the_start_timeout(
    make_gpu_state: Callable[..., Path],
):
    state = make_gpu_state(1)
    gpu_state.set_nvml_hang(state, 30.0)
    guard = GuardedGpuSensor(SIM, env=_sim(state), timeout_s=0.2, start_timeout_s=0.5)
    try:
        assert guard.read_gpus() is None
        assert guard.hangs == 1
    finally:
        gpu_state.set_nvml_hang(state, None)
        guard.close()
