"""SGLang's weight-shard meter, drawn by the simulated rank that SGLang would draw it on.

SGLang 0.5.23 model_loader/weight_utils.py `safetensors_weights_iterator` wraps the checkpoint
files in tqdm(desc="Loading safetensors checkpoint shards", bar_format=BAR_FORMAT,
disable=not enable_tqdm), enable_tqdm being torch.distributed rank 0; utils/common.py has
BAR_FORMAT (below, split over two lines).

tqdm 4 (std.py) draws on stderr: "\\r" + the meter (padded with spaces over a longer previous
one) when created, after an update when `mininterval` (0.1 s) has passed since the last draw,
and at close once more, then "\\n". Its fields (`format_meter`): elapsed and remaining as
format_interval ("mm:ss", "h:mm:ss"), remaining "?" before the first item; the rate as
"{rate:5.2f}it/s", or "{1/rate:5.2f}s/it" when an item takes more than a second, "?it/s" before
the first. tqdm smooths the rate (EMA); this takes the mean, which is what its close shows.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

DESC = "Loading safetensors checkpoint shards"
BAR_FORMAT = (
    "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]"
)
MININTERVAL_S = 0.1


def format_interval(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def meter(n: int, total: int, elapsed_s: float, desc: str = DESC) -> str:
    """One drawing of the meter after `n` of `total` items in `elapsed_s`."""
    rate = n / elapsed_s if n and elapsed_s else None
    if rate is None:
        rate_fmt = "?it/s"
    elif 1 / rate > 1:
        rate_fmt = f"{1 / rate:5.2f}s/it"
    else:
        rate_fmt = f"{rate:5.2f}it/s"
    remaining = format_interval((total - n) / rate) if rate else "?"
    return BAR_FORMAT.format(
        desc=desc,
        percentage=100 * n / total if total else 0,
        n_fmt=str(n),
        total_fmt=str(total),
        elapsed=format_interval(elapsed_s),
        remaining=remaining,
        rate_fmt=rate_fmt,
    )


class ShardBar:
    """tqdm over `total` checkpoint files, as drawn on a pipe."""

    def __init__(
        self,
        total: int,
        write: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.n = 0
        self._write = write
        self._clock = clock
        self._started = self._drawn_at = clock()
        self._width = 0
        self._draw()

    def update(self) -> None:
        self.n += 1
        if self._clock() - self._drawn_at >= MININTERVAL_S:
            self._draw()

    def close(self) -> None:
        self._draw()
        self._write("\n")

    def _draw(self) -> None:
        now = self._clock()
        text = meter(self.n, self.total, now - self._started)
        self._write("\r" + text + " " * max(self._width - len(text), 0))
        self._width, self._drawn_at = len(text), now


def _stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def load_shards(shards: int, seconds: float, wait: Callable[[float], None]) -> None:
    """Spend `seconds` loading `shards` checkpoint files, the meter drawn on stderr."""
    if shards <= 0:
        wait(seconds)
        return
    bar = ShardBar(shards, _stderr)
    for _ in range(shards):
        wait(seconds / shards)
        bar.update()
    bar.close()
