"""The simulated server's other children: DP controller, detokenizers, detokenizer router and
tokenizer workers, plus `run_child`, the entry point of every spawned child.

Imitated (paths under sglang/srt/):
- managers/data_parallel_controller.py `run_data_parallel_controller_process`: titled
  sglang::data_parallel_controller, SIGKILL on parent death, no signal handler of its own (a
  scheduler's SIGQUIT therefore kills it, exit -3); with plain DP it logs "Launch DP{d} starting
  at GPU #{offset}." and spawns each DP group's schedulers itself; a scheduler dying before it
  reported ready is an exception: "DataParallelController hit an exception: …" and SIGQUIT to
  the main process. A ShutdownReq is forwarded to the schedulers; the controller stays.
- managers/detokenizer_manager.py `run_detokenizer_process` (sglang::detokenizer) and
  managers/multi_tokenizer_mixin.py `run_multi_detokenizer_router_process`
  (sglang::detokenizer_router): SIGKILL on parent death, no signal handler.
- managers/multi_tokenizer_mixin.py `TokenizerWorker` (sglang::tokenizer_worker:{pid}) inside a
  uvicorn worker process (uvicorn/supervisors/multiprocess.py): no SIGKILL on parent death, so it
  outlives a killed main process, holding the listening socket uvicorn handed it.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import resource
import signal
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass
from multiprocessing.connection import Connection
from types import FrameType

from supervisor.testing.endpoints import RankLink
from supervisor.testing.ranks import (
    RankSpec,
    die_with_parent,
    handle_message,
    log,
    log_uvicorn,
    run_scheduler,
    set_title,
)
from supervisor.testing.scenario import Scenario

_TICK_S = 0.02
# How long the controller waits for each of its schedulers to answer a ping it relays.
_RELAY_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildSpec:
    kind: str  # "dp_controller" | "detokenizer" | "detokenizer_router" | "tokenizer_worker"
    parent_pid: int
    scenario: Scenario
    ranks: tuple[RankSpec, ...] = ()  # plain DP: the schedulers the controller spawns
    groups: tuple[tuple[int, int], ...] = ()  # plain DP: (dp_rank, GPU offset) per group
    listener: socket.socket | None = None  # tokenizer worker: the server's bound socket


def run_child(spec: RankSpec | ChildSpec, conn: Connection) -> None:
    """Entry point of every simulated child (multiprocessing spawn target)."""
    if spec.scenario.ignore_sigterm:
        # SIG_IGN survives exec: undo the simulation's own artifice, SGLang's children have the
        # default dispositions.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if isinstance(spec, RankSpec):
        run_scheduler(spec, conn)
    elif spec.kind == "dp_controller":
        _run_controller(spec, conn)
    elif spec.kind == "tokenizer_worker":
        _run_tokenizer_worker(spec, conn)
    else:
        _run_idle(spec, conn)


def _run_idle(spec: ChildSpec, conn: Connection) -> None:
    """A detokenizer or the detokenizer router: up, answering pings, until killed."""
    die_with_parent(spec.parent_pid)
    set_title(f"sglang::{spec.kind}")
    conn.send(("ready", os.getpid()))
    while True:
        if conn.poll(1.0):
            handle_message(conn, obeys_shutdown=False)


def _run_controller(spec: ChildSpec, conn: Connection) -> None:
    set_title("sglang::data_parallel_controller")
    die_with_parent(spec.parent_pid)
    # A scheduler's SIGQUIT kills this process (SGLang installs no handler here); no core file.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    links = _start_dp_groups(spec) if spec.ranks else []
    conn.send(("ready", os.getpid()))
    while True:
        if not conn.poll(1.0):
            continue
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        if message == "shutdown":
            for link in links:  # send_control_message: every DP group gets the ShutdownReq
                link.send("shutdown")
        elif (
            isinstance(message, tuple)
            and message[0] == "ping"
            and all(link.ping(_RELAY_TIMEOUT_S) for link in links)
        ):
            conn.send(("pong", message[1]))


def _start_dp_groups(spec: ChildSpec) -> list[RankLink]:
    """launch_dp_schedulers: each DP group's schedulers, children of this process."""
    ctx = multiprocessing.get_context("spawn")
    for dp_rank, offset in spec.groups:
        log("", f"Launch DP{dp_rank} starting at GPU #{offset}.")
    started: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
    for rank in spec.ranks:
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(
            target=run_child, args=(dataclasses.replace(rank, parent_pid=os.getpid()), theirs)
        )
        proc.start()
        theirs.close()
        started.append((proc, mine))
    for _proc, mine in started:
        try:
            mine.recv()
        except EOFError:
            log(
                "",
                "DataParallelController hit an exception: Traceback (most recent call last):\n"
                '  File "data_parallel_controller.py", in launch_tensor_parallel_group\n'
                "EOFError",
            )
            os.kill(spec.parent_pid, signal.SIGQUIT)
            # The process function returns, but multiprocessing's exit joins the schedulers
            # still loading: the controller lingers until the main process kills the tree.
            while True:
                time.sleep(1.0)
    return [RankLink(mine) for _proc, mine in started]


def _run_tokenizer_worker(spec: ChildSpec, conn: Connection) -> None:
    """A uvicorn worker running a TokenizerWorker; SIGTERM drains (nothing here) and exits 0."""
    pid = os.getpid()
    listener = spec.listener  # held, never served: the sim's HTTP runs in the main process
    log_uvicorn("INFO", f"Started server process [{pid}]")
    log_uvicorn("INFO", "Waiting for application startup.")
    # A name like NamedTemporaryFile(delete=False).name, not created here.
    ipc = f"{tempfile.gettempdir()}/tmp{uuid.uuid4().hex[:8]}"
    log_uvicorn("INFO", f"Start multi-tokenizer worker process {pid}, ipc_name=ipc://{ipc}")
    set_title(f"sglang::tokenizer_worker:{pid}")
    log_uvicorn("INFO", "Application startup complete.")
    terms: list[int] = []

    def on_term(signum: int, _frame: FrameType | None) -> None:
        terms.append(signum)

    signal.signal(signal.SIGTERM, on_term)
    conn.send(("ready", pid))
    link: Connection | None = conn
    while not terms:
        if link is None:
            time.sleep(_TICK_S)  # orphaned: uvicorn's worker keeps running without its parent
        elif link.poll(_TICK_S):
            try:
                message = link.recv()
                if isinstance(message, tuple) and message[0] == "ping":
                    link.send(("pong", message[1]))
            except (EOFError, OSError):
                link = None
    del listener
    _drain_worker(spec.scenario, pid)


def _drain_worker(scenario: Scenario, pid: int) -> None:
    """tokenizer_manager.py SignalHandler.sigterm_handler + sigterm_watchdog, with no request."""
    log("", "SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
    time.sleep(scenario.drain_poll_s)
    log(
        "",
        "Gracefully exiting... Remaining number of requests 0. "
        "Remaining requests remaining_rids=[].",
    )
    log("", f"kill_process_tree called: parent_pid={pid}, include_parent=False, pid={pid}")
    os._exit(0)  # the worker's sigterm_watchdog ends with sys.exit(0)
