"""The simulated shard meter is tqdm's as SGLang configures it (supervisor/testing/progress_bar.py).

Expected lines are SGLang's as operators posted them (sgl-project/sglang #7324, vLLM #38476):
the simulation must print what SGLang prints, independently of the product's parser.
"""

from __future__ import annotations

import pytest

from supervisor.core.load_progress import Phase, read_meter
from supervisor.testing.progress_bar import ShardBar, format_interval, meter
from tests.waiting import wait_until


@pytest.mark.parametrize(
    ("n", "total", "elapsed_s", "line"),
    [
        (0, 8, 0.0, "Loading safetensors checkpoint shards:   0% Completed | 0/8 [00:00<?, ?it/s]"),
        (
            1,
            8,
            0.578,
            "Loading safetensors checkpoint shards:  12% Completed | 1/8 [00:00<00:04,  1.73it/s]",
        ),
        (
            22,
            85,
            131.6,
            "Loading safetensors checkpoint shards:  26% Completed | 22/85 "
            "[02:11<06:16,  5.98s/it]",
        ),
        (
            8,
            8,
            5.03,
            "Loading safetensors checkpoint shards: 100% Completed | 8/8 [00:05<00:00,  1.59it/s]",
        ),
    ],
)
def test_the_meter_is_drawn_as_sglang_draws_it(n: int, total: int, elapsed_s: float, line: str):
    assert meter(n, total, elapsed_s) == line


def test_tqdms_intervals():
    assert [format_interval(s) for s in (0, 59.9, 61, 3600, 3725)] == [
        "00:00",
        "00:59",
        "01:01",
        "1:00:00",
        "1:02:05",
    ]


def test_redraws_start_with_a_carriage_return_and_the_close_ends_the_line():
    now = [0.0]
    written: list[str] = []
    bar = ShardBar(3, written.append, clock=lambda: now[0])
    now[0] = 0.05
    bar.update()  # within tqdm's 0.1 s mininterval: not drawn
    now[0] = 2.0
    bar.update()
    now[0] = 3.0
    bar.update()
    bar.close()
    assert written == [
        "\rLoading safetensors checkpoint shards:   0% Completed | 0/3 [00:00<?, ?it/s]",
        "\rLoading safetensors checkpoint shards:  67% Completed | 2/3 [00:02<00:01,  1.00it/s]",
        "\rLoading safetensors checkpoint shards: 100% Completed | 3/3 [00:03<00:00,  1.00it/s]",
        "\rLoading safetensors checkpoint shards: 100% Completed | 3/3 [00:03<00:00,  1.00it/s]",
        "\n",
    ]
    last = read_meter(written[-2])
    assert last is not None
    assert (last.phase, last.done, last.total) == (Phase.WEIGHTS, 3, 3)


def test_the_simulated_server_draws_the_meter_on_rank_0_only(start_fake_server):
    server = start_fake_server(["--tp-size", "2"], scenario={"startup_s": 0.3, "weight_shards": 3})
    wait_until(lambda: server.status() == 200, what="server up")
    text = server.log_path.read_bytes().decode()  # read_text would turn each "\r" into "\n"
    redraws = [part for part in text.split("\r") if part.startswith("Loading safetensors")]
    assert redraws
    assert any("100% Completed | 3/3" in r for r in redraws)
    assert text.count("0% Completed | 0/3") == 1  # one meter: rank 0 of node 0 only
