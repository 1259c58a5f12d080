"""How the simulated main process stops: its signal dispositions and every stop path.

Imitated (paths under sglang/srt/ unless named):
- entrypoints/engine.py `_set_envs_and_config`: from the start, SIGQUIT runs the launch-phase
  handler ("Received sigquit from a child process. It usually means the child failed.", then
  kill_process_tree of everything, itself included). SIGTERM keeps its default (the process
  dies, -15) and SIGINT Python's (KeyboardInterrupt) until a server takes them.
- uvicorn's Server (uvicorn/server.py `capture_signals`, `shutdown`): once HTTP runs, SIGINT and
  SIGTERM stop uvicorn gracefully ("Shutting down", in-flight requests finish, lifespan
  shutdown, "Finished server process [pid]"), after which uvicorn raises the signal again: SIGTERM
  then kills the process (-15, its children follow by PDEATHSIG), SIGINT raises KeyboardInterrupt
  and launch_server.py's `finally` kills the children (exit -2). A warmup still running fails on
  the closed server and kills the tree (-9).
- managers/tokenizer_manager.py `auto_create_handle_loop`: the first generate request (the
  warmup's, a /health's, a client's) hands SIGTERM to `SignalHandler.sigterm_handler` and SIGQUIT
  to `running_phase_sigquit_handler`; `sigterm_watchdog` drains, then stops the
  SubprocessWatchdog, sends ShutdownReq, waits up to 15 s for the schedulers, kills the rest of
  the tree and stops uvicorn: exit 0.
- utils/common.py `kill_process_tree`: logs, SIGKILLs every descendant, waits for them, and with
  include_parent SIGKILLs itself (-9).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import time
from collections.abc import Sequence
from http.server import ThreadingHTTPServer
from types import FrameType

import psutil

from supervisor.testing.endpoints import UNHEALTHY, RankLink, ServerView
from supervisor.testing.ranks import log, log_uvicorn
from supervisor.testing.scenario import Scenario
from supervisor.testing.watchdog import SubprocessWatchdog

TICK_S = 0.02
# kill_process_tree waits 60 s for the killed to be reaped; SIGKILLed simulations go at once.
_REAP_WAIT_S = 10.0


class SignalBox:
    """Handlers only record; the main loop acts (no work inside a signal handler).

    Each record says whether the tokenizer manager's handlers were in place when the signal came.
    """

    def __init__(self, *, ignore_term_int: bool) -> None:
        self.queue: queue.SimpleQueue[tuple[int, bool]] = queue.SimpleQueue()
        self.loop_created = False  # tokenizer_manager.auto_create_handle_loop has run
        self._ignore = ignore_term_int
        if ignore_term_int:  # the `ignore_sigterm` scenario: only SIGKILL works
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    def _put(self, signum: int, _frame: FrameType | None) -> None:
        self.queue.put((signum, self.loop_created))

    def record(self, *signums: int) -> None:
        for signum in signums:
            if not (self._ignore and signum in (signal.SIGTERM, signal.SIGINT)):
                signal.signal(signum, self._put)

    def take(self) -> list[tuple[int, bool]]:
        out: list[tuple[int, bool]] = []
        while not self.queue.empty():
            out.append(self.queue.get_nowait())
        return out


def kill_process_tree(*, include_parent: bool) -> None:
    """utils/common.py kill_process_tree(os.getpid(), include_parent)."""
    me = os.getpid()
    log("", f"kill_process_tree called: parent_pid={me}, include_parent={include_parent}, pid={me}")
    try:
        descendants = psutil.Process().children(recursive=True)
    except psutil.Error:
        descendants = []
    for child in descendants:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(descendants, timeout=_REAP_WAIT_S)
    if include_parent:
        os.kill(me, signal.SIGKILL)


def _env_on(name: str) -> bool:
    """environ.py EnvBool, default True (an unreadable value counts as on here)."""
    return os.environ.get(name, "true").lower() not in ("false", "0", "no", "n")


def crash_dump_wait(view: ServerView, scenario: Scenario) -> None:
    """TokenizerManager.dump_requests_before_crash: with py-spy or CUDA core dumps on (the
    default), 5 s + the dumps + a 60 s wait, the event loop blocked (HTTP frozen); nothing when
    SGLANG_PYSPY_DUMP_BEFORE_CRASH and SGLANG_CUDA_COREDUMP_BEFORE_CRASH are both off."""
    if _env_on("SGLANG_PYSPY_DUMP_BEFORE_CRASH") or _env_on("SGLANG_CUDA_COREDUMP_BEFORE_CRASH"):
        view.frozen = True
        time.sleep(scenario.crash_dump_wait_s)


def launch_phase_sigquit() -> None:
    log("", "Received sigquit from a child process. It usually means the child failed.")
    kill_process_tree(include_parent=True)


def running_phase_sigquit(
    view: ServerView, watchdog: SubprocessWatchdog | None, scenario: Scenario
) -> None:
    """SignalHandler.running_phase_sigquit_handler: HTTP frozen during the crash dump."""
    log("", "SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
    if watchdog is not None:
        watchdog.stop()
    crash_dump_wait(view, scenario)
    kill_process_tree(include_parent=True)


def uvicorn_shutdown(
    http: ThreadingHTTPServer, view: ServerView, *, wait: bool, warming: str | None = None
) -> None:
    """uvicorn Server.shutdown: stop listening, let requests in flight finish, lifespan end.

    `warming` ("host:port") when the warmup thread has not finished: SGLang's lifespan shutdown
    joins it, and its requests now fail (http_server.py `_execute_server_warmup`: "Initialization
    failed. warmup error: …", kill_process_tree of itself). SGLang may first retry /model_info
    for up to 2 minutes; the simulation fails at once.
    """
    log_uvicorn("INFO", "Shutting down")
    http.shutdown()
    http.server_close()
    if wait and view.remaining_rids():
        log_uvicorn("INFO", "Waiting for connections to close. (CTRL+C to force quit)")
        while view.remaining_rids():
            time.sleep(TICK_S)
    log_uvicorn("INFO", "Waiting for application shutdown.")
    if warming is not None:
        host, _, port = warming.rpartition(":")
        log(
            "",
            "Initialization failed. warmup error: Traceback (most recent call last):\n"
            "requests.exceptions.ConnectionError: HTTPConnectionPool(host='"
            f"{host}', port={port}): Max retries exceeded with url: /generate (Caused by "
            "NewConnectionError('Failed to establish a new connection: [Errno 111] Connection "
            "refused'))",
        )
        kill_process_tree(include_parent=True)
    log_uvicorn("INFO", "Application shutdown complete.")
    log_uvicorn("INFO", f"Finished server process [{os.getpid()}]")


def raise_again(signum: int) -> None:
    """capture_signals' exit: the signal again, under the disposition uvicorn found."""
    if signum == signal.SIGINT:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    else:
        signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


class Drain:
    """TokenizerManager.sigterm_watchdog: poll every drain_poll_s until nothing is in flight."""

    def __init__(self, view: ServerView, scenario: Scenario) -> None:
        self.view = view
        self.scenario = scenario
        self._next = time.monotonic() + scenario.drain_poll_s

    def step(self) -> bool:
        """One look when due; True once the drain is over."""
        if time.monotonic() < self._next:
            return False
        rids = self.view.remaining_rids()
        if self.view.status == UNHEALTHY:
            log("", "Signal SIGTERM received while health check failed. Force exiting.")
            crash_dump_wait(self.view, self.scenario)
            return True
        if os.environ.get("SGL_FORCE_SHUTDOWN", "").lower() in ("true", "1"):
            log("", "Signal SIGTERM received while force shutdown flag set. Force exiting.")
            return True
        log(
            "",
            f"Gracefully exiting... Remaining number of requests {len(rids)}. "
            f"Remaining requests remaining_rids={rids!r}.",
        )
        self._next = time.monotonic() + self.scenario.drain_poll_s
        return not rids


def scheduler_processes() -> list[psutil.Process]:
    """utils/cudacore_pyspy_dump_utils.py collect_scheduler_processes (zombies have no title)."""
    out: list[psutil.Process] = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if " ".join(proc.cmdline()).startswith("sglang::scheduler"):
                out.append(proc)
    return out


def finish_drain(
    view: ServerView,
    watchdog: SubprocessWatchdog | None,
    shutdown_to: Sequence[RankLink],
    scenario: Scenario,
    http: ThreadingHTTPServer,
) -> None:
    """The end of sigterm_watchdog, then the server stop hook; the process exits 0."""
    if watchdog is not None:
        watchdog.stop()  # child exits are expected from here on
    view.frozen = True  # the rest blocks the event loop (time.sleep in sigterm_watchdog)
    for link in shutdown_to:
        link.send("shutdown")
    timeout_s = scenario.scheduler_exit_timeout_s
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and scheduler_processes():
        time.sleep(TICK_S)
    stragglers = [p.pid for p in scheduler_processes()]
    if stragglers:
        log(
            "",
            f"Schedulers still alive {timeout_s:g}s after ShutdownReq, killing them before they "
            f"released: {stragglers}",
        )
    kill_process_tree(include_parent=False)
    uvicorn_shutdown(http, view, wait=False)
    sys.exit(0)
