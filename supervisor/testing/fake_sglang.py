"""The simulated SGLang server: `python -m supervisor.testing.fake_sglang <launch_server args>`.

The main process plays SGLang's launcher (launch_server.py, engine.py `_launch_subprocesses`,
http_server.py): it starts the children (children.py, ranks.py; their world: rendezvous.py,
gate.py), serves HTTP (endpoints.py), runs the SubprocessWatchdog (watchdog.py), stops as
SGLang stops (stopping.py, tokenizers.py), a port it cannot bind too (warmup.py). Contract:
supervisor/testing/__init__.py.
"""

from __future__ import annotations

import importlib.util
import math
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Sequence
from http.server import ThreadingHTTPServer
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import NoReturn

from supervisor.testing import endpoints, gpu_state, rendezvous, shm, stopping, topology
from supervisor.testing.args import PROG, SimArgs, SimArgsError, parse_sim_args
from supervisor.testing.children import ChildSpec, run_child
from supervisor.testing.endpoints import RankLink
from supervisor.testing.flood import start_flood
from supervisor.testing.layout import GB, server_info, size_server
from supervisor.testing.ranks import RankSpec, log, log_uvicorn
from supervisor.testing.scenario import Scenario, ScenarioError, parse_scenario
from supervisor.testing.stopping import TICK_S, SignalBox
from supervisor.testing.tokenizers import TokenizerWorkers
from supervisor.testing.warmup import warm_up_elsewhere
from supervisor.testing.watchdog import SubprocessWatchdog

USAGE = f"usage: {PROG} [-h] --model-path MODEL_PATH [--tp-size TP_SIZE] [--port PORT] ..."
DEFAULT_BYTES_PER_GB = 1 << 20  # 1 MiB of real memory per simulated GB
STARTUP_FAILURE = 3  # uvicorn/config.py: a server that cannot bind exits with it


def argparse_error(message: str) -> NoReturn:
    """Exit 2 the way SGLang's argparse does."""
    sys.stderr.write(f"{USAGE}\n{PROG}: error: {message}\n")
    sys.stderr.flush()
    sys.exit(2)


class Launcher:
    """SGLang's main process: start children, serve HTTP, watch children, stop."""

    def __init__(
        self, plan: SimArgs, scenario: Scenario, argv: Sequence[str], bytes_per_gb: int
    ) -> None:
        self.plan = plan
        self.scenario = scenario
        state = os.environ.get("FAKE_GPU_STATE_DIR")
        self.state_dir = Path(state) if state else None
        self.bytes_per_gb = bytes_per_gb
        gpus = gpu_state.read_gpus(self.state_dir) if self.state_dir else ()
        self.sizing = size_server(plan, scenario, gpus)
        self.info = server_info(plan, self.sizing, argv)
        self.procs = topology.process_plan(plan)
        self.instance_id = shm.new_instance_id()
        self.box = SignalBox(ignore_term_int=scenario.ignore_sigterm)
        # SGLang's scheduler_procs: the DP controller first, then the schedulers it launched.
        self.schedulers: list[tuple[str, BaseProcess, RankLink]] = []
        self.detokenizers: list[tuple[str, BaseProcess]] = []
        self._keep: list[RankLink] = []  # pipes to the other children, open while we live
        self.zombie: BaseProcess | None = None
        self.watchdog: SubprocessWatchdog | None = None
        self.view = endpoints.ServerView(plan, scenario, self.info, [])
        self.view.on_first_generate = self._loop_created

    def _scaled(self, size_bytes: float) -> int:
        return math.ceil(size_bytes * self.bytes_per_gb / GB)

    def _rank_specs(self) -> list[RankSpec]:
        s = self.sizing
        worlds = rendezvous.worlds(self.plan, self.scenario, len(self.procs.ranks))
        w = topology.widths(self.plan)
        return [
            RankSpec(
                title=place.title,
                log_prefix=place.log_prefix,
                rank=i,
                gpu_index=place.gpu,
                parent_pid=os.getpid(),
                scenario=self.scenario,
                state_dir=str(self.state_dir) if self.state_dir else None,
                pool_real_bytes=self._scaled(s.pool_bytes),
                runtime_real_bytes=self._scaled(self.scenario.runtime_gb * GB),
                gpu_total_bytes=s.gpu_total_bytes,
                memory=s.memory,
                broadcasts=self._broadcasts(i, place),
                draws_shard_bar=i == 0 and self.plan.node_rank == 0,
                world=worlds[i],
                loads=shm.load_snapshot(self.instance_id, place.loads_slot, w.num_dp_ranks),
            )
            for i, place in enumerate(self.procs.ranks)
        ]

    def _broadcasts(self, rank: int, place: topology.RankPlace) -> tuple[int | None, ...]:
        """The /dev/shm ring buffers rank `rank` writes (scaled real sizes; None: none, only the
        node check), or the scenario's `shm_segments` count on rank 0 instead."""
        wanted = self.scenario.shm_segments
        if wanted is not None:
            return (self._scaled(shm.mq_bytes(1)),) * wanted if rank == 0 else ()
        # environ.py EnvBool: an unparsable value falls back to the default (on).
        flag = os.environ.get("SGLANG_USE_MESSAGE_QUEUE_BROADCASTER", "true").lower()
        if flag in ("false", "0", "no", "n"):
            return ()
        return tuple(
            self._scaled(shm.mq_bytes(readers)) if readers else None for readers in place.broadcasts
        )

    def _spawn(self, spec: RankSpec | ChildSpec) -> tuple[BaseProcess, RankLink]:
        ctx = multiprocessing.get_context("spawn")
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=run_child, args=(spec, theirs), daemon=False)
        proc.start()
        theirs.close()
        return proc, RankLink(mine)

    def start_children(self) -> None:
        """_launch_scheduler_processes, then (head node only) the detokenizer(s)."""
        ranks = self._rank_specs()
        if self.procs.dp_controller:
            spawns = self.procs.controller_spawns_ranks
            proc, link = self._spawn(
                ChildSpec(
                    kind="dp_controller",
                    parent_pid=os.getpid(),
                    scenario=self.scenario,
                    ranks=tuple(ranks) if spawns else (),
                    groups=self.procs.dp_groups,
                )
            )
            self.schedulers.append(("scheduler_0", proc, link))
            ranks = [] if spawns else ranks
        for spec in ranks:
            proc, link = self._spawn(spec)
            self.schedulers.append((f"scheduler_{len(self.schedulers)}", proc, link))
            zombie = self.scenario.zombie
            if zombie is not None and zombie.rank == spec.rank:
                self.zombie = proc
        many = self.procs.detokenizers > 1
        for i in range(self.procs.detokenizers):
            proc, link = self._spawn(self._child("detokenizer"))
            self._keep.append(link)
            self.detokenizers.append((f"detokenizer_{i}" if many else "detokenizer", proc))
        if self.procs.detokenizer_router:
            proc, link = self._spawn(self._child("detokenizer_router"))
            self._keep.append(link)
            self.detokenizers.append(("detokenizer_router", proc))

    def _child(self, kind: str) -> ChildSpec:
        return ChildSpec(kind=kind, parent_pid=os.getpid(), scenario=self.scenario)

    def wait_ready(self) -> None:
        """_wait_for_scheduler_ready: a scheduler that dies first fails the launch."""
        pending = list(range(len(self.schedulers)))
        while pending:
            self._take_loading_signals()
            for j, (_name, proc, link) in enumerate(self.schedulers):
                if j in pending and link.conn.poll(TICK_S / len(self.schedulers)):
                    try:
                        link.conn.recv()
                        pending.remove(j)
                        continue
                    except EOFError:
                        pass
                if j in pending and not proc.is_alive():
                    proc.join(timeout=10)
                    raise RuntimeError(
                        f"Rank {j} scheduler died during initialization "
                        f"(exit code: {proc.exitcode}). If exit code is -9 (SIGKILL), a common "
                        "cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check."
                    )

    def _take_loading_signals(self) -> None:
        for signum, _ in self.box.take():
            if signum == signal.SIGQUIT:
                stopping.launch_phase_sigquit()

    def _watch(self, names: Sequence[str] | None = None) -> SubprocessWatchdog:
        watched = [(n, p) for n, p, _ in self.schedulers] + self.detokenizers
        if names is not None:
            watched = list(zip(names, (p for _, p in watched), strict=False))
        watchdog = SubprocessWatchdog(watched, never_reaped=self.zombie)
        watchdog.start()
        return watchdog

    def run(self) -> None:
        if self.scenario.shm_sweep:
            removed, freed = shm.sweep_stale()
            if removed:  # stale_shm_cleanup.py logs only when it removed something
                log(
                    "",
                    f"cleanup_stale_shm: removed {removed} stale segment(s), "
                    f"freed {freed / (1 << 20):.1f} MiB",
                )
        if self.state_dir is not None and self.scenario.hang_nvml_s is not None:
            gpu_state.set_nvml_hang(self.state_dir, self.scenario.hang_nvml_s)
        self.start_children()
        links = [link for _, _, link in self.schedulers]
        self.view.ranks = links
        self.view.prefill_prefix = self.procs.ranks[0].log_prefix if self.procs.ranks else ""
        self.wait_ready()
        if self.plan.node_rank >= 1:
            self.serve_worker_node()
            return
        self.watchdog = self._watch()
        if self.procs.tokenizer_workers:
            warmup = None if self.plan.skip_server_warmup else self.scenario.warmup_s
            TokenizerWorkers(
                count=self.procs.tokenizer_workers,
                scenario=self.scenario,
                view=self.view,
                box=self.box,
                shutdown_to=links,
            ).serve(self._bind, warmup)
        self.box.record(signal.SIGTERM, signal.SIGINT)  # uvicorn Server.capture_signals
        log_uvicorn("INFO", f"Started server process [{os.getpid()}]")
        log_uvicorn("INFO", "Waiting for application startup.")
        log_uvicorn("INFO", "Application startup complete.")
        self.serve(self._bind())

    def _loop_created(self) -> None:
        self.box.loop_created = True

    def _bind(self) -> ThreadingHTTPServer:
        """Listen, or fail as uvicorn does: the error, then exit 3 (STARTUP_FAILURE)."""
        try:
            http = endpoints.start_http(self.plan.host, self.plan.port, self.view)
        except OSError as exc:
            if self.procs.tokenizer_workers:
                log_uvicorn("ERROR", str(exc))  # Config.bind_socket's socket.bind
                sys.exit(STARTUP_FAILURE)
            log_uvicorn("ERROR", self._bind_error(exc))
            log_uvicorn("INFO", "Waiting for application shutdown.")
            if not self.plan.skip_server_warmup:  # the lifespan joins its warm-up thread
                warm_up_elsewhere(self.plan.host, self.plan.port, self.scenario.warmup_tries)
            log_uvicorn("INFO", "Application shutdown complete.")
            sys.exit(STARTUP_FAILURE)
        log_uvicorn(
            "INFO",
            f"Uvicorn running on http://{self.plan.host}:{self.plan.port} (Press CTRL+C to quit)",
        )
        return http

    def _bind_error(self, exc: OSError) -> str:
        """The event loop's create_server error, as uvicorn's Server.startup logs it."""
        reason = exc.strerror.lower() if exc.strerror else str(exc)
        return (
            f"[Errno {exc.errno}] error while attempting to bind on address "
            f"('{self.plan.host}', {self.plan.port}): {reason}"
        )

    def serve(self, http: ThreadingHTTPServer) -> None:
        """uvicorn's main loop with the warmup thread and the tokenizer manager's handlers."""
        warm_at = time.monotonic() + self.scenario.warmup_s
        if self.plan.skip_server_warmup:
            self._fired_up()
        drain: stopping.Drain | None = None
        while True:
            for signum, loop_created in self.box.take():
                drain = self._on_signal(http, signum, loop_created, drain)
            if self.view.status == endpoints.STARTING and time.monotonic() >= warm_at:
                self._loop_created()  # the warmup's POST /generate
                self._fired_up()
            if drain is not None and drain.step():
                links = [link for _, _, link in self.schedulers]
                stopping.finish_drain(self.view, self.watchdog, links, self.scenario, http)
            time.sleep(TICK_S)

    def _fired_up(self) -> None:
        self.view.set_up()
        log("", "The server is fired up and ready to roll!")

    def _on_signal(
        self,
        http: ThreadingHTTPServer,
        signum: int,
        loop_created: bool,
        drain: stopping.Drain | None,
    ) -> stopping.Drain | None:
        if signum == signal.SIGQUIT and loop_created:
            stopping.running_phase_sigquit(self.view, self.watchdog, self.scenario)
        elif signum == signal.SIGQUIT:
            stopping.launch_phase_sigquit()
        if signum == signal.SIGTERM and loop_created:
            log(
                "",
                "SIGTERM received. signum=None frame=None. Draining requests and shutting down...",
            )
            self.view.gracefully_exit = True
            return drain or stopping.Drain(self.view, self.scenario)
        warming = self.view.status == endpoints.STARTING and not self.plan.skip_server_warmup
        where = f"{self.plan.host}:{self.plan.port}" if warming else None
        stopping.uvicorn_shutdown(http, self.view, wait=True, warming=where)
        stopping.raise_again(signum)
        return drain

    def serve_worker_node(self) -> None:
        """node_rank >= 1: the dummy health server, then block until the schedulers exit."""
        self.box.record(signal.SIGTERM)  # engine.py: log only, rank 0's ShutdownReq stops us
        host_port = f"{self.plan.host}:{self.plan.port}"
        try:
            endpoints.start_http(self.plan.host, self.plan.port, self.view)
            log("", f"Dummy health check server started in background thread at {host_port}")
        except OSError as exc:  # uvicorn's thread ends; the node keeps running without HTTP
            log_uvicorn("ERROR", self._bind_error(exc))
            log("", f"Dummy health check server stopped at {host_port}")
        self.view.set_up()
        if self.procs.dp_controller and not self.procs.controller_spawns_ranks:
            self.watchdog = self._watch([f"process_{i}" for i in range(len(self.schedulers))])
        pending = [proc for _, proc, _ in self.schedulers]
        while pending:
            for signum, _ in self.box.take():
                if signum == signal.SIGQUIT:
                    stopping.launch_phase_sigquit()
                log(
                    "",
                    f"SIGTERM received on node_rank {self.plan.node_rank}; waiting for the rank-0 "
                    "ShutdownReq broadcast to stop the schedulers.",
                )
            if pending[0] is not self.zombie and not pending[0].is_alive():
                proc = pending.pop(0)
                log(
                    "",
                    f"Scheduler or DataParallelController {proc.pid} "
                    f"terminated with {proc.exitcode}",
                )
            time.sleep(TICK_S)


def _read_environment(argv: list[str]) -> tuple[Scenario, SimArgs, int]:
    try:
        scenario = parse_scenario(os.environ.get("FAKE_SGLANG_SCENARIO"))
    except ScenarioError as exc:
        sys.stderr.write(f"fake_sglang: {exc}\n")
        sys.exit(2)
    if importlib.util.find_spec("setproctitle") is None:
        sys.stderr.write(
            "fake_sglang: the simulation titles its processes with setproctitle: "
            "pip install 'sglang-supervisor[testing]'\n"
        )
        sys.exit(1)
    raw_scale = os.environ.get("FAKE_SGLANG_BYTES_PER_GB", str(DEFAULT_BYTES_PER_GB))
    if not raw_scale.isdigit():
        sys.stderr.write(
            f"fake_sglang: FAKE_SGLANG_BYTES_PER_GB must be a byte count, not {raw_scale!r}\n"
        )
        sys.exit(2)
    state = os.environ.get("FAKE_GPU_STATE_DIR")
    problem = gpu_state.state_dir_problem(Path(state)) if state else None
    if problem is not None:  # before anything starts: a typo must not read as a traceback
        sys.stderr.write(f"fake_sglang: FAKE_GPU_STATE_DIR: {problem}\n")
        sys.exit(2)
    rejected = [t for t in argv if t.startswith("--") and t.split("=", 1)[0] in scenario.bad_flags]
    if rejected:
        argparse_error(f"unrecognized arguments: {' '.join(rejected)}")
    try:
        plan = parse_sim_args(argv)
    except SimArgsError as exc:
        argparse_error(str(exc))
    return scenario, plan, int(raw_scale)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    scenario, plan, bytes_per_gb = _read_environment(args)
    launcher = Launcher(plan, scenario, args, bytes_per_gb)
    launcher.box.record(signal.SIGQUIT)  # engine.py launch_phase_sigquit_handler
    # SGLang 0.5.23 prints the api key here in clear (ServerArgs.resolved_dict): so does this, so
    # that the supervisor's masking of the server's output is tested for real.
    shown = {
        "model_path": plan.model_path,
        "tp_size": plan.tp_size,
        "dp_size": plan.dp_size,
        "pp_size": plan.pp_size,
        "host": plan.host,
        "port": plan.port,
        "node_rank": plan.node_rank,
        "api_key": plan.api_key,
    }
    log("", f"server_args={shown!r}")
    for line in scenario.log_lines:  # what a library's debug output may reveal (secrets, say)
        log("", os.path.expandvars(line))
    start_flood(scenario.output_flood)
    try:
        launcher.run()
    finally:
        stopping.kill_process_tree(include_parent=False)  # launch_server.py


if __name__ == "__main__":
    main()
