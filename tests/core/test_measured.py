"""SGLang's own sizing lines read per rank, and the bounded records a later plan may use."""

from __future__ import annotations

import pytest

from supervisor.core.measured import (
    RECORDS_MAX,
    RECORDS_PER_DEPLOYMENT,
    Deployment,
    Measurement,
    Record,
    SizingLog,
    add_record,
    device_settings,
    latest_for,
)
from supervisor.core.sglang_args import parse_launch_args
from supervisor.core.units import GiB

PREFIX = "[2026-12-01 05:00:00 TP{rank}] "


def line(rank: int, text: str) -> str:
    return PREFIX.format(rank=rank) + text


def test_each_rank_reports_for_itself_and_the_binding_value_is_kept():
    log = SizingLog()
    for rank, (avail, usage, tokens) in enumerate(
        [(19.73, 72.04, 159_104), (19.50, 72.20, 158_976)]
    ):
        log.feed(
            line(
                rank,
                f"Load weight end. elapsed=81.20 s, type=KimiK25ForConditionalGeneration, "
                f"avail mem={avail:.2f} GB, mem usage={usage:.2f} GB.",
            )
        )
        log.feed(
            line(
                rank,
                f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, "
                "KV size: 10.41 GB",
            )
        )
        log.feed(
            line(
                rank,
                "Allocating kv hierarchical KV host pool: 683061 tokens, 48.00 GB host memory.",
            )
        )
        log.feed(line(rank, "Memory pool end. avail mem=3.10 GB"))
    got = log.measurement()
    assert got.device_tokens == 158_976  # the smallest rank binds
    assert got.weights_bytes == int(72.20 * GiB)  # the heaviest rank binds
    assert got.pre_load_free_bytes == int((19.50 + 72.20) * GiB)
    assert got.host_pool_tokens == 683_061
    assert got.free_after_pools_bytes == int(3.10 * GiB)
    assert got.complete


def test_mha_lines_and_ordinary_lines():
    log = SizingLog()
    log.feed("Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)")
    log.feed(
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 618574, K size: 12.37 GB, "
        "V size: 12.37 GB"
    )
    got = log.measurement()
    assert got.device_tokens == 618_574
    assert not got.complete  # no weights line: not enough to plan from


def deployment(gpu_name: str = "NVIDIA RTX PRO 6000", total: int | None = 96 * GiB) -> Deployment:
    return Deployment(
        model="moonshotai/Kimi-K2.5",
        tp_size=8,
        pp_size=1,
        gpu_name=gpu_name,
        gpu_total_bytes=total,
        sglang_version="0.5.23",
    )


def record(at: float, dep: Deployment | None = None, tokens: int = 159_000) -> Record:
    measured = Measurement(
        pre_load_free_bytes=90 * GiB, weights_bytes=72 * GiB, device_tokens=tokens
    )
    return Record(deployment=dep or deployment(), settings={}, measurement=measured, at=at)


def test_a_deployment_matches_by_gpu_name_or_without_one_by_memory():
    assert deployment().matches(deployment())
    assert not deployment().matches(deployment(gpu_name="NVIDIA H200"))
    assert deployment(gpu_name="").matches(deployment())  # planning: no name read
    assert not deployment(gpu_name="").matches(deployment(total=80 * GiB))


def test_records_are_bounded_per_deployment_and_in_all_and_the_newest_is_used():
    records: tuple[Record, ...] = ()
    for i in range(RECORDS_PER_DEPLOYMENT + 3):
        records = add_record(records, record(float(i), tokens=150_000 + i))
    assert len(records) == RECORDS_PER_DEPLOYMENT
    newest = latest_for(records, deployment())
    assert newest is not None
    assert newest.measurement.device_tokens == 150_000 + RECORDS_PER_DEPLOYMENT + 2
    for i in range(RECORDS_MAX + 5):
        other = Deployment(
            model=f"m{i}",
            tp_size=1,
            pp_size=1,
            gpu_name="g",
            gpu_total_bytes=1,
            sglang_version="0.5.23",
        )
        records = add_record(records, record(100.0 + i, other))
    assert len(records) == RECORDS_MAX
    assert latest_for(records, deployment()) is None  # the oldest were dropped


def test_a_record_reads_back_from_its_json():
    original = record(12.5)
    assert Record.from_json(original.to_json()) == original


def test_signed_numbers_are_read_and_no_size_is_stored_below_zero():
    log = SizingLog()
    # SGLang 0.5.23 on CPU: the weights' "mem usage" is a difference of two free readings.
    log.feed(
        line(
            0,
            "Load weight end. elapsed=0.41 s, type=LlamaForCausalLM, avail mem=21.12 GB, "
            "mem usage=-0.00 GB.",
        )
    )
    log.feed(line(0, "Memory pool end. avail mem=-0.50 GB"))
    measured = log.measurement()
    assert measured.weights_bytes == 0
    assert measured.pre_load_free_bytes == int(21.12 * GiB)
    assert measured.free_after_pools_bytes == 0
    log.feed(
        line(1, "Load weight end. elapsed=1 s, type=X, avail mem=10.00 GB, mem usage=-2.5 GB.")
    )
    assert log.measurement().weights_bytes == 0  # the most weights over the ranks: still 0


def test_a_measurement_taken_on_cpu_is_kept_as_such_and_never_sizes_a_gpu():
    gpu = record(1.0, tokens=150_000)
    cpu = Record(
        deployment=deployment(),
        settings={},
        measurement=Measurement(
            pre_load_free_bytes=21 * GiB, weights_bytes=0, device_tokens=40_000, device="cpu"
        ),
        at=2.0,
    )
    records = add_record(add_record((), gpu), cpu)
    assert len(records) == 2
    newest = latest_for(records, deployment())
    assert newest is not None
    assert newest.measurement.device_tokens == 150_000
    assert latest_for((cpu,), deployment()) is None
    assert Record.from_json(cpu.to_json()).measurement.device == "cpu"
    # A record written before the field existed was a GPU's.
    old = gpu.to_json()
    del old["measurement"]["device"]
    assert Record.from_json(old).measurement.device == "gpu"


def test_each_kv_line_is_filed_under_its_pool_and_a_draft_s_after_the_pool_end():
    """SGLang labels a sliding-window model's pools ("Full", "SWA": mem_cache/swa_memory_pool.py
    76-95) and logs a draft model's pools after the target's "Memory pool end"."""
    log = SizingLog()
    for text in (
        "Full KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1000, K size: 0.01 GB, "
        "V size: 0.01 GB",
        "SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: 800, K size: 0.01 GB, "
        "V size: 0.01 GB",
        "Memory pool end. avail mem=20.00 GB",
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1000, K size: 0.00 GB, "
        "V size: 0.00 GB",
        "Memory pool end. avail mem=19.00 GB",
    ):
        log.feed(line(0, text))
    got = log.measurement()
    assert got.device_pools == {"full": 1000, "swa": 800, "draft": 1000}
    assert got.device_tokens == 1000  # the full pool's, never the last line's
    assert got.free_after_pools_bytes == int(19.00 * GiB)


def test_the_last_kv_line_no_longer_decides_the_tokens():
    log = SizingLog()
    log.feed(line(0, "Full KV Cache is allocated. dtype: torch.bfloat16, #tokens: 5000, KV"))
    log.feed(line(0, "SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: 4000, KV"))
    assert log.measurement().device_tokens == 5000


def test_host_pools_by_label_and_the_mamba_slots_where_sglang_prints_them():
    """pool_host/base.py names each host pool; another pool's label (MiniMax's index pool) is
    "kv"'s; a Mamba host line without a slot count (0.5.20's wording) sizes nothing."""
    log = SizingLog()
    for text in (
        "Allocating full hierarchical KV host pool: 2000 tokens, 1.00 GB host memory.",
        "Allocating draft_swa hierarchical KV host pool: 300 tokens, 0.10 GB host memory.",
        "MiniMax MSA-v1 main NVFP4 KV Cache is allocated. dtype: fp4, #tokens: 64, KV size: 0.1 GB",
        "Allocating 0.50 GB host memory for hierarchical Mamba cache (layout=layer_first).",
    ):
        log.feed(line(0, text))
    got = log.measurement()
    assert got.host_pools == {"full": 2000, "draft_swa": 300}
    assert got.device_pools == {"kv": 64}
    slots = "(96 state slots, layout=layer_first)."
    log.feed(line(0, f"Allocating 0.50 GB host memory for hierarchical Mamba cache {slots}"))
    assert log.measurement().host_pools == {"full": 2000, "draft_swa": 300, "mamba": 96}
    long = "Allocating " + "x" * 40 + " hierarchical KV host pool: 7 tokens, 0.01 GB host memory."
    log.feed(line(1, long))
    assert log.measurement().host_pools == {"full": 2000, "draft_swa": 300, "mamba": 96, "kv": 7}


def test_a_record_without_pools_reads_and_one_with_bad_pools_does_not():
    old = record(1.0).to_json()
    del old["measurement"]["device_pools"], old["measurement"]["host_pools"]
    assert Record.from_json(old).measurement.device_pools is None
    for bad in ({"full": -1}, {"full": "many"}, {"x" * 40: 1}, ["full"]):
        damaged = record(1.0).to_json()
        damaged["measurement"]["device_pools"] = bad
        with pytest.raises(ValueError, match="pool"):
            Record.from_json(damaged)


def test_hybrid_flags_enter_the_settings_only_when_given():
    plain = device_settings(parse_launch_args(["--model-path", "m"]))
    assert "swa_full_tokens_ratio" not in plain  # an older record of the same launch matches
    ratio = device_settings(
        parse_launch_args(["--model-path", "m", "--swa-full-tokens-ratio", "0.5"])
    )
    assert ratio["swa_full_tokens_ratio"] == 0.5
