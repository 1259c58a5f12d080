"""The config file's sections: one frozen dataclass per TOML table, validated on construction.

A TOML key is the field name without its unit suffix: `reserve = "10GiB"` fills `reserve_bytes`,
`interval = "10s"` fills `interval_s` (supervisor/config/loader.py parses them). The rest of the
program sees bytes and seconds. Precedence: command-line options > config file > defaults.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from supervisor.config.gpu_section import GpuConfig
from supervisor.config.group_section import GroupConfig
from supervisor.config.hooks import HooksConfig
from supervisor.config.limits import MAX_ARG_CHARS, check_limits
from supervisor.config.metrics_sections import HttpConfig, MetricsConfig
from supervisor.core.bounded import shown
from supervisor.core.sglang_facts import HEALTH_ENDPOINTS, HEALTH_FIRST_LOOK_S
from supervisor.core.units import GB, GiB
from supervisor.errors import ConfigError

if TYPE_CHECKING:
    from supervisor.core.backoff import BackoffPolicy

STATE_ROOT = Path("/var/lib/sglang-supervisor")
# No GPU SGLang serves from has less; below it the automatic fraction and the pool are nonsense.
MIN_GPU_MEMORY_BYTES = 1 * GiB

_FROZEN = {"frozen": True, "slots": True, "kw_only": True}


def instance_name_problem(name: str) -> str | None:
    """Why `name` cannot name an instance (its state directory is STATE_ROOT/<name>), or None.

    Only letters, digits and '.', '_', '@', '-': no '/' to nest directories, and not "." or
    ".." (nor any name of dots only), which would be the state root or its parent.
    """
    if not name or not all(c.isalnum() or c in "._@-" for c in name):
        return "must be letters, digits, '.', '_', '@' or '-'"
    if len(name.encode()) > 255:  # it names a directory: NAME_MAX
        return "must be at most 255 bytes long (it names the state directory)"
    if not name.strip("."):
        return "must be letters, digits, '.', '_', '@' or '-', and not dots only"
    return None


def _numa_gpus_problem(numa: tuple[NumaNodeSpec, ...], gpus: int | None) -> str | None:
    """What a NUMA description cannot mean: a node given twice (its free memory would count
    twice), GPUs on two nodes, negative, or beyond `gpus`."""
    nodes = [spec.node for spec in numa]
    twice_nodes = sorted({n for n in nodes if nodes.count(n) > 1})
    if twice_nodes:
        return f"NUMA node(s) {_ids(twice_nodes)} given more than once: give each node once"
    seen: set[int] = set()
    for spec in numa:
        twice = sorted(seen.intersection(spec.gpus))
        if twice:
            return f"GPU(s) {_ids(twice)} listed on more than one NUMA node"
        seen.update(spec.gpus)
        beyond = sorted(i for i in spec.gpus if i < 0 or (gpus is not None and i >= gpus))
        if beyond:
            limit = f"the {gpus} GPUs of host.gpus (--gpus)" if gpus is not None else "GPU 0"
            where = "beyond" if gpus is not None else "below"
            return f"node {spec.node} lists GPU(s) {_ids(beyond)} {where} {limit}"
    return None


def env_problem(env: Mapping[str, str]) -> str | None:
    """What execve would refuse in the server's environment (at launch, after the checks
    passed), as "env..." or None: a NUL (C strings end there), a name that is empty or holds
    '=' (the first '=' ends the name), a value past MAX_ARG_CHARS."""
    for name, value in env.items():
        if not name or "=" in name or "\0" in name:
            return f"env: {shown(name)} is not an environment variable name (empty, '=' or NUL)"
        if "\0" in value:
            return f"env.{name}: the value holds a NUL character"
        if len(name) + len(value) >= MAX_ARG_CHARS:
            return f"env.{shown(name)}: the value is longer than {MAX_ARG_CHARS:,} characters"
    return None


def _ids(ids: list[int]) -> str:
    return ", ".join(str(i) for i in ids)


@dataclasses.dataclass(**_FROZEN)
class NumaNodeSpec:
    """One NUMA node of a planned host: its free memory and the GPUs attached to it."""

    node: int
    mem_available_bytes: int
    gpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_limits(self, "host.numa")


@dataclasses.dataclass(**_FROZEN)
class ServerConfig:
    """What to launch: SGLang's own argv, the interpreter/command, extra environment."""

    args: tuple[str, ...] = ()
    command: tuple[str, ...] = ()  # empty: the current interpreter with -m sglang.launch_server
    model_config: str | None = None  # a config.json that overrides the model directory's
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    crash_dumps: bool = False  # keep SGLang's ~65 s py-spy/CUDA core-dump wait on a crash
    # The server tree runs as this user (name or uid) and group (default: the user's), with the
    # groups of /dev/nvidia*; the supervisor stays root. Checked at start (adapters/credentials).
    user: str | None = None
    group: str | None = None

    def __post_init__(self) -> None:
        check_limits(self, "server")  # a NUL in args or command, a path too long
        problem = env_problem(self.env)
        if problem is not None:
            raise ConfigError(f"config key server.{problem}")


@dataclasses.dataclass(**_FROZEN)
class HostConfig:
    """Host and GPU facts given instead of measured, for planning another box."""

    mem_available_bytes: int | None = None
    cgroup_headroom_bytes: int | None = None
    gpus: int | None = None
    gpu_memory_bytes: int | None = None
    numa: tuple[NumaNodeSpec, ...] = ()
    sglang_version: str | None = None

    def __post_init__(self) -> None:
        # Each message names the key and its option: both the file and the command line land here.
        if self.gpus is not None and self.gpus < 1:
            raise ConfigError(f"config key host.gpus (--gpus) must be at least 1 (got {self.gpus})")
        memory = self.gpu_memory_bytes
        if memory is not None and memory < MIN_GPU_MEMORY_BYTES:
            raise ConfigError(
                "config key host.gpu_memory (--gpu-memory) must be at least 1 GiB, the memory "
                f"of one GPU (got {memory} bytes)"
            )
        problem = _numa_gpus_problem(self.numa, self.gpus)
        if problem is not None:
            raise ConfigError(f"config key host.numa (--numa): {problem}")
        check_limits(self, "host")


@dataclasses.dataclass(**_FROZEN)
class PreflightConfig:
    """Reserve and overheads of the host-memory budget (docs/sglang.md §5)."""

    # SGLang's own HICACHE_HOST_MEMORY_RESERVE_BYTES (docs/sglang.md §1.6).
    reserve_bytes: int = 10 * GiB
    # torch, CUDA context and NCCL in each scheduler: 4-8 GiB anon per rank (docs/sglang.md §5).
    per_rank_overhead_bytes: int = 4 * GiB
    # The main process (HTTP, tokenizer manager) and the detokenizer.
    main_overhead_bytes: int = 6 * GiB
    avg_request_tokens: int = 4096
    # Concurrent loader threads per rank; with --weight-loader-disable-mmap each rank holds about
    # (threads + 2) shards in anonymous memory while loading (docs/sglang.md §5).
    load_threads: int = 8
    # Largest safetensors shard when the shards are not on this host (4-5 GB typical); the
    # measured largest shard is used when they are.
    shard_bytes: int = 5 * GB
    # Checkpoint size when the shards are not on this host (planning another box); a value here
    # wins over the measured *.safetensors total.
    weights_bytes: int | None = None
    # GPU memory taken by the CUDA context and NCCL before SGLang measures free memory: 1-3 GiB
    # (docs/sglang.md §1.4).
    gpu_context_bytes: int = 2 * GiB
    # The host-wide reservation ledger: instances starting together see each other's planned
    # but not yet pinned host memory there. Empty: none (each instance on its own).
    ledger_dir: str = "/run/sglang-supervisor"

    def __post_init__(self) -> None:
        if self.avg_request_tokens < 1:
            raise ConfigError(
                "config key preflight.avg_request_tokens must be at least 1 "
                f"(got {self.avg_request_tokens})"
            )
        check_limits(self, "preflight")


# Two of SGLang's looks at its /health generation (sglang_facts.HEALTH_FIRST_LOOK_S each).
HEALTH_TIMEOUT_FLOOR_S = 2 * HEALTH_FIRST_LOOK_S


@dataclasses.dataclass(**_FROZEN)
class RunConfig:
    """`sglang-supervisor run`: health checks, restarts, stop Keys are flat."""

    name: str = "default"
    state_dir: str = ""  # empty: /var/lib/sglang-supervisor/<name>/
    stop_grace_s: float = 60.0  # SIGTERM -> SIGKILL; SGLang drains requests meanwhile
    # On a node with --node-rank >= 1 SGLang's main process only logs the SIGTERM and waits for
    # rank 0 (entrypoints/engine.py): nothing drains there, so the group SIGKILL comes sooner.
    worker_stop_grace_s: float = 5.0
    health_path: str = "/health"
    health_interval_s: float = 10.0
    # SGLang's /health runs a one-token generation with a 20 s limit (docs/sglang.md §4).
    health_timeout_s: float = 25.0  # at least HEALTH_TIMEOUT_FLOOR_S on /health*
    failure_threshold: int = 3  # consecutive failed health checks = dead
    startup_timeout_s: float = 3600.0  # hard limit, even while the load progresses
    startup_stall_timeout_s: float = 600.0  # no memory growth and no log line for this long
    # 10 s doubling to 300 s, reset after 10 min healthy (docs/peers.md, GPUStack and RBG).
    backoff_initial_s: float = 10.0
    backoff_max_s: float = 300.0
    stable_after_s: float = 600.0
    max_restarts: int = 5  # more restarts than this within restart_window = crash loop (exit 5)
    restart_window_s: float = 1800.0
    auto_size: bool = False  # on no-fit, launch with the pre-flight's largest safe --hicache-size
    force: bool = False  # on no-fit, launch anyway
    kill_foreign_gpu_processes: bool = False
    oom_score_adj: int = 500  # for the server tree: the kernel OOM killer takes it, not us
    # The server tree in a cgroup of its own (auto: when this host allows it), or /proc only.
    cgroup: str = "auto"
    # Incident reports and corrupt state files set aside: the newest this many of each are kept.
    keep_files: int = 100
    log_format: str = "auto"  # auto | json | console | journal
    log_level: str = "info"
    # SIGHUP: a change to the server's argv or environment drains and relaunches it at once
    # (true) or waits for its next restart (false).
    restart_on_reload: bool = False

    def backoff_policy(self) -> BackoffPolicy:
        """The restart delays and crash-loop limits these keys describe."""
        from supervisor.core.backoff import BackoffPolicy  # tenacity: not for the pre-flight

        return BackoffPolicy(
            initial_s=self.backoff_initial_s,
            max_s=self.backoff_max_s,
            stable_after_s=self.stable_after_s,
            max_restarts=self.max_restarts,
            restart_window_s=self.restart_window_s,
        )

    @property
    def state_path(self) -> Path:
        """The state directory: `state_dir`, else /var/lib/sglang-supervisor/<name>/."""
        return Path(self.state_dir) if self.state_dir else STATE_ROOT / self.name

    def __post_init__(self) -> None:
        def bad(key: str, why: str, value: object) -> ConfigError:
            return ConfigError(f"config key run.{key} {why} (got {shown(value)})")

        name_problem = instance_name_problem(self.name)
        if name_problem is not None:
            raise bad("name", name_problem, self.name)
        for key in (
            "health_interval_s",
            "health_timeout_s",
            "startup_timeout_s",
            "startup_stall_timeout_s",
            "backoff_initial_s",
            "stable_after_s",
            "restart_window_s",
        ):
            if getattr(self, key) <= 0:
                raise bad(key[:-2], "must be positive", getattr(self, key))
        for key in ("stop_grace_s", "worker_stop_grace_s"):
            if getattr(self, key) < 0:
                raise bad(key[:-2], "must not be negative", getattr(self, key))
        if self.backoff_max_s < self.backoff_initial_s:
            raise bad("backoff_max", "must be at least run.backoff_initial", self.backoff_max_s)
        if self.failure_threshold < 1:
            raise bad("failure_threshold", "must be at least 1", self.failure_threshold)
        if self.max_restarts < 0:
            raise bad("max_restarts", "must not be negative", self.max_restarts)
        if not self.health_path.startswith("/"):
            raise bad("health_path", "must start with /", self.health_path)
        self._check_health_timeout()
        if not -1000 <= self.oom_score_adj <= 1000:
            raise bad("oom_score_adj", "must be in [-1000, 1000]", self.oom_score_adj)
        if self.cgroup not in ("auto", "off"):
            raise bad("cgroup", "must be auto or off", self.cgroup)
        if self.keep_files < 1:
            raise bad("keep_files", "must be at least 1", self.keep_files)
        if self.log_format not in ("auto", "json", "console", "journal"):
            raise bad("log_format", "must be auto, json, console or journal", self.log_format)
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise bad("log_level", "must be debug, info, warning or error", self.log_level)
        check_limits(self, "run")

    def _check_health_timeout(self) -> None:
        """SGLang's /health answers 200 no sooner than its first look, 1 s after the request,
        and only if the generation came back by then; else at the next look, 1 s later. A limit
        under two looks times out a healthy but busy server (under one: every probe)."""
        path = self.health_path.split("?", 1)[0]
        if path in HEALTH_ENDPOINTS and self.health_timeout_s < HEALTH_TIMEOUT_FLOOR_S:
            raise ConfigError(
                f"config key run.health_timeout (--health-timeout) must be at least "
                f"{HEALTH_TIMEOUT_FLOOR_S:g} s with run.health_path {path}: SGLang's {path} is a "
                f"one-token generation it first looks at after sleeping "
                f"{HEALTH_FIRST_LOOK_S:g} s, then each second (docs/sglang.md §4), so a shorter "
                f"limit times out a healthy server (got {self.health_timeout_s:g} s)"
            )


@dataclasses.dataclass(**_FROZEN)
class WatchdogConfig:
    """Host-memory watchdog levels and the restart-smaller rule.

    Levels are on host headroom (MemAvailable capped by cgroup headroom): warn > terminate > kill.
    Each is bytes and/or percent of MemAvailable + the tree's charge; when both are set the lower
    applies; 0 switches that form off. Defaults leave room for the pre-flight's 10 GiB reserve.
    """

    enabled: bool = True
    warn_bytes: int = 8 * GiB
    warn_percent: float = 8.0
    terminate_bytes: int = 4 * GiB
    terminate_percent: float = 4.0
    kill_bytes: int = 2 * GiB
    kill_percent: float = 2.0
    # Tree budget = the pre-flight's expected total; kill above it plus the larger margin. The
    # pre-flight's per-rank overhead (4 GiB) is the low end of the 4-8 GiB seen (docs/sglang.md §5).
    tree_margin_percent: float = 10.0
    tree_margin_bytes: int = 8 * GiB
    warn_ticks: int = 3
    psi_full_warn_percent: float = 40.0  # 0: off
    terminate_grace_s: float = 5.0
    ramp_gb_per_second: float = 6.0  # earlyoom's measured worst allocator, 6000 KiB/ms
    min_interval_s: float = 0.05
    max_interval_s: float = 1.0
    shrink_factor: float = 0.75
    min_hicache_size_bytes: int = 1 * GB
    incident_log_lines: int = 200
    # A restart-smaller override is dropped this long after it was set (0: kept until
    # `reset-state`), so a box that recovered gets its full --hicache-size back.
    shrink_expires_s: float = 0.0

    def __post_init__(self) -> None:
        levels = ("warn", "terminate", "kill")
        for unit in ("bytes", "percent"):
            values = [(name, getattr(self, f"{name}_{unit}")) for name in levels]
            set_ = [(n, v) for n, v in values if v]
            for (hi, hv), (lo, lv) in itertools.pairwise(set_):
                if lv >= hv:
                    key = lo if unit == "bytes" else f"{lo}_percent"
                    other = hi if unit == "bytes" else f"{hi}_percent"
                    raise ConfigError(
                        f"config key watchdog.{key} ({lv}) must be below watchdog.{other} ({hv}): "
                        "levels on available memory go warn > terminate > kill"
                    )
        for name in ("warn_percent", "terminate_percent", "kill_percent", "tree_margin_percent"):
            if not 0 <= getattr(self, name) < 100:
                raise ConfigError(f"config key watchdog.{name} must be in [0, 100)")
        if not 0 < self.shrink_factor < 1:
            raise ConfigError("config key watchdog.shrink_factor must be between 0 and 1")
        if not 0 < self.min_interval_s <= self.max_interval_s:
            raise ConfigError(
                "config key watchdog.min_interval must be positive and at most max_interval"
            )
        if self.warn_ticks < 1:
            raise ConfigError("config key watchdog.warn_ticks must be at least 1")
        if self.ramp_gb_per_second <= 0:
            raise ConfigError("config key watchdog.ramp_gb_per_second must be positive")
        if self.terminate_grace_s < 0 or self.incident_log_lines < 0:
            raise ConfigError("watchdog.terminate_grace and incident_log_lines must be >= 0")
        check_limits(self, "watchdog")


@dataclasses.dataclass(**_FROZEN)
class LogConfig:
    """What goes into the log besides the supervisor's own events ([run] log_format and
    log_level say how and how much)."""

    # json: each SGLang line is a `server_output` event; raw: the line as SGLang wrote it after
    # "[sglang] " (secrets masked, and still an event for status and metrics).
    server_output: str = "json"

    def __post_init__(self) -> None:
        if self.server_output not in ("json", "raw"):
            raise ConfigError(
                f"config key log.server_output must be json or raw (got {self.server_output!r})"
            )
        check_limits(self, "log")


@dataclasses.dataclass(**_FROZEN)
class SupervisorConfig:
    """The whole config file, one dataclass per TOML table."""

    server: ServerConfig = dataclasses.field(default_factory=ServerConfig)
    host: HostConfig = dataclasses.field(default_factory=HostConfig)
    preflight: PreflightConfig = dataclasses.field(default_factory=PreflightConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    watchdog: WatchdogConfig = dataclasses.field(default_factory=WatchdogConfig)
    gpu: GpuConfig = dataclasses.field(default_factory=GpuConfig)
    http: HttpConfig = dataclasses.field(default_factory=HttpConfig)
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    hooks: HooksConfig = dataclasses.field(default_factory=HooksConfig)
    group: GroupConfig = dataclasses.field(default_factory=GroupConfig)
