"""A launch on `--device cpu` in the run loop: SGLang's "avail mem" there is host RAM, so its
measurement is filed as a CPU's (never a GPU's sizing), and the run claims no GPU."""

from __future__ import annotations

import signal
from pathlib import Path

from structlog.testing import capture_logs

from supervisor.core.events import SignalEvent
from supervisor.core.measured import latest_for
from supervisor.preflight.measurements import load_records
from supervisor.run.launch import describe_settings
from tests.run.runner_support import ARGS, LOAD_S, WARM_S, runner, settings, world

SIGTERM = SignalEvent(signal.SIGTERM, "SIGTERM")


def test_a_launch_on_cpu_files_its_measurement_as_cpu_and_claims_no_gpu(tmp_path: Path):
    w = world(tmp_path)
    w.launcher.output = [
        "[2026-12-01 05:00:00] Load weight end. elapsed=0.41 s, type=LlamaForCausalLM, "
        "avail mem=21.12 GB, mem usage=-0.00 GB.",
        "[2026-12-01 05:00:01] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 40000, "
        "K size: 0.00 GB, V size: 0.00 GB",
    ]
    on_cpu = settings(tmp_path, (*ARGS, "--device", "cpu"))
    run = runner(w, on_cpu, watch_gpus=False)
    w.events.at(LOAD_S + WARM_S + 5.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    measured = next(e for e in logs if e["event"] == "sizing_measured")
    assert (measured["device"], measured["weights_bytes"]) == ("cpu", 0)
    (record,) = load_records(tmp_path)[0]
    assert record.measurement.device == "cpu"
    assert latest_for((record,), record.deployment) is None  # never a GPU's sizing
    assert w.store.load().gpu_indices == ()
    assert describe_settings(on_cpu, run.plan)["gpus"] == []
