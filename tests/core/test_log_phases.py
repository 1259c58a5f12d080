"""SGLang log lines -> load phases and crash marks (docs/sglang.md §4.1)."""

from __future__ import annotations

import pytest

from supervisor.core.log_phases import LogMark, marks_in, read_mark


@pytest.mark.parametrize(
    ("line", "mark"),
    [
        ("[2026-01-01 TP0] Memory baseline taken. mem usage=1.2 GB", LogMark.MEMORY_BASELINE),
        (
            "[TP0] Load weight end. type=DeepseekV3ForCausalLM, avail mem=60 GB",
            LogMark.WEIGHTS_LOADED,
        ),
        (
            "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 681000, KV size: 45 GB",
            LogMark.KV_CACHE_ALLOCATED,
        ),
        (
            "Allocating 96.00 GB hierarchical KV host pool: 1366000 tokens, 96.00 GB host memory.",
            LogMark.HOST_POOL_ALLOCATED,
        ),
        (
            "HiCache auto-sizing: ratio 2.0 -> 1.4; 80 GiB host memory per rank",
            LogMark.HICACHE_AUTO_SIZED,
        ),
        ("The server is fired up and ready to roll!", LogMark.READY),
        (
            "Not enough host memory available. Requesting 300 GB but only have 50 GB free.",
            LogMark.HOST_MEMORY_REFUSED,
        ),
        ("cudaHostRegister failed (rc=2)", LogMark.PINNING_FAILED),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", LogMark.GPU_OOM),
        ("RuntimeError: Loaded weights leave no GPU memory for the KV cache", LogMark.GPU_OOM),
        (
            "OSError: [Errno 98] error while attempting to bind: address already in use",
            LogMark.PORT_IN_USE,
        ),
        ("launch_server.py: error: unrecognized arguments: --bogus", LogMark.ARGPARSE_ERROR),
        ("usage: launch_server.py [-h] --model-path MODEL_PATH", LogMark.ARGPARSE_ERROR),
        (
            "Scheduler hit an exception: Traceback (most recent call last):",
            LogMark.SCHEDULER_EXCEPTION,
        ),
        ("Subprocess scheduler_1 (pid=4242) crashed with exit code -9", LogMark.SUBPROCESS_CRASHED),
        ("Rank 3 scheduler died during initialization (exit code: -9)", LogMark.RANK_DIED_AT_INIT),
        ("SIGQUIT received. signum=3", LogMark.SIGQUIT),
    ],
)
def test_known_lines_are_marked(line, mark):
    found = read_mark(line)
    assert found is not None
    assert found.mark is mark


@pytest.mark.parametrize(
    "line",
    [
        "",
        'INFO:     127.0.0.1:5000 - "GET /health HTTP/1.1" 200 OK',
        "Prefill batch. #new-seq: 1",
        "usage of memory is fine",
        "\x00\xff garbage",
    ],
)
def test_ordinary_and_hostile_lines_are_not_marks(line):
    assert read_mark(line) is None


def test_rank_deaths_carry_the_exit_code():
    died = read_mark("Rank 3 scheduler died during initialization (exit code: -9)")
    crashed = read_mark("Subprocess scheduler_1 (pid=1) crashed with exit code 1")
    assert died is not None
    assert died.exit_code == -9
    assert crashed is not None
    assert crashed.exit_code == 1


def test_marks_in_keeps_order_and_skips_plain_lines():
    lines = ["hello", "Load weight end.", "x", "The server is fired up and ready to roll!"]
    assert [m.mark for m in marks_in(lines)] == [LogMark.WEIGHTS_LOADED, LogMark.READY]
