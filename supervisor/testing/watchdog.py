"""SGLang's SubprocessWatchdog (utils/watchdog.py), as the simulated main process runs it.

A daemon thread polls the children; the first one found dead with a non-zero exit code (a
signal's included: -15 after a SIGTERM, -9 after a SIGKILL) is logged as "Subprocess NAME
(pid=P) crashed with exit code N. Triggering SIGQUIT for cleanup..." and the main process sends
itself SIGQUIT; the watchdog then stops. Exit code 0 is an expected exit and is skipped.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Sequence
from multiprocessing.process import BaseProcess

from supervisor.testing.ranks import log

# SGLang polls every 1 s (SubprocessWatchdog interval); the simulation keeps reactions short.
INTERVAL_S = 0.05


class SubprocessWatchdog:
    def __init__(
        self, processes: Sequence[tuple[str, BaseProcess]], *, never_reaped: BaseProcess | None
    ) -> None:
        self._processes = list(processes)
        # The `zombie` scenario's rank: polling it would reap it, and it must stay Z.
        self._never_reaped = never_reaped
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None and self._processes:
            self._thread = threading.Thread(
                target=self._loop, name="subprocess-watchdog", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=INTERVAL_S * 2)
        self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            if self._check():
                return

    def _check(self) -> bool:
        for name, proc in self._processes:
            if proc is self._never_reaped or proc.is_alive() or proc.exitcode == 0:
                continue
            if self._stop.is_set():
                return True  # stopped meanwhile: child exits are expected now
            log(
                "",
                f"Subprocess {name} (pid={proc.pid}) crashed with exit code {proc.exitcode}. "
                "Triggering SIGQUIT for cleanup...",
            )
            os.kill(os.getpid(), signal.SIGQUIT)
            return True
        return False
