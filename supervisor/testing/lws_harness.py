"""An N-node SGLang group on one machine, with this harness playing LeaderWorkerSet's part.

Each "node" (a pod in LWS) is one real `python -m supervisor run` process with its own simulated
GPUs, state directory, SGLang --port and supervisor listener (`[http] listen`), started with the
variables LWS injects (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX; 0 is the leader) and
the group token. The supervisor fills SGLang's --nnodes, --node-rank and --dist-init-addr itself;
every node of the group shares one dist-init port and one gate port.

Two modes:
    recreate  LWS's `restartPolicy: RecreateGroupOnPodRestart`: when any node's supervisor exits,
              the others get SIGTERM (SIGKILL after `termination_grace_s`, the pod's
              terminationGracePeriodSeconds), and once all are gone the group starts again as
              generation + 1 with the same state directories and GPUs (LWS keeps the hostPath);
              at most `max_recreations` times.
    observe   nobody is stopped: every node has to end by itself when a peer dies.

When a node's supervisor has ended, the processes of its pod still alive (found by a marker in
their environment) are SIGKILLed, as deleting a pod kills its whole container; they are recorded
in `NodeRun.leftover_pids`, so a test can tell that a supervisor left nothing behind.

The harness does not know the product's internals: it reads the supervisor's JSON log lines and
its HTTP listener, as an operator would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from supervisor.testing import gpu_state
from supervisor.testing.lws_config import DEFAULT_CONFIG, Sections, config_toml, group_ports, merge
from supervisor.testing.lws_pod import POD_ENV, NodeRun, pod_pids

Mode = Literal["recreate", "observe"]
PerNode = Callable[[int, int], Mapping[str, Any]]  # (node_rank, generation) -> value

TOKEN_ENV = "SGLANG_SUPERVISOR_GROUP_TOKEN"
# Variables of the other launchers a supervisor could detect (LWS is the one played here), and a
# systemd socket the harness's own process may have: never inherited by a node.
_FOREIGN_ENV_PREFIXES = ("LWS_", "RBG_LWP_", "SKYPILOT_", "SGLANG_SUPERVISOR_GROUP_")
_FOREIGN_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID")
# A dead pod's processes are already dying (PDEATHSIG, a killed group): they get this long to go
# before they count as left behind.
_POD_GONE_S = 3.0
_POLL_S = 0.02


def _per_node(value: PerNode | Mapping[str, Any] | None) -> PerNode:
    if callable(value):
        return value
    fixed = dict(value or {})
    return lambda _rank, _generation: fixed


class Group:
    """The group's nodes, generation by generation; a context manager that leaves nothing."""

    def __init__(
        self,
        workdir: Path,
        *,
        model_config: Path,
        size: int = 2,
        mode: Mode = "recreate",
        server_args: Sequence[str] = ("--tp", "2"),
        config: Sections = DEFAULT_CONFIG,
        node_config: PerNode | Sections | None = None,
        scenario: PerNode | Mapping[str, Any] | None = None,
        gpus_per_node: int = 2,
        bytes_per_gb: int = 16 * 1024,
        max_recreations: int = 2,
        termination_grace_s: float = 30.0,
        env: Mapping[str, str] | None = None,
        name: str | None = None,
    ) -> None:
        if size < 1 or mode not in ("recreate", "observe"):
            raise ValueError(f"a group needs size >= 1 and mode recreate|observe, not {mode!r}")
        self.workdir, self.size, self.mode = workdir, size, mode
        self.model_config, self.server_args = model_config, tuple(server_args)
        self.config, self.env = config, dict(env or os.environ)
        self.node_config, self.scenario = _per_node(node_config), _per_node(scenario)
        self.gpus_per_node, self.bytes_per_gb = gpus_per_node, bytes_per_gb
        self.max_recreations, self.termination_grace_s = max_recreations, termination_grace_s
        self.name = name or f"lws-{uuid.uuid4().hex[:8]}"
        self.token = uuid.uuid4().hex
        ports = group_ports(size)
        self.sglang_ports, self.http_ports, self.dist_init_port, self.gate_port = ports
        self.generations: list[list[NodeRun]] = []
        self.recreations_exhausted = False
        self._changed = threading.Condition()
        self._closing = threading.Event()  # no more recreations
        self._hurry = threading.Event()  # close(): no more grace either
        self._watcher: threading.Thread | None = None
        self._failure: BaseException | None = None

    # -- layout --------------------------------------------------------------------------

    def instance_name(self, node_rank: int) -> str:
        """`[run] name` of a node: cgroups and leftover markers are per instance."""
        return f"{self.name}-n{node_rank}"

    def node_dir(self, node_rank: int) -> Path:
        return self.workdir / f"node{node_rank}"

    def state_dir(self, node_rank: int) -> Path:
        return self.node_dir(node_rank) / "state"

    def gpu_dir(self, node_rank: int) -> Path:
        return self.node_dir(node_rank) / "gpus"

    def node_sections(self, node_rank: int, generation: int) -> dict[str, dict[str, Any]]:
        """The node's config: the base, the harness's keys, then the node's own overrides."""
        own: Sections = {
            "run": {"name": self.instance_name(node_rank), "state_dir": "{state_dir}"},
            "http": {"listen": f"127.0.0.1:{self.http_ports[node_rank]}"},
            "gpu": {"backend": "sim"},
            "group": {
                "mode": "lws",
                "dist_init_port": self.dist_init_port,
                "gate_port": self.gate_port,
                "leader_port": self.http_ports[0],
            },
        }
        return merge(self.config, own, self.node_config(node_rank, generation))

    def node_env(self, node_rank: int, generation: int) -> dict[str, str]:
        env = {
            k: v
            for k, v in self.env.items()
            if not k.startswith(_FOREIGN_ENV_PREFIXES) and k not in _FOREIGN_ENV
        }
        env.update(
            LWS_LEADER_ADDRESS="127.0.0.1",
            LWS_GROUP_SIZE=str(self.size),
            LWS_WORKER_INDEX=str(node_rank),
            FAKE_SGLANG_SCENARIO=json.dumps(dict(self.scenario(node_rank, generation))),
            FAKE_SGLANG_BYTES_PER_GB=str(self.bytes_per_gb),
            FAKE_GPU_STATE_DIR=str(self.gpu_dir(node_rank)),
        )
        env[TOKEN_ENV] = self.token
        env[POD_ENV] = f"{self.name}/g{generation}/n{node_rank}"
        return env

    # -- starting ------------------------------------------------------------------------

    def __enter__(self) -> Group:
        try:
            for rank in range(self.size):
                self.node_dir(rank).mkdir(parents=True, exist_ok=True)
                gpu_state.create_gpus(self.gpu_dir(rank), self.gpus_per_node)
            self._start_generation(0)
            if self.mode == "recreate":
                self._watcher = threading.Thread(target=self._watch, name="lws", daemon=True)
                self._watcher.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _start_generation(self, generation: int) -> None:
        runs = [self._start_node(rank, generation) for rank in range(self.size)]
        with self._changed:
            self.generations.append(runs)
            self._changed.notify_all()

    def _start_node(self, node_rank: int, generation: int) -> NodeRun:
        base = self.node_dir(node_rank) / f"gen{generation}"
        config_path, log_path = base.with_suffix(".toml"), base.with_suffix(".log")
        self._write_config(config_path, node_rank, self.node_sections(node_rank, generation))
        argv = [sys.executable, "-m", "supervisor", "run", "--config", str(config_path)]
        argv += ["--server-command", f"{sys.executable} -m supervisor.testing.fake_sglang"]
        argv += ["--log-format", "json", "--", "--model-path", "fake/model"]
        argv += ["--port", str(self.sglang_ports[node_rank]), *self.server_args]
        env = self.node_env(node_rank, generation)
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        return NodeRun(
            node_rank=node_rank,
            generation=generation,
            proc=proc,
            log_path=log_path,
            config_path=config_path,
            state_dir=self.state_dir(node_rank),
            gpu_dir=self.gpu_dir(node_rank),
            sglang_port=self.sglang_ports[node_rank],
            http_port=self.http_ports[node_rank],
            pod=env[POD_ENV],
        )

    def _write_config(self, path: Path, node_rank: int, sections: Sections) -> None:
        fill = {"state_dir": str(self.state_dir(node_rank)), "model_config": str(self.model_config)}
        path.write_text(config_toml(sections, fill))

    def reconfigure(self, node_rank: int, changes: Sections) -> NodeRun:
        """Edit a running node's config file (`changes` on top of what it was started with) and
        send it SIGHUP, as an operator editing the ConfigMap and reloading would."""
        run = self.node(node_rank)
        sections = merge(self.node_sections(node_rank, run.generation), changes)
        self._write_config(run.config_path, node_rank, sections)
        run.signal(signal.SIGHUP)
        return run

    # -- LWS's controller (recreate mode) -------------------------------------------------

    def _watch(self) -> None:
        try:
            while not self._closing.wait(_POLL_S):
                runs = self.nodes
                if not any(run.proc.poll() is not None for run in runs):
                    continue
                self._delete_generation(runs, self.termination_grace_s)
                if self._closing.is_set():
                    return
                if len(self.generations) > self.max_recreations:
                    with self._changed:
                        self.recreations_exhausted = True
                        self._changed.notify_all()
                    return
                self._start_generation(len(self.generations))
        except Exception as exc:  # noqa: BLE001 - reported by the next wait_* or close()
            with self._changed:
                self._failure = exc
                self._changed.notify_all()

    def _delete_generation(self, runs: Sequence[NodeRun], grace_s: float) -> None:
        """Delete every pod of the group: SIGTERM, SIGKILL after `grace_s`, wait for all."""
        for run in runs:
            if run.proc.poll() is None:
                run.stopped_by_harness = True
                run.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        in_watcher = threading.current_thread() is self._watcher
        while any(run.proc.poll() is None for run in runs) and time.monotonic() < deadline:
            if in_watcher and self._hurry.is_set():
                break
            time.sleep(_POLL_S)  # polling the pods' exits, bounded by the grace
        for run in runs:
            if run.proc.poll() is None:
                run.proc.kill()
            run.proc.wait()
            self._end_pod(run)

    def _end_pod(self, run: NodeRun) -> None:
        """The container is gone: whatever of the pod still runs is SIGKILLed and recorded."""
        deadline = time.monotonic() + _POD_GONE_S
        while (left := pod_pids(run.pod)) and time.monotonic() < deadline:
            time.sleep(_POLL_S)  # processes already on their way out (bounded)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        run.leftover_pids = tuple(left)

    # -- reading and waiting --------------------------------------------------------------

    @property
    def nodes(self) -> list[NodeRun]:
        """The nodes of the current (latest) generation, leader first."""
        with self._changed:
            return list(self.generations[-1]) if self.generations else []

    @property
    def generation(self) -> int:
        with self._changed:
            return len(self.generations) - 1

    def node(self, node_rank: int, generation: int | None = None) -> NodeRun:
        with self._changed:
            return self.generations[-1 if generation is None else generation][node_rank]

    def wait_generation(self, generation: int, timeout_s: float = 120.0) -> list[NodeRun]:
        """Wait until generation `generation` was started; its nodes."""
        with self._changed:
            done = self._changed.wait_for(
                lambda: (
                    self._failure is not None
                    or len(self.generations) > generation
                    or self.recreations_exhausted
                ),
                timeout=timeout_s,
            )
            self._raise_failure()
            if len(self.generations) <= generation:
                why = "recreations exhausted" if done else f"timed out after {timeout_s} s"
                raise AssertionError(
                    f"generation {generation} never started ({why}); exit codes so far: "
                    f"{self.exit_codes()}"
                )
            return list(self.generations[generation])

    def wait_all_exited(self, timeout_s: float = 120.0) -> list[int]:
        """Observe mode: wait until every node's supervisor ended by itself; the exit codes."""
        deadline = time.monotonic() + timeout_s
        for run in self.nodes:
            try:
                run.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"node {run.node_rank} still running after {timeout_s} s; exit codes so "
                    f"far: {self.exit_codes()}; its log tail: {run.log_text()[-800:]!r}"
                ) from None
        for run in self.nodes:
            self._end_pod(run)
        return [run.proc.returncode for run in self.nodes]

    def exit_codes(self) -> list[list[int | None]]:
        """Each generation's exit codes, node by node (None: still running)."""
        with self._changed:
            return [[run.proc.poll() for run in runs] for runs in self.generations]

    def alive_pids(self) -> list[int]:
        """Every live process of every pod of this group, supervisors included."""
        return pod_pids(self.name)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise AssertionError(f"the LWS harness failed: {self._failure!r}") from self._failure

    # -- stopping ------------------------------------------------------------------------

    def stop(self, grace_s: float | None = None) -> list[int]:
        """Delete the group as `kubectl delete` would (SIGTERM, SIGKILL after the grace, by
        default `termination_grace_s`), with no recreation; the current generation's exit
        codes."""
        self._stop_watcher()
        runs = self.nodes
        self._delete_generation(runs, self.termination_grace_s if grace_s is None else grace_s)
        return [run.proc.returncode for run in runs]

    def close(self) -> None:
        """SIGKILL whatever of the group is still alive and wait for it (also after a failed
        test: nothing is left)."""
        self._hurry.set()
        self._stop_watcher()
        with self._changed:
            runs = [run for gen in self.generations for run in gen]
        for run in runs:
            if run.proc.poll() is None:
                run.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.proc.wait(timeout=10)
        deadline = time.monotonic() + _POD_GONE_S
        while (left := self.alive_pids()) and time.monotonic() < deadline:
            for pid in left:  # again each round: a process may fork while we kill
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(_POLL_S)  # waiting for the killed to disappear (bounded)

    def _stop_watcher(self) -> None:
        self._closing.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=self.termination_grace_s + 30)
