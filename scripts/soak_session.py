"""One soak session for scripts/soak (not a test): the simulated GPUs, the config, the
supervisors started and stopped one after the other, and waiting for each fault's outcome."""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from soak_checks import SETTINGS, Outcome, World, runs
from soak_support import (
    MARKER_ENV,
    MODEL_CONFIG,
    LogTail,
    SecretScanner,
    epoch,
    free_port,
    instance_cgroups,
    marked,
    poll_until,
    remove_cgroups,
)

from supervisor.testing import gpu_state

MiB = 2**20
RANKS = 8
TMPFS_BYTES = 16 * MiB
REFUSAL_CODES = (1, 2, 3, 4, 5, 6)  # README, "Exit codes (run)"; 70 is a bug
RECOVERY_TIMEOUT_S = 30.0
# SGLang's /health takes a second (the simulation's default); the soak's cycles take 50 ms.
BASE_SCENARIO = {"startup_s": 0.1, "warmup_s": 0.05, "health_delay_s": 0.05}
CONFIG = """
[preflight]
reserve = "0B"
ledger_dir = "{tmp}/ledger"
# What the 8-rank tree really charges (~180 MiB of Python) plus ~50 MiB: the watchdog's tree
# budget, which only a leaking rank crosses.
per_rank_overhead = "24MiB"
main_overhead = "40MiB"

[server]
model_config = "{model_config}"

[run]
name = "{name}"
state_dir = "{state_dir}"
keep_files = 10
max_restarts = 1000000
startup_timeout = "60s"
startup_stall_timeout = "20s"
{run_settings}
[watchdog]
tree_margin_percent = 0.0
tree_margin = "16MiB"
warn = "3MiB"
terminate = "2MiB"
kill = "1MiB"
warn_percent = 0.0
terminate_percent = 0.0
kill_percent = 0.0

[gpu]
backend = "sim"
reset_command = "{python} -m supervisor.testing.fake_gpu_reset {{index}}"
reset_timeout = "10s"
{gpu_settings}"""


class Supervisor:
    """One life of `python -m supervisor run`, its JSON log read as it grows."""

    def __init__(self, proc: subprocess.Popen[bytes], log: LogTail, label: str) -> None:
        self.proc, self.log, self.label = proc, log, label

    @property
    def pid(self) -> int:
        return self.proc.pid

    def current_run(self) -> str | None:
        self.log.poll()
        launched = runs(self.log)
        return launched[-1] if launched else None


class Soak:
    def __init__(self, tmp: Path, seed: int, disk_full: bool) -> None:
        self.tmp, self.seed, self.disk_full = tmp, seed, disk_full
        self.marker = f"soak-{uuid.uuid4().hex}"
        self.instance = f"soak-{uuid.uuid4().hex[:10]}"
        self.port = free_port()
        self.api_key = f"sk-soak-{secrets.token_hex(12)}"
        self.hf_token = f"hf_soak_{secrets.token_hex(12)}"
        self.gpus, self.state_dir = tmp / "gpus", tmp / "state"
        self.record, self.config = tmp / "shm-record", tmp / "soak.toml"
        gpu_state.create_gpus(self.gpus, RANKS)
        self.config.write_text(_config(tmp, self.state_dir, self.instance))
        secrets_ = {"api key": self.api_key, "HF_TOKEN": self.hf_token}
        scanner = SecretScanner(tmp, secrets_, skip=[self.config])
        self.world = World(self.marker, self.state_dir, self.record, scanner)
        self.sup: Supervisor | None = None
        self.lives = 0
        self.operator_resets = 0
        self.modes: Counter[str] = Counter()
        self.violations: list[tuple[int, str, str]] = []
        self.cycle = 0

    def violate(self, kind: str, detail: str) -> None:
        self.violations.append((self.cycle, kind, detail))

    # -- supervisors -----------------------------------------------------------------------

    def start(self, scenario: dict[str, Any], label: str) -> Supervisor:
        self.lives += 1
        log_path = self.tmp / f"supervisor-{self.lives:03d}.jsonl"
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        env |= {
            MARKER_ENV: self.marker,
            "FAKE_SGLANG_SCENARIO": json.dumps({**BASE_SCENARIO, **scenario}),
            "FAKE_SGLANG_BYTES_PER_GB": str(16 * 1024),
            "FAKE_GPU_STATE_DIR": str(self.gpus),
            "FAKE_SGLANG_SHM_RECORD": str(self.record),
            "HF_TOKEN": self.hf_token,
        }
        py = sys.executable
        argv = [py, "-m", "supervisor", "run", "--config", str(self.config)]
        argv += ["--server-command", f"{py} -m supervisor.testing.fake_sglang"]
        argv += ["--log-format", "json", "--", "--model-path", "any/model", "--tp", str(RANKS)]
        argv += ["--port", str(self.port), "--api-key", self.api_key]
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self.sup = Supervisor(proc, LogTail(log_path), label)
        return self.sup

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Signal the supervisor and wait for its exit; a SIGTERM must end in 0."""
        sup, self.sup = self.sup, None
        if sup is None:
            return None
        if sup.proc.poll() is None:
            sup.proc.send_signal(sig)
        try:
            code = sup.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            sup.proc.kill()
            code = sup.proc.wait(timeout=30)
            self.violate("bad_exit", f"{signal.Signals(sig).name} ignored for 30 s")
        self.retire(sup)
        if sig == signal.SIGTERM and code != 0:
            self.violate("bad_exit", f"SIGTERM: exit {code}; {sup.log.last_lines[-1:]}")
        if sig != signal.SIGKILL:
            self.after_exit()
        return code

    def retire(self, sup: Supervisor) -> None:
        sup.log.poll()
        self.modes.update(str(e.get("mode")) for e in sup.log.named("server_launched"))

    def after_exit(self) -> None:
        """A supervisor that ended by itself removes its cgroups."""
        left = [str(p) for p in instance_cgroups(self.instance)]
        if left:
            self.violate("cgroup_left", ", ".join(left))
            remove_cgroups(self.instance)

    def ensure(
        self, scenario: dict[str, Any] | None = None, label: str = "plain"
    ) -> Outcome | None:
        """A ready supervisor of `label` (the current one when plain): None, or the outcome of
        a start that did not get there."""
        sup = self.sup
        if sup is not None and sup.proc.poll() is not None:
            self.violate("bad_exit", f"the supervisor exited by itself: {sup.proc.returncode}")
            self.sup = None
            self.retire(sup)
            self.after_exit()
        elif sup is not None and sup.label == label == "plain":
            return None
        started = time.time()
        self.fresh_start(scenario or {}, label)
        got = self.await_recovery(started)
        if got.result == "recovered":
            return None
        # A start that is not ready before any fault is the soak's own setup failing (a
        # refused setting, say): no cycle after it tests anything, so it is never "refused".
        got.detail = f"before the fault, a fresh {label} start: {got.detail}"
        got.result = "violation"
        self.violate("no_recovery", got.detail)
        return got

    def fresh_start(self, scenario: dict[str, Any], label: str) -> Supervisor:
        self.stop()
        self.operator_reset()
        return self.start(scenario, label)

    def operator_reset(self) -> None:
        """What an operator does after a clean stop of a server whose GPU memory stuck: reset
        those GPUs before the next start. The simulation keeps such memory after any exit, and
        the supervisor verifies GPUs only after a death, not after its own clean stop."""
        stuck = {h.gpu_index for h in gpu_state.read_holdings(self.gpus) if not h.listed}
        for index in sorted(stuck):
            gpu_state.clear_gpu(self.gpus, index)
            self.operator_resets += 1

    # -- waiting -----------------------------------------------------------------------------

    def await_recovery(self, t_inject: float, timeout_s: float = RECOVERY_TIMEOUT_S) -> Outcome:
        """The next `ready` after `t_inject` (recovered), or the supervisor's exit with a
        documented code and a `fatal` event (refused); anything else is a violation."""
        sup = self.sup
        if sup is None:
            return Outcome("", "violation", None, "no supervisor")

        def answer() -> Outcome | None:
            sup.log.poll()
            ready = sup.log.first_after("ready", t_inject)
            if ready is not None:
                return Outcome("", "recovered", epoch(ready) - t_inject)
            if sup.proc.poll() is None:
                return None
            sup.log.poll()
            return self.ended(sup, time.time() - t_inject)

        got = poll_until(answer, timeout_s)
        if got is None:
            got = Outcome("", "violation", None, f"no ready within {timeout_s:g} s")
        got.failures = [
            str(e.get("failure")) for e in sup.log.named("server_failed") if epoch(e) > t_inject
        ]
        return got

    def ended(self, sup: Supervisor, after_s: float) -> Outcome:
        self.sup = None
        self.retire(sup)
        code = sup.proc.returncode
        fatal = sup.log.named("fatal")
        self.after_exit()
        if code in REFUSAL_CODES and fatal:
            return Outcome("", "refused", after_s, f"exit {code}: {fatal[-1].get('reason')}")
        self.violate("bad_exit", f"exit {code} without a fatal event: {sup.log.last_lines[-3:]}")
        return Outcome("", "violation", None, f"exit {code}")

    def rank(self, index: int) -> int | None:
        """PID of scheduler TP`index` of the current launch (waits for it, bounded)."""
        sup = self.sup
        title = f"sglang::scheduler_TP{index}"
        if sup is None:
            return None

        def find() -> int | None:
            run = sup.current_run()
            procs = marked(self.marker)
            return next((p.pid for p in procs if p.title == title and p.run_id == run), None)

        return poll_until(find, 10.0)

    def kill_rank(self, rng: random.Random, sig: int = signal.SIGKILL) -> float | None:
        pid = self.rank(rng.randrange(RANKS))
        if pid is None:
            return None
        t_inject = time.time()
        with contextlib.suppress(ProcessLookupError):  # died meanwhile: a fault all the same
            os.kill(pid, sig)
        return t_inject


def _config(tmp: Path, state_dir: Path, name: str) -> str:
    def toml(section: str) -> str:
        return "".join(f"{k} = {json.dumps(v)}\n" for k, v in SETTINGS[section].items())

    return CONFIG.format(
        tmp=tmp,
        model_config=MODEL_CONFIG,
        name=name,
        state_dir=state_dir,
        python=sys.executable,
        run_settings=toml("run"),
        gpu_settings=toml("gpu"),
    )
