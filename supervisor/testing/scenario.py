"""The simulated server's failure scenario: FAKE_SGLANG_SCENARIO (JSON) read into frozen values.

Keys, units and defaults are documented in supervisor/testing/__init__.py; unknown keys and wrong
types are refused (exit 2) so a typo in a test never silently runs the happy path.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class ScenarioError(ValueError):
    """FAKE_SGLANG_SCENARIO is not valid JSON or names an unknown key / a wrong type."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Leak:
    rank: int = 0
    bytes_per_s: int = 1 << 20
    after_s: float = 0.0
    max_bytes: int = 32 << 20
    kind: str = "anon"  # "anon": private anonymous (RssAnon); "shmem": shared anonymous (RssShmem)


@dataclass(frozen=True, slots=True, kw_only=True)
class Crash:
    rank: int = 0
    after_s: float = 0.0
    signal: int | None = None
    exit_code: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RankEvent:
    rank: int = 0
    after_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Orphan:
    kind: str = "setsid"  # "setsid" | "double_fork"
    holds_gpu: bool = False
    rank: int = 0
    after_s: float = 0.0
    lifetime_s: float = 20.0
    gpu_bytes: int = 1 << 30
    title: str = "sglang::tokenizer_worker:{pid}"


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuFault:
    """A fault put on the rank's simulated GPU once it has served `after_s` (gpu_faults.FAULTS)."""

    rank: int = 0
    after_s: float = 0.0
    kind: str = "xid"  # a `fake_gpu inject` FAULT
    code: int | None = None  # the Xid, for kind "xid"
    value: str | None = None  # the ACTION or NAME, for "recovery-action" / "unsupported"


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputFlood:
    """Pathological lines the main process prints over and over (supervisor/testing/flood.py)."""

    after_s: float = 0.0
    line_bytes: int = 1 << 20  # a line of 1,000-character words this long
    word_chars: int = 200_000  # one word without a space
    cjk_chars: int = 8000  # CJK text without a space
    every_s: float = 0.25  # the pause between two rounds
    rounds: int | None = None  # None: until the process ends


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    startup_s: float = 0.2
    warmup_s: float = 0.1
    warmup_tries: int = 120  # after a failed bind, GET /model_info this often, 1 s apart
    drain_poll_s: float = 0.05
    request_s: float = 0.0
    scheduler_exit_timeout_s: float = 15.0
    crash_dump_wait_s: float = 0.2
    health_check_timeout_s: float = 2.0
    # /health's handler sleeps 1 s before each look at its generation (SGLang: asyncio.sleep(1))
    health_delay_s: float = 1.0
    runtime_gb: float = 4.0
    gpu_total_bytes: int | None = None
    weight_bytes_per_rank: int = 20 << 30
    cuda_context_bytes: int = 0
    max_total_num_tokens: int | None = None
    leak: Leak | None = None
    crash: Crash | None = None
    zombie: RankEvent | None = None
    hang: RankEvent | None = None
    health_fail_after_s: float | None = None
    health_fail_mode: str = "503"  # "503" | "no_answer"
    ignore_sigterm: bool = False
    orphan: Orphan | None = None
    gpu_release_delay_s: float = 0.0
    gpu_stuck: bool = False
    exit_code_on_start: int | None = None
    bad_flags: tuple[str, ...] = field(default_factory=tuple)
    hang_nvml_s: float | None = None
    shm_segments: int | None = None  # None: SGLang's broadcasters; N: rank 0 makes N, others 0
    shm_sweep: bool = False  # stale_shm_cleanup's sweep before anything starts
    log_lines: tuple[str, ...] = field(default_factory=tuple)  # printed at start, $VARs expanded
    weight_shards: int = 8  # checkpoint files rank 0's meter counts over startup_s
    gpu_fault: GpuFault | None = None
    dist_timeout_s: float = 60.0  # rendezvous at --dist-init-addr (--dist-timeout wins)
    nccl_timeout_s: float = 1.0  # a broken communicator hangs the survivors after this long
    output_flood: OutputFlood | None = None  # pathological lines, printed over and over
    init_fork_s: float | None = 0.013  # each scheduler's init subprocess keeps its title this long


_NUMBER = (int, float)


def _check(name: str, value: object, kinds: tuple[type, ...], what: str) -> None:
    if isinstance(value, bool) and bool not in kinds:
        raise ScenarioError(f"FAKE_SGLANG_SCENARIO key {name!r}: expected {what}, got {value!r}")
    if not isinstance(value, kinds):
        raise ScenarioError(f"FAKE_SGLANG_SCENARIO key {name!r}: expected {what}, got {value!r}")


def _build(cls: type[Any], name: str, raw: object) -> Any:
    """Build a frozen dataclass from a JSON object, checking keys and value types."""
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"FAKE_SGLANG_SCENARIO key {name!r}: expected an object, got {raw!r}")
    known = {f.name: f for f in cls.__dataclass_fields__.values()}
    values: dict[str, object] = {}
    for key, value in raw.items():
        full = f"{name}.{key}" if name else key
        if key not in known:
            raise ScenarioError(f"FAKE_SGLANG_SCENARIO: unknown key {full!r}")
        values[key] = _convert(full, str(known[key].type), value)
    return cls(**values)


def _convert(name: str, annotation: str, value: object) -> object:
    nullable = "None" in annotation
    if value is None and nullable:
        return None
    if annotation.startswith("Leak"):
        return _build(Leak, name, value)
    if annotation.startswith("Crash"):
        crash = _build(Crash, name, value)
        if (crash.signal is None) == (crash.exit_code is None):
            raise ScenarioError(f"FAKE_SGLANG_SCENARIO key {name!r}: give signal or exit_code")
        return crash
    if annotation.startswith("RankEvent"):
        return _build(RankEvent, name, value)
    if annotation.startswith("Orphan"):
        orphan = _build(Orphan, name, value)
        if orphan.kind not in ("setsid", "double_fork"):
            raise ScenarioError(f"FAKE_SGLANG_SCENARIO key {name!r}: kind setsid|double_fork")
        return orphan
    if annotation.startswith("OutputFlood"):
        return _build(OutputFlood, name, value)
    if annotation.startswith("GpuFault"):
        return _gpu_fault(name, _build(GpuFault, name, value))
    if annotation.startswith("tuple"):
        _check(name, value, (list,), "a list of strings")
        assert isinstance(value, list)
        for flag in value:
            _check(name, flag, (str,), "a list of strings")
        return tuple(value)
    if annotation.startswith("bool"):
        _check(name, value, (bool,), "true or false")
        return value
    if annotation.startswith("str"):
        _check(name, value, (str,), "a string")
        return value
    if name.endswith("signal") and isinstance(value, str):
        try:
            return int(signal.Signals[value if value.startswith("SIG") else f"SIG{value}"])
        except KeyError:
            raise ScenarioError(f"FAKE_SGLANG_SCENARIO key {name!r}: no signal {value!r}") from None
    if annotation.startswith("int"):
        _check(name, value, (int,), "an integer")
        return value
    _check(name, value, _NUMBER, "a number")
    assert isinstance(value, _NUMBER)
    if value < 0:
        raise ScenarioError(f"FAKE_SGLANG_SCENARIO key {name!r}: must not be negative")
    return float(value)


def _gpu_fault(name: str, fault: GpuFault) -> GpuFault:
    """Refuse now what the injection would refuse mid-run (a typo must not pass silently)."""
    # Only a scenario with a GPU fault pays for pynvml (gpu_faults imports it): every simulated
    # process parses the scenario, and the e2e watchdog tests budget their real memory tightly.
    from supervisor.testing import gpu_faults

    spec = gpu_faults.FAULTS.get(fault.kind)
    if spec is None:
        raise ScenarioError(
            f"FAKE_SGLANG_SCENARIO key '{name}.kind': one of {', '.join(gpu_faults.FAULTS)}"
        )
    value = injected_value(fault)
    if (spec.metavar is None) != (value is None):
        wanted = "code" if fault.kind == "xid" else "value"
        what = f"takes {wanted}" if spec.metavar else "takes no code or value"
        raise ScenarioError(f"FAKE_SGLANG_SCENARIO key {name!r}: {fault.kind} {what}")
    try:
        spec.event(value or "")
        spec.change(gpu_faults.SimHealth(), value or "")
    except gpu_faults.FaultError as exc:
        raise ScenarioError(f"FAKE_SGLANG_SCENARIO key {name!r}: {exc}") from None
    return fault


def injected_value(fault: GpuFault) -> str | None:
    """The VALUE `fake_gpu inject` takes for this fault: the Xid as text, or `value`."""
    return str(fault.code) if fault.code is not None else fault.value


def parse_scenario(text: str | None) -> Scenario:
    """Parse FAKE_SGLANG_SCENARIO; empty or unset means the happy path.

    Raises:
        ScenarioError: invalid JSON, an unknown key or a value of the wrong type (named).
    """
    if not text or not text.strip():
        return Scenario()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"FAKE_SGLANG_SCENARIO is not valid JSON: {exc}") from None
    scenario: Scenario = _build(Scenario, "", raw)
    if scenario.health_fail_mode not in ("503", "no_answer"):
        raise ScenarioError("FAKE_SGLANG_SCENARIO key 'health_fail_mode': 503|no_answer")
    if scenario.shm_segments is not None and scenario.shm_segments < 0:
        raise ScenarioError("FAKE_SGLANG_SCENARIO key 'shm_segments': must not be negative")
    if scenario.leak is not None and scenario.leak.kind not in ("anon", "shmem"):
        raise ScenarioError("FAKE_SGLANG_SCENARIO key 'leak.kind': anon|shmem")
    return scenario


def scenario_json(**keys: object) -> str:
    """Serialise scenario keys for FAKE_SGLANG_SCENARIO (tests and the demo build it this way)."""
    return json.dumps(keys)
