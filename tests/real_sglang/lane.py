"""The real-SGLang lane: `sglang-supervisor run` (from this project's venv) supervising SGLang
0.5.23's own `python -m sglang.launch_server` from the lane's venv, on CPU, with a tiny model
made locally (scripts/real_sglang/build, docs/real-sglang.md).

Ports come from 31800–31899 (away from the ephemeral range other tests take theirs from).
A story's processes are found by their working directory, one per story: the leak guard's
environment marker (tests/conftest.py) does not work here, because SGLang titles its schedulers
and detokenizer with setproctitle, which writes the title over the process's environment block,
so /proc/PID/environ no longer shows the marker. Every wait here is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from supervisor.testing.lws_config import config_toml, merge
from tests.cgroups import remove_instance_cgroups
from tests.e2e.run_support import CONTAINMENT, Supervisor, instance_name
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
LANE = ROOT / ".cache" / "real-sglang"
LANE_PYTHON = LANE / "venv" / "bin" / "python"
MODEL = LANE / "models" / "llama-gqa"
STAMP = LANE / "stamp"
PORTS = range(31800, 31900)
# A TP 2 start takes about a minute on two quiet cores, several under load; a TP 1 one 20-35 s.
START_TIMEOUT_S = 420.0
KV_TOKENS = 20000  # --max-total-tokens: 512 B per token per rank, 10 MB

# Health every second (SGLang's /health is a one-token generation that takes at least 1 s);
# restarts at once; the pre-flight's own overheads (the real server is small but real).
CONFIG: dict[str, dict[str, Any]] = {
    "preflight": {"reserve": "0B", "ledger_dir": "{state_dir}/ledger"},
    "run": {
        "name": "{name}",
        "state_dir": "{state_dir}",
        "cgroup": "{cgroup}",
        "health_interval": "1s",
        "health_timeout": "20s",
        "failure_threshold": 3,
        "stop_grace": "120s",
        "backoff_initial": "0.1s",
        "backoff_max": "0.4s",
        "startup_stall_timeout": "300s",
    },
    "watchdog": {"enabled": False},
    "gpu": {"backend": "none"},
    "http": {"listen": "127.0.0.1:0"},
}


def lane_missing() -> str | None:
    """Why the lane cannot run here (None: it can): its environment is not built."""
    if not (LANE_PYTHON.is_file() and STAMP.is_file() and (MODEL / "config.json").is_file()):
        return f"the real-SGLang lane is not built ({LANE}): run scripts/real_sglang/build"
    return None


def free_lane_ports(count: int) -> list[int]:
    """`count` ports of the lane's range that nothing listens on or holds now."""
    found: list[int] = []
    for port in PORTS:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        found.append(port)
        if len(found) == count:
            return found
    raise AssertionError(f"fewer than {count} free ports in {PORTS.start}-{PORTS.stop - 1}")


def server_env(tp: int) -> dict[str, str]:
    """SGLang's CPU engine, and no NCCL (the CUDA torch build ships libnccl, and pynccl then
    fails "Expected a cuda device"); at TP 2 one core per rank (on one NUMA node SGLang's
    default binding asserts at init, sglang/srt/utils/numa_utils.py)."""
    env = {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_NCCL_SO_PATH": "/nonexistent/libnccl.so"}
    if tp == 2:
        env["SGLANG_CPU_OMP_THREADS_BIND"] = "0|1"
    return env


def server_args(port: int, nccl_port: int, tp: int, extra: Sequence[str] = ()) -> list[str]:
    args = [
        "--model-path", str(MODEL), "--host", "127.0.0.1", "--port", str(port),
        "--nccl-port", str(nccl_port), "--device", "cpu", "--attention-backend", "torch_native",
        "--disable-cuda-graph", "--max-total-tokens", str(KV_TOKENS),
        "--mem-fraction-static", "0.05", "--sleep-on-idle", "--enable-metrics",
    ]  # fmt: skip
    if tp != 1:
        args += ["--tp", str(tp)]
    return [*args, *extra]


def pids_in(workdir: Path) -> list[int]:
    """Live (non-zombie) processes whose working directory is `workdir`."""
    want = str(workdir)
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry.name}/cwd") != want:
                continue
            with open(f"/proc/{entry.name}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found


@dataclass
class RealSupervisor(Supervisor):
    """A Supervisor (tests/e2e/run_support.py) of the real server, run in `workdir`."""

    workdir: Path = Path("/nonexistent")

    def tree(self) -> list[int]:
        return [pid for pid in pids_in(self.workdir) if pid != self.proc.pid]

    def output(self) -> list[str]:
        """SGLang's own lines, as the supervisor passed them on."""
        return [str(e.get("line", "")) for e in self.events("server_output")]

    def wait_output(self, pattern: str, timeout_s: float = START_TIMEOUT_S) -> re.Match[str]:
        found = wait_until(
            lambda: next((m for line in self.output() if (m := re.search(pattern, line))), None),
            timeout_s=timeout_s,
            interval_s=0.2,
            what=f"SGLang's line {pattern!r}",
            context=lambda: f"log tail: {self.log_text()[-2000:]!r}",
        )
        assert found is not None
        return found

    def wait_ready(self, count: int = 1) -> dict[str, Any]:
        return self.wait_event("ready", count=count, timeout_s=START_TIMEOUT_S)

    def metrics_port(self) -> int:
        return int(self.wait_event("http_listening")["port"])


def generate(port: int, tokens: int, timeout_s: float) -> requests.Response:
    """A greedy /generate of exactly `tokens` new tokens (EOS ignored)."""
    body = {
        "text": "The supervisor",
        "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True},
    }
    return requests.post(f"http://127.0.0.1:{port}/generate", json=body, timeout=timeout_s)


def decode_rate_tok_s(port: int) -> float:
    """This machine's decode speed now, from one short request (the machine may be loaded)."""
    answer = generate(port, 64, timeout_s=120)
    answer.raise_for_status()
    meta = answer.json()["meta_info"]
    return float(meta["completion_tokens"]) / max(float(meta["e2e_latency"]), 1e-3)


def tree_left(workdir: Path, grace_s: float = 10.0) -> list[int]:
    """The processes still in `workdir` after `grace_s` (a SIGKILLed tree takes a moment)."""
    try:
        wait_until(lambda: not pids_in(workdir), timeout_s=grace_s, what="the tree gone")
    except AssertionError:
        return pids_in(workdir)
    return []


def shm_names() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@dataclass
class Leftovers:
    """What a story left behind: processes of its tree, cgroups, new /dev/shm files."""

    processes: list[int]
    cgroups: list[str]
    shm: list[str]


@contextlib.contextmanager
def real_supervisor(
    tmp_path: Path,
    marker: str,
    *,
    tp: int = 1,
    extra_args: Sequence[str] = (),
    options: Sequence[str] = (),
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    port: int | None = None,
    leftovers: list[Leftovers] | None = None,
) -> Iterator[RealSupervisor]:
    """`python -m supervisor run` of the real server; at exit everything of the test is gone
    (SIGKILL whatever is left), and what was left is appended to `leftovers` first."""
    state_dir = tmp_path / f"state-{uuid.uuid4().hex[:6]}"
    if port is None:
        port, nccl_port = free_lane_ports(2)
    else:
        nccl_port = next(p for p in free_lane_ports(2) if p != port)
    config = tmp_path / f"run-{uuid.uuid4().hex[:6]}.toml"
    fill = {"state_dir": str(state_dir), "name": instance_name(tmp_path), "cgroup": CONTAINMENT}
    config.write_text(config_toml(merge(CONFIG, overrides or {}), fill))
    log_path = tmp_path / f"supervisor-{uuid.uuid4().hex[:6]}.log"
    argv = [
        sys.executable, "-m", "supervisor", "run", "--config", str(config),
        "--server-command", f"{LANE_PYTHON} -m sglang.launch_server", "--log-format", "json",
        *options, "--", *server_args(port, nccl_port, tp, extra_args),
    ]  # fmt: skip
    env = {**os.environ, **server_env(tp)}
    workdir = tmp_path / f"cwd-{uuid.uuid4().hex[:6]}"
    workdir.mkdir()
    shm_before = shm_names()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    sup = RealSupervisor(proc, log_path, state_dir, port, marker, workdir=workdir)
    try:
        yield sup
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        left_pids = tree_left(workdir)
        for pid in left_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        groups = [str(p) for p in remove_instance_cgroups(instance_name(tmp_path))]
        new_shm = sorted(shm_names() - shm_before)
        # Shown in the test's report (-rA): what SGLang and the supervisor left, story by story.
        print(f"lane leftovers: processes={left_pids} cgroups={groups} /dev/shm={new_shm}")
        if leftovers is not None:
            leftovers.append(Leftovers(left_pids, groups, new_shm))
        remove_sglang_shm(new_shm)


# What SGLang 0.5.23 leaves in /dev/shm even after a clean exit: its schedulers' load snapshot
# (sglang/srt/managers/load_snapshot.py `shm_path_for`: named after the IPC name, no PID), and
# multiprocessing's named semaphores; its pid-stamped sgl_shm_* ring buffers after a SIGKILL.
# The lane removes those a story made; the stories assert what they expect to be left.
SGLANG_SHM_PATTERNS = (r"^sglang_loads_.*\.shm$", r"^sem\.mp-", r"^sgl_shm_")


def remove_sglang_shm(names: Sequence[str]) -> None:
    for name in names:
        if any(re.match(p, name) for p in SGLANG_SHM_PATTERNS):
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{name}")


def status_json(state_dir: Path) -> tuple[int, dict[str, Any]]:
    """`sglang-supervisor status --json`, as an operator runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "status", "--state-dir", str(state_dir), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    return done.returncode, json.loads(done.stdout)


# Every module of the lane: deselected from the default run, and a real server's time.
LANE_MARKS = [pytest.mark.real_sglang, pytest.mark.slow, pytest.mark.timeout(1200)]
