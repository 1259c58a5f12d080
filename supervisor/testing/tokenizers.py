"""The main process with --tokenizer-worker-num > 1: uvicorn's multiprocess supervisor.

Imitated: entrypoints/http_server.py `_setup_and_run_http_server` (multi-tokenizer branch: the
arguments go to shared memory "multi_tokenizer_args_{pid}" (managers/multi_tokenizer_mixin.py
`write_data_for_multi_tokenizer`, which logs "main process ID: None, current process ID: P"),
unlinked in its `finally`; then `uvicorn.run(..., workers=N)`), and uvicorn 0.51's
supervisors/multiprocess.py `Multiprocess`: it takes INT, TERM, HUP, QUIT, TTIN, TTOU, USR1,
USR2 and WINCH for itself, so SGLang's SIGQUIT handler is gone while it runs (a child's or the
SubprocessWatchdog's SIGQUIT is swallowed and the server keeps running); SIGINT/SIGTERM:
"Received SIGTERM, exiting.", SIGTERM to every worker ("Terminated child process [P]"), join
them ("Waiting for child process [P]"), "Stopping parent process [P]"; a dead worker is
replaced ("Child process [P] died"). Each worker's TokenizerWorker drains and sends the
schedulers a ShutdownReq.

Simplification: HTTP is served by the main process's threads; the workers stand for the process
tree (titles, parent, signals, the listening socket they hold).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from http.server import ThreadingHTTPServer
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.shared_memory import SharedMemory
from typing import NoReturn

from supervisor.testing import shm
from supervisor.testing.children import ChildSpec, run_child
from supervisor.testing.endpoints import STARTING, RankLink, ServerView
from supervisor.testing.ranks import log, log_uvicorn
from supervisor.testing.scenario import Scenario
from supervisor.testing.stopping import TICK_S, SignalBox

SUPERVISOR_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGTTIN,
    signal.SIGTTOU,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGWINCH,
)
_NAMES: dict[int, str] = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


def shm_name(pid: int) -> str:
    return f"{shm.MULTI_TOKENIZER_PREFIX}{pid}"


class TokenizerWorkers:
    def __init__(
        self,
        *,
        count: int,
        scenario: Scenario,
        view: ServerView,
        box: SignalBox,
        shutdown_to: Sequence[RankLink],
    ) -> None:
        self.count = count
        self.scenario = scenario
        self.view = view
        self.box = box
        self.shutdown_to = list(shutdown_to)
        self.workers: list[BaseProcess] = []
        self.shm: SharedMemory | None = None
        # Each worker's pipe, open while it lives (uvicorn pings its workers over one), and
        # whether its warmup has been reported.
        self._links: dict[int, Connection] = {}
        self._warm: set[int] = set()
        self.http: ThreadingHTTPServer | None = None

    def _start_one(self) -> BaseProcess:
        ctx = multiprocessing.get_context("spawn")
        mine, theirs = ctx.Pipe()
        spec = ChildSpec(
            kind="tokenizer_worker",
            parent_pid=os.getpid(),
            scenario=self.scenario,
            listener=self.http.socket if self.http is not None else None,
        )
        proc = ctx.Process(target=run_child, args=(spec, theirs), daemon=False)
        proc.start()
        theirs.close()
        assert proc.pid is not None  # started
        self._links[proc.pid] = mine
        return proc

    def _write_args(self) -> None:
        me = os.getpid()
        log("", f"main process ID: None, current process ID: {me}")
        payload = repr(self.view.info["server_info"]).encode()
        shm.record(shm_name(me))
        segment = SharedMemory(name=shm_name(me), create=True, size=len(payload))
        buf = segment.buf
        assert buf is not None  # None only after close()
        buf[: len(payload)] = payload
        segment.close()
        self.shm = segment

    def serve(self, bind: Callable[[], ThreadingHTTPServer], warmup_s: float | None) -> NoReturn:
        """The shared-memory arguments, then uvicorn.run(workers=N): never returns."""
        self._write_args()
        try:
            self.http = bind()  # uvicorn Config.bind_socket; exits 3 when the port is taken
        except SystemExit:
            if self.shm is not None:
                self.shm.unlink()
            raise
        log_uvicorn("INFO", f"Started parent process [{os.getpid()}]")
        self.box.record(*SUPERVISOR_SIGNALS)
        self.workers = [self._start_one() for _ in range(self.count)]
        warm_at = time.monotonic() + (warmup_s or 0.0)
        while True:
            for signum, _loop_created in self.box.take():
                if signum in _NAMES:
                    self._stop(_NAMES[signum])
                # Any other signal, SIGQUIT included, has no handler here (logged at debug).
            if time.monotonic() >= warm_at:
                self._warm_up()
            self._keep_alive()
            time.sleep(TICK_S)

    def _warm_up(self) -> None:
        """Every worker runs its own warmup once it has started (its lifespan's thread)."""
        for proc in self.workers:
            link = self._links.get(proc.pid or -1)
            if proc.pid in self._warm or link is None or not link.poll():
                continue
            with contextlib.suppress(EOFError, OSError):
                link.recv()  # its ("ready", pid)
                self._warm.add(proc.pid or -1)
                if self.view.status == STARTING:
                    self.view.set_up()
                self.box.loop_created = True
                log_uvicorn("INFO", "The server is fired up and ready to roll!")

    def _keep_alive(self) -> None:
        for i, proc in enumerate(self.workers):
            if not proc.is_alive():
                log_uvicorn("INFO", f"Child process [{proc.pid}] died")
                link = self._links.pop(proc.pid or -1, None)
                if link is not None:
                    link.close()
                self.workers[i] = self._start_one()

    def _stop(self, name: str) -> NoReturn:
        log_uvicorn("INFO", f"Received {name}, exiting.")
        self.view.gracefully_exit = True  # every worker is draining now
        for proc in self.workers:
            if proc.exitcode is None and proc.pid is not None:
                os.kill(proc.pid, signal.SIGTERM)
                log_uvicorn("INFO", f"Terminated child process [{proc.pid}]")
        while self.view.remaining_rids():
            time.sleep(TICK_S)
        for link in self.shutdown_to:
            link.send("shutdown")  # each worker's sigterm_watchdog sends a ShutdownReq
        for proc in self.workers:
            log_uvicorn("INFO", f"Waiting for child process [{proc.pid}]")
            proc.join()
        log_uvicorn("INFO", f"Stopping parent process [{os.getpid()}]")
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
        if self.shm is not None:
            self.shm.unlink()  # the finally of _setup_and_run_http_server
        sys.exit(0)  # launch_server returns; launch_server.py kills what is left
