"""The components' thread frame: the loop runs from start() until stop() ends it."""

from __future__ import annotations

import threading

from supervisor.adapters.background import Background


class Ticker(Background):
    thread_name = "ticker"

    def __init__(self) -> None:
        self.ticks = 0
        self.ticked = threading.Event()
        super().__init__()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.ticks += 1
            self.ticked.set()
            self._stop.wait(0.01)


def test_the_loop_runs_on_its_named_thread_until_stopped():
    ticker = Ticker()
    ticker.start()
    assert ticker.ticked.wait(10.0)
    assert ticker._thread.name == "ticker"
    assert ticker._thread.daemon  # never keeps the supervisor alive
    ticker.stop()
    assert not ticker._thread.is_alive()
    ticks = ticker.ticks
    ticker.stop()  # twice is harmless
    assert ticker.ticks == ticks


def test_stop_before_start_is_harmless():
    ticker = Ticker()
    ticker.stop()
    assert not ticker._thread.is_alive()
