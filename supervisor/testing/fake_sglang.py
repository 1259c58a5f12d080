"""The simulated SGLang server: `python -m supervisor.testing.fake_sglang <launch_server args>`.

The main process plays SGLang's launcher (HTTP, SubprocessWatchdog, signals, crash path); ranks
and the detokenizer run in supervisor/testing/ranks.py. Contract: supervisor/testing/__init__.py.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import psutil

from supervisor.core import fit, model_geometry
from supervisor.core.sglang_args import ArgvError, LaunchPlan, parse_launch_args
from supervisor.core.units import GB
from supervisor.testing import endpoints, gpu_state
from supervisor.testing.ranks import RankSpec, log, run_child
from supervisor.testing.scenario import Scenario, ScenarioError, parse_scenario

PROG = "launch_server.py"
USAGE = f"usage: {PROG} [-h] --model-path MODEL_PATH [--tp-size TP_SIZE] [--port PORT] ..."
DEFAULT_BYTES_PER_GB = 1 << 20  # 1 MiB of real memory per simulated GB
# Used when --model-path has no readable config.json: Llama-3-70B geometry (sglang.md §7).
DEFAULT_MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "head_dim": 128,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 131072,
}
# How often the main process checks its children (SGLang's SubprocessWatchdog: 1 s, PR #18582).
WATCHDOG_INTERVAL_S = 0.05
# How long a graceful shutdown waits for the children before SIGKILL (SGLang: 15 s + 60 s).
SHUTDOWN_WAIT_S = 5.0


class StartupFailed(Exception):
    def __init__(self, exit_code: int) -> None:
        super().__init__(exit_code)
        self.exit_code = exit_code


def argparse_error(message: str) -> None:
    """Exit 2 the way SGLang's argparse does."""
    sys.stderr.write(f"{USAGE}\n{PROG}: error: {message}\n")
    sys.stderr.flush()
    sys.exit(2)


def scheduler_title(plan: LaunchPlan, dp_rank: int, pp_rank: int, tp_rank: int) -> str:
    """SGLang's scheduler title: sglang::scheduler + _DP/_PP/_TP/_EP parts (sglang.md §3)."""
    title = "sglang::scheduler"
    if plan.dp_size > 1:
        title += f"_DP{dp_rank}"
    if plan.pp_size > 1:
        title += f"_PP{pp_rank}"
    if plan.tp_size > 1:
        title += f"_TP{tp_rank}"
    if plan.ep_size > 1:
        title += f"_EP{tp_rank % plan.ep_size}"
    return title


def local_ranks(plan: LaunchPlan) -> list[tuple[str, str, int]]:
    """(title, log prefix, gpu index) for each scheduler on this node, in SGLang's order."""
    tp_per_node = max(1, plan.tp_size // plan.nnodes) if plan.pp_size == 1 else plan.tp_size
    pp_per_node = max(1, plan.pp_size // plan.nnodes) if plan.pp_size > 1 else 1
    node_pp0 = plan.node_rank * pp_per_node if plan.pp_size > 1 else 0
    node_tp0 = plan.node_rank * tp_per_node if plan.pp_size == 1 else 0
    gpus = plan.local_gpu_ids()
    out: list[tuple[str, str, int]] = []
    attn_dp = plan.attn_dp_size if plan.attn_dp_size > 1 else plan.dp_size
    for replica in range(plan.data_parallel_replicas):
        for pp in range(pp_per_node):
            for tp in range(tp_per_node):
                tp_rank, pp_rank = node_tp0 + tp, node_pp0 + pp
                if plan.data_parallel_replicas > 1:
                    dp_rank = replica
                else:  # DP attention: the dp rank is a slice of the TP group
                    dp_rank = tp_rank // max(1, plan.tp_size // attn_dp)
                title = scheduler_title(plan, dp_rank, pp_rank, tp_rank)
                prefix = title.removeprefix("sglang::scheduler_").replace("_", " ")
                out.append((title, "" if prefix == "sglang::scheduler" else prefix, gpus[len(out)]))
    return out


def _load_model_config(model_path: str) -> dict[str, Any]:
    try:
        from supervisor.adapters.model_config import load_model_config

        return dict(load_model_config(model_path).config)
    except Exception:  # noqa: BLE001 - any model the fake cannot read gets the default geometry
        return dict(DEFAULT_MODEL_CONFIG)


@dataclass(frozen=True, slots=True, kw_only=True)
class Sizing:
    bytes_per_token: int
    device_tokens: int
    pool_tokens: int
    pool_bytes: int
    gpu_total_bytes: int
    gpu_used_bytes: int
    attention_kind: str


def size_server(plan: LaunchPlan, scenario: Scenario, config: dict[str, Any], gpus: Any) -> Sizing:
    """Device tokens and host pool per rank with the pre-flight's arithmetic (core.fit)."""
    try:
        bpt = model_geometry.bytes_per_token_per_rank(config, plan)
        indexer = model_geometry.indexer_bytes_per_token_per_rank(config, plan)
        mla = model_geometry.is_mla(config)
        kind = model_geometry.attention_kind(config)
    except model_geometry.GeometryError:
        config = DEFAULT_MODEL_CONFIG
        bpt = model_geometry.bytes_per_token_per_rank(config, plan)
        indexer, mla, kind = 0, False, "mha"
    total = scenario.gpu_total_bytes or (
        min(g.total_bytes for g in gpus) if gpus else gpu_state.DEFAULT_TOTAL_BYTES
    )
    fraction = plan.mem_fraction_static or fit.auto_mem_fraction_static(total, plan, mla=mla)
    device_tokens = scenario.max_total_num_tokens or fit.estimate_device_tokens(
        gpu_free_bytes=total - gpu_state.DEFAULT_BASELINE_USED_BYTES,
        weights_per_rank_bytes=scenario.weight_bytes_per_rank,
        mem_fraction_static=fraction,
        bytes_per_token=bpt,
        page_size=plan.effective_page_size,
        max_total_tokens=plan.max_total_tokens,
    )
    pool_tokens = fit.host_pool_tokens(plan, bpt, device_tokens)
    return Sizing(
        bytes_per_token=bpt,
        device_tokens=device_tokens,
        pool_tokens=pool_tokens,
        pool_bytes=pool_tokens * (bpt + indexer),
        gpu_total_bytes=total,
        gpu_used_bytes=int(total * fraction),
        attention_kind=kind,
    )


def _info(plan: LaunchPlan, sizing: Sizing, argv: Sequence[str]) -> dict[str, Any]:
    model_path = plan.model_path or ""
    served = plan.served_model_name or model_path
    kv_gb = sizing.device_tokens * sizing.bytes_per_token / GB
    server_info = {
        "model_path": model_path,
        "served_model_name": served,
        "tp_size": plan.tp_size,
        "dp_size": plan.dp_size,
        "pp_size": plan.pp_size,
        "nnodes": plan.nnodes,
        "node_rank": plan.node_rank,
        "host": plan.host,
        "port": plan.port,
        "base_gpu_id": plan.base_gpu_id,
        "gpu_id_step": plan.gpu_id_step,
        "page_size": plan.effective_page_size,
        "enable_hierarchical_cache": plan.enable_hierarchical_cache,
        "hicache_ratio": plan.hicache_ratio,
        "hicache_size": plan.hicache_size_gb,
        "enable_metrics": plan.enable_metrics,
        "max_total_num_tokens": sizing.device_tokens,
        "internal_states": [{"max_total_num_tokens": sizing.device_tokens}],
        "version": "0.5.23 (simulated)",
    }
    return {
        "served_model_name": served,
        "max_total_num_tokens": sizing.device_tokens,
        "hicache_host_total_tokens": sizing.pool_tokens,
        "kv_cache_gb": round(kv_gb, 2),
        "server_info": server_info,
        "model_info": {
            "model_path": model_path,
            "tokenizer_path": model_path,
            "is_generation": True,
            "served_model_name": served,
            "architectures": ["FakeForCausalLM"],
        },
        "models": {
            "object": "list",
            "data": [{"id": served, "object": "model", "owned_by": "sglang", "root": served}],
        },
    }


def _exit_code(proc: BaseProcess) -> int | None:
    """Reap `proc` if it exited (is_alive waits WNOHANG) and return its exit code."""
    return None if proc.is_alive() else proc.exitcode


class Launcher:
    """SGLang's main process: start children, serve HTTP, watch children, handle signals."""

    def __init__(self, plan: LaunchPlan, scenario: Scenario, argv: Sequence[str]) -> None:
        self.plan = plan
        self.scenario = scenario
        state = os.environ.get("FAKE_GPU_STATE_DIR")
        self.state_dir = Path(state) if state else None
        self.bytes_per_gb = int(os.environ.get("FAKE_SGLANG_BYTES_PER_GB", DEFAULT_BYTES_PER_GB))
        gpus = gpu_state.read_gpus(self.state_dir) if self.state_dir else ()
        self.sizing = size_server(plan, scenario, _load_model_config(plan.model_path or ""), gpus)
        self.info = _info(plan, self.sizing, argv)
        self.children: list[tuple[str, BaseProcess, Connection]] = []
        self.signals: list[int] = []
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
        while self.signals:
            sig = self.signals.pop(0)
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
                    self.signals.append(signal.SIGQUIT)

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
    rejected = [t for t in argv if t.startswith("--") and t.split("=", 1)[0] in scenario.bad_flags]
    if rejected:
        argparse_error(f"unrecognized arguments: {' '.join(rejected)}")
    try:
        plan = parse_launch_args(argv)
    except ArgvError as exc:
        argparse_error(str(exc))
    if not plan.model_path:
        argparse_error("the following arguments are required: --model-path/--model")
    launcher = Launcher(plan, scenario, argv)
    if scenario.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda sig, _f: launcher.signals.append(sig))
        signal.signal(signal.SIGINT, lambda sig, _f: launcher.signals.append(sig))
    signal.signal(signal.SIGQUIT, lambda sig, _f: launcher.signals.append(sig))
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
