"""The simulated SGLang server: `python -m supervisor.testing.fake_sglang <launch_server args>`.

The main process plays SGLang's launcher (HTTP, SubprocessWatchdog, signals, crash path); ranks
and the detokenizer run in supervisor/testing/ranks.py. Contract: supervisor/testing/__init__.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import multiprocessing
import os
import queue
import signal
import sys
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import NoReturn

import psutil

from supervisor.testing import endpoints, gpu_state
from supervisor.testing.args import PROG, SimArgs, SimArgsError, parse_sim_args
from supervisor.testing.layout import GB, local_ranks, server_info, size_server
from supervisor.testing.ranks import RankSpec, log, run_child
from supervisor.testing.scenario import Scenario, ScenarioError, parse_scenario

USAGE = f"usage: {PROG} [-h] --model-path MODEL_PATH [--tp-size TP_SIZE] [--port PORT] ..."
DEFAULT_BYTES_PER_GB = 1 << 20  # 1 MiB of real memory per simulated GB
# How often the main process checks its children (SGLang's SubprocessWatchdog: 1 s, PR #18582).
WATCHDOG_INTERVAL_S = 0.05
# How long a graceful shutdown waits for the children before SIGKILL (SGLang: 15 s + 60 s).
SHUTDOWN_WAIT_S = 5.0


class StartupFailed(Exception):
    def __init__(self, exit_code: int) -> None:
        super().__init__(exit_code)
        self.exit_code = exit_code


def argparse_error(message: str) -> NoReturn:
    """Exit 2 the way SGLang's argparse does."""
    sys.stderr.write(f"{USAGE}\n{PROG}: error: {message}\n")
    sys.stderr.flush()
    sys.exit(2)


def _exit_code(proc: BaseProcess) -> int | None:
    """Reap `proc` if it exited (is_alive waits WNOHANG) and return its exit code."""
    return None if proc.is_alive() else proc.exitcode


class Launcher:
    """SGLang's main process: start children, serve HTTP, watch children, handle signals."""

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
        self.children: list[tuple[str, BaseProcess, Connection]] = []
        # Signal handlers only record; the main loop acts (as gunicorn does).
        self.signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.exited: set[str] = set()

    def _scaled(self, size_bytes: float) -> int:
        return math.ceil(size_bytes * self.bytes_per_gb / GB)

    def _spec(self, kind: str, title: str, prefix: str, rank: int, gpu: int) -> RankSpec:
        s = self.sizing
        return RankSpec(
            kind=kind,
            title=title,
            log_prefix=prefix,
            rank=rank,
            gpu_index=gpu,
            parent_pid=os.getpid(),
            scenario=self.scenario,
            state_dir=str(self.state_dir) if self.state_dir else None,
            pool_real_bytes=self._scaled(s.pool_bytes),
            pool_tokens=s.pool_tokens,
            pool_gb=s.pool_bytes / GB,
            attention_kind=s.attention_kind,
            runtime_real_bytes=self._scaled(self.scenario.runtime_gb * GB),
            gpu_used_bytes=s.gpu_used_bytes,
            gpu_total_bytes=s.gpu_total_bytes,
            device_tokens=s.device_tokens,
            kv_gb=s.device_tokens * s.bytes_per_token / GB,
        )

    def start_children(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        specs = [
            self._spec("scheduler", title, prefix, i, gpu)
            for i, (title, prefix, gpu) in enumerate(local_ranks(self.plan))
        ]
        specs.append(self._spec("detokenizer", "sglang::detokenizer", "", -1, -1))
        for spec in specs:
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=run_child, args=(spec, child_end), daemon=False)
            proc.start()
            child_end.close()
            name = f"scheduler_{spec.rank}" if spec.kind == "scheduler" else "detokenizer"
            self.children.append((name, proc, parent_end))

    def wait_ready(self) -> None:
        """Wait for every child's "ready" (loading), failing like SGLang when one dies."""
        pending = {name for name, _, _ in self.children}
        while pending:
            self._take_signals(loading=True)
            for name, proc, conn in self.children:
                if name in pending and conn.poll(WATCHDOG_INTERVAL_S / len(self.children)):
                    try:
                        conn.recv()
                        pending.discard(name)
                        continue
                    except EOFError:
                        pass
                if name in pending and not proc.is_alive():
                    code = proc.exitcode if proc.exitcode is not None else -1
                    what = name.replace("scheduler_", "Rank ") + (
                        " scheduler" if name.startswith("scheduler_") else ""
                    )
                    log("", f"{what} died during initialization (exit code: {code})")
                    self.kill_tree(include_self=False)
                    on_start = self.scenario.exit_code_on_start
                    raise StartupFailed(on_start if on_start is not None else 1)

    def _take_signals(self, *, loading: bool = False) -> None:
        while not self.signals.empty():
            sig = self.signals.get_nowait()
            if sig == signal.SIGQUIT:
                self.crash_path()
            elif sig in (signal.SIGTERM, signal.SIGINT):
                self.shutdown(drain=not loading)

    def kill_tree(self, *, include_self: bool) -> None:
        """SGLang's kill_process_tree: SIGKILL every descendant (psutil walk), then maybe self."""
        try:
            descendants = psutil.Process().children(recursive=True)
        except psutil.Error:
            descendants = []
        for child in descendants:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(descendants, timeout=5.0)
        if include_self:
            os.kill(os.getpid(), signal.SIGKILL)

    def crash_path(self) -> None:
        """SIGQUIT from a rank or the watchdog: freeze HTTP, wait, kill everything, self too."""
        self.view.set_phase(endpoints.PHASE_CRASHING)
        log("", "Received sigquit from a child process. It usually means the child failed.")
        time.sleep(self.scenario.crash_dump_wait_s)  # stands for py-spy dump + coredump wait
        self.kill_tree(include_self=True)

    def shutdown(self, *, drain: bool) -> None:
        """SIGTERM: /health 503, drain, ask the children to exit, then kill what is left."""
        if hasattr(self, "view"):
            self.view.set_phase(endpoints.PHASE_DRAINING)
        log("", "Received SIGTERM. Gracefully exiting... Remaining number of requests 0")
        if drain:
            time.sleep(self.scenario.drain_s)  # stands for SGLang's drain polls and 15 s wait
        for _, proc, conn in self.children:
            if proc.is_alive():
                with contextlib.suppress(OSError):
                    conn.send("shutdown")
        deadline = time.monotonic() + SHUTDOWN_WAIT_S
        for _, proc, _ in self.children:
            proc.join(max(0.0, deadline - time.monotonic()))
        self.kill_tree(include_self=False)
        sys.exit(0)

    def watch(self) -> None:
        """SubprocessWatchdog: a child that exits non-zero starts the crash path."""
        zombie = self.scenario.zombie
        skip = f"scheduler_{zombie.rank}" if zombie is not None else None
        while True:
            self._take_signals()
            time.sleep(WATCHDOG_INTERVAL_S)
            for name, proc, _ in self.children:
                if name == skip or name in self.exited:
                    continue
                code = _exit_code(proc)
                if code is None:
                    continue
                self.exited.add(name)
                if code != 0:
                    log("", f"Subprocess {name} (pid={proc.pid}) crashed with exit code {code}")
                    self.signals.put(signal.SIGQUIT)

    def run(self) -> None:
        plan = self.plan
        if self.state_dir is not None and self.scenario.hang_nvml_s is not None:
            gpu_state.set_nvml_hang(self.state_dir, self.scenario.hang_nvml_s)
        self.start_children()
        ranks = [
            endpoints.RankLink(conn) for name, _, conn in self.children if name != "detokenizer"
        ]
        self.view = endpoints.ServerView(plan, self.scenario, self.info, ranks)
        self.wait_ready()
        try:
            endpoints.start_http(plan.host, plan.port, self.view)
        except OSError as exc:
            log(
                "",
                f"[Errno {exc.errno}] error while attempting to bind on address "
                f"('{plan.host}', {plan.port}): {exc.strerror.lower() if exc.strerror else exc}",
            )
            self.kill_tree(include_self=False)
            sys.exit(1)
        log("", f"Uvicorn running on http://{plan.host}:{plan.port} (Press CTRL+C to quit)")
        if not plan.skip_server_warmup:
            log("", "Start of prefill warmup ...")
            deadline = time.monotonic() + self.scenario.warmup_s
            while time.monotonic() < deadline:
                self._take_signals()
                time.sleep(min(WATCHDOG_INTERVAL_S, max(0.0, deadline - time.monotonic())))
        self.view.set_phase(endpoints.PHASE_UP)
        log("", "The server is fired up and ready to roll!")
        self.watch()


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
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
    rejected = [t for t in argv if t.startswith("--") and t.split("=", 1)[0] in scenario.bad_flags]
    if rejected:
        argparse_error(f"unrecognized arguments: {' '.join(rejected)}")
    try:
        plan = parse_sim_args(argv)
    except SimArgsError as exc:
        argparse_error(str(exc))
    launcher = Launcher(plan, scenario, argv, int(raw_scale))
    # SGLang's worker nodes (node_rank >= 1) ignore SIGTERM (docs/sglang.md §3.1).
    if scenario.ignore_sigterm or plan.node_rank >= 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda sig, _f: launcher.signals.put(sig))
        signal.signal(signal.SIGINT, lambda sig, _f: launcher.signals.put(sig))
    signal.signal(signal.SIGQUIT, lambda sig, _f: launcher.signals.put(sig))
    log(
        "",
        f"server_args=ServerArgs(model_path='{plan.model_path}', tp_size={plan.tp_size}, "
        f"dp_size={plan.dp_size}, pp_size={plan.pp_size}, host='{plan.host}', port={plan.port})",
    )
    try:
        launcher.run()
    except StartupFailed as exc:
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
