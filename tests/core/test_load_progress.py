"""SGLang's loading output -> phases, percent and ETA (core/load_progress.py).

The meter lines are SGLang's as operators posted them (sgl-project/sglang issues #4801, #7324,
PR #11716; vLLM PR #38476 shows the same tqdm line from the shared loader code).
"""

from __future__ import annotations

import pytest

from supervisor.core.load_progress import (
    LoadProgress,
    Phase,
    read_meter,
)

T0 = 1_800_000_000.0

SHARDS = [
    # (line, done, total, remaining_s)
    ("Loading safetensors checkpoint shards:   0% Completed | 0/8 [00:00<?, ?it/s]", 0, 8, None),
    (
        "Loading safetensors checkpoint shards:  34% Completed | 55/163 [00:17<00:35,  3.02it/s]",
        55,
        163,
        35.0,
    ),
    (
        "Loading safetensors checkpoint shards:  26% Completed | 22/85 [02:11<06:16,  5.98s/it]",
        22,
        85,
        376.0,
    ),
    (
        "Loading safetensors checkpoint shards: 100% Completed | 8/8 [00:05<00:00,  1.59it/s]",
        8,
        8,
        0.0,
    ),
    # A 60-shard checkpoint read for an hour: tqdm's h:mm:ss.
    (
        "Loading safetensors checkpoint shards:  45% Completed | 27/60 "
        "[1:02:03<1:15:50, 137.9s/it]",
        27,
        60,
        4550.0,
    ),
    ("Multi-thread loading shards:  50% Completed | 4/8 [00:10<00:10,  2.50s/it]", 4, 8, 10.0),
]


@pytest.mark.parametrize(("line", "done", "total", "remaining_s"), SHARDS)
def test_the_weight_shard_meter_reads_as_weights_with_tqdms_time_left(
    line: str, done: int, total: int, remaining_s: float | None
):
    meter = read_meter(line)
    assert meter is not None
    assert (meter.phase, meter.done, meter.total, meter.unit) == (
        Phase.WEIGHTS,
        done,
        total,
        "shards",
    )
    assert meter.remaining_s == remaining_s


@pytest.mark.parametrize(
    "line",
    [
        "Capturing batches (bs=216 avail_mem=10.30 GB):  40%|████      | 21/52 "
        "[00:03<00:04,  7.40it/s]",
        "Capturing batches (avail_mem=7.08 GB):   0%|          | 0/17 [00:00<?, ?it/s]",
        "Capturing prefill shape (num_tokens=512 avail_mem=30.12 GB):  50%|█████     | 4/8 "
        "[00:01<00:01,  3.1it/s]",
    ],
)
def test_the_graph_capture_meter_reads_as_cuda_graphs(line: str):
    meter = read_meter(line)
    assert meter is not None
    assert meter.phase is Phase.CUDA_GRAPHS
    assert meter.unit == "shapes"


@pytest.mark.parametrize(
    "line",
    [
        "Processing batches: 1it [00:00,  2.74it/s]",  # no total
        "Fetching 5 files: 100%|██████████| 5/5 [00:00<00:00, 12.1it/s]",  # not a load phase
        "[2026-01-01 10:00:00 TP0] Prefill batch. #new-seq: 1, #new-token: 2062, token usage: 0.00",
        "Loading safetensors checkpoint shards: 120% Completed | 9/8 [00:05<00:00,  1.59it/s]",
    ],
)
def test_other_lines_and_other_meters_are_not_load_progress(line: str):
    assert read_meter(line) is None


def test_a_redraw_glued_to_another_ranks_line_still_counts_and_so_does_that_line():
    progress = LoadProgress.begin(T0).feed("Load weight begin. avail mem=93.56 GB", T0)
    glued = (
        "Loading safetensors checkpoint shards:  80% Completed | 4/5 [00:00<00:00,  9.92it/s]"
        "[2026-12-01 08:13:54 TP1] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 6959"
    )
    after = progress.feed(glued, T0 + 1)
    assert after.phase is Phase.MEMORY_POOLS  # the glued line moved it on


def test_a_load_goes_through_its_phases_with_counts_and_eta():
    p = LoadProgress.begin(T0)
    assert p.phase is Phase.STARTING
    p = p.feed("[2026-01-01 10:00:00 TP0] Load weight begin. avail mem=93.56 GB", T0 + 1)
    assert (p.phase, p.phase_since_s, p.percent) == (Phase.WEIGHTS, T0 + 1, None)
    p = p.feed(
        "Loading safetensors checkpoint shards:  45% Completed | 27/60 [00:31<00:38,  1.16s/it]",
        T0 + 32,
    )
    assert (p.done, p.total, p.unit) == (27, 60, "shards")
    assert p.percent == pytest.approx(45.0)
    assert p.eta_s(T0 + 40) == pytest.approx(30.0)  # tqdm's 38 s, read 8 s ago
    assert p.describe(T0 + 32) == "loading weights 45% (27/60 shards, ETA 38 s)"
    p = p.feed("[TP0] Load weight end. elapsed=81.20 s, type=X, avail mem=19.73 GB", T0 + 80)
    assert (p.phase, p.done, p.total, p.eta_at_s) == (Phase.MEMORY_POOLS, None, None, None)
    p = p.feed("[TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 159000", T0 + 81)
    assert p.phase is Phase.MEMORY_POOLS
    assert p.phase_since_s == T0 + 80
    p = p.feed(
        "[TP0] Capture target decode CUDA graph begin. backend=fa3, num_tokens_per_req=1", T0 + 90
    )
    assert p.phase is Phase.CUDA_GRAPHS
    p = p.feed(
        "Capturing batches (bs=216 avail_mem=10.30 GB):  40%|████      | 21/52 [00:03<00:04,  "
        "7.40it/s]",
        T0 + 93,
    )
    assert p.describe(T0 + 93) == "capturing CUDA graphs 40% (21/52 shapes, ETA 4 s)"
    p = p.enter(Phase.WARM_UP, T0 + 100)
    assert p.describe(T0 + 100) == "warming up"
    assert p.started_at_s == T0


def test_phases_only_move_forward_but_a_second_model_loads_again():
    p = LoadProgress.begin(T0).feed("Load weight begin. avail mem=9 GB", T0)
    p = p.feed("[TP1] Load weight end. elapsed=3.00 s, type=X", T0 + 3)  # a faster rank
    late = "Loading safetensors checkpoint shards: 100% Completed | 8/8 [00:04<00:00,  1.9it/s]"
    assert p.feed(late, T0 + 4) is p  # rank 0's last redraw does not undo it
    draft = p.feed("[TP0] Load weight begin. avail mem=8 GB", T0 + 5)  # the speculative draft
    assert draft.phase is Phase.WEIGHTS
    assert draft.feed("an ordinary line", T0 + 6) is draft


def test_a_bar_for_a_terminal():
    p = LoadProgress.begin(T0).feed(
        "Loading safetensors checkpoint shards:  50% Completed | 4/8 [00:10<00:10,  2.50s/it]", T0
    )
    assert p.bar(T0, width=10) == "[#####-----] loading weights 50% (4/8 shards, ETA 10 s)"
    assert LoadProgress.begin(T0).bar(T0, width=4) == "[----] starting"


def test_the_progress_survives_its_json():
    p = LoadProgress.begin(T0).feed(
        "Loading safetensors checkpoint shards:  50% Completed | 4/8 [00:10<00:10,  2.50s/it]", T0
    )
    data = p.to_json()
    assert data["percent"] == 50.0
    assert LoadProgress.from_json(data) == p
    with pytest.raises(ValueError, match="Phase"):
        LoadProgress.from_json({**data, "phase": "sleeping"})
    with pytest.raises(TypeError):
        LoadProgress.from_json({**data, "done": "4"})
