"""Helpers for watchdog end-to-end tests: the simulated server under a ServerProcess handle."""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.adapters.gpu_guard import GuardedGpuSensor
from supervisor.adapters.processes import SystemProcesses
from supervisor.adapters.server_process import ServerProcess
from supervisor.core.events import STOP_REQUESTED, Event
from supervisor.core.policy import Level, Limits
from supervisor.core.redact import redact_line
from supervisor.run.gpu_holders import Holders, holders_of
from tests.testing.support import fake_server_argv, fake_server_env, http_status
from tests.waiting import wait_until

MiB = 2**20
# Host levels far below anything this machine reaches: only the tree's own budget can fire.
QUIET_HOST = Limits(
    warn=Level(bytes_=3 * MiB),
    terminate=Level(bytes_=2 * MiB),
    kill=Level(bytes_=1 * MiB),
    psi_full_warn_percent=None,
)


def sim_sensor(gpus: Path) -> GuardedGpuSensor:
    """The simulated GPUs in `gpus` behind the NVML worker, as `run --gpu-backend sim` does."""
    return GuardedGpuSensor("supervisor.testing.fake_nvml", env={"FAKE_GPU_STATE_DIR": str(gpus)})


def system_holders() -> Holders:
    """GPU holders judged on this host's real processes (an instance name nobody runs)."""
    return holders_of(SystemProcesses(), f"e2e-{uuid.uuid4().hex[:8]}")


def tree_limits(expected_bytes: int) -> Limits:
    """QUIET_HOST with a tree budget 4 MiB and a kill line 16 MiB above `expected_bytes`."""
    return dataclasses.replace(
        QUIET_HOST,
        tree_budget_bytes=expected_bytes + 4 * MiB,
        tree_kill_bytes=expected_bytes + 16 * MiB,
    )


@dataclass
class Launched:
    server: ServerProcess
    port: int
    lines: list[str]
    events: queue.SimpleQueue[Event]

    def ready(self) -> bool:
        return http_status(self.server.pid and self.port, "/health", timeout_s=2.0) == 200

    def live_tree(self) -> list[int]:
        return [p.pid for p in self.server.tree() if not p.is_zombie]


@contextlib.contextmanager
def launched(
    args: Sequence[str],
    scenario: Mapping[str, Any] | None,
    *,
    port: int,
    state_dir: Path | None,
    bytes_per_gb: int = 16 * 1024,
) -> Iterator[Launched]:
    """Start the simulated server as the runner does (own session, output pumped); kill it all
    at the end."""
    lines: list[str] = []
    env = fake_server_env(scenario, state_dir=state_dir, bytes_per_gb=bytes_per_gb)
    server = ServerProcess.start(
        fake_server_argv(["--model-path", "fake/model", "--port", str(port), *args]),
        env,
        run_id=uuid.uuid4().hex,
        sink=lines.append,
        redact=redact_line,
    )
    handle = Launched(server=server, port=port, lines=lines, events=queue.SimpleQueue())
    try:
        yield handle
    finally:
        server.kill_all(STOP_REQUESTED)
        # A Z leader is not reaped yet while its other threads still exit: poll() until it is,
        # or its Popen is collected "still running" (a ResourceWarning, an error here).
        wait_until(
            lambda: not handle.live_tree() and server.poll() is not None,
            timeout_s=10,
            what="server tree gone and its main process reaped",
        )
        server.reap()
        server.close()
