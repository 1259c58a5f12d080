"""A component's own daemon thread: `_loop` runs from start() until stop() sets `_stop`.

The run loop's components (the GPU event watch, the load reporter, the group's gate opener and
leader watch) each poll on their own thread beside one launch; this is their common frame.
"""

from __future__ import annotations

import threading


class Background:
    """Subclasses set `thread_name`, implement `_loop` (ending once `_stop` is set) and call
    `super().__init__()`."""

    thread_name = "background"
    stop_timeout_s = 5.0  # stop() waits this long for the loop to notice

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.stop_timeout_s if timeout_s is None else timeout_s)

    def _loop(self) -> None:
        raise NotImplementedError
