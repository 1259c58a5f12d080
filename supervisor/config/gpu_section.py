"""`[gpu]`: which NVML backend, the pre-launch health gate, how to reset a stuck or sick GPU."""

from __future__ import annotations

import dataclasses
import shlex

from supervisor.config.limits import check_limits
from supervisor.core.units import GiB
from supervisor.errors import ConfigError

GPU_BACKENDS = ("auto", "nvml", "sim", "none")
HEALTH_MODES = ("enforce", "warn", "off")  # core.gpu_health.HEALTH_MODES


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GpuConfig:
    """GPU access: which NVML backend, the health gate, how to reset a stuck GPU."""

    backend: str = "auto"  # nvml | sim | none | auto (nvml when the library loads, else none)
    # Run for a GPU whose memory stays held with no process, or that needs a reset: {index} and
    # {uuid} are filled in, {indices} with the GPU's whole NVLink peer set ("0,1,2,3": one
    # command for GPUs that cannot be reset alone); split like a shell would (no shell runs).
    # Bare metal: "nvidia-smi --gpu-reset -i {index}"; in a VM, a hypervisor hook. Empty: never
    # reset, exit 6 instead.
    reset_command: str = ""
    reset_timeout_s: float = 120.0
    # Unpinning 243 GB after SIGKILL takes ~26 s (sglang PR #32829); allow for larger pools.
    release_timeout_s: float = 120.0
    release_tolerance_bytes: int = 1 * GiB  # used memory counts as released within this
    d_state_grace_s: float = 120.0  # extra wait for holders stuck in D state
    nvml_timeout_s: float = 5.0  # one NVML query; longer means NVML hangs (GPU state unknown)
    # The first query: the NVML worker imports pynvml and runs nvmlInit, seconds on many GPUs
    # without persistence mode. No answer by then is a hang too: no launch until NVML answers.
    nvml_start_timeout_s: float = 15.0
    # The health gate before each launch (docs/gpu-health.md): enforce refuses a sick GPU,
    # warn only reports it, off reads nothing.
    health: str = "enforce"
    max_volatile_dbe: int = 0  # uncorrectable ECC errors since the last reset that still pass

    def __post_init__(self) -> None:
        if self.backend not in GPU_BACKENDS:
            raise ConfigError(
                f"config key gpu.backend must be one of {'|'.join(GPU_BACKENDS)} "
                f"(got {self.backend!r})"
            )
        if self.health not in HEALTH_MODES:
            raise ConfigError(
                f"config key gpu.health must be one of {'|'.join(HEALTH_MODES)} "
                f"(got {self.health!r})"
            )
        if self.max_volatile_dbe < 0:
            raise ConfigError("config key gpu.max_volatile_dbe must be 0 or more")
        timeouts = ("reset_timeout_s", "release_timeout_s", "d_state_grace_s", "nvml_timeout_s")
        for name in (*timeouts, "nvml_start_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"config key gpu.{name[:-2]} must be positive")
        if self.reset_command:
            _check_reset_command(self.reset_command)
        check_limits(self, "gpu")


def _check_reset_command(command: str) -> None:
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise ConfigError(f"config key gpu.reset_command: {exc}") from None
    if not words:
        raise ConfigError("config key gpu.reset_command is blank")
    try:
        " ".join(words).format(index=0, uuid="GPU-0", indices="0")
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            "config key gpu.reset_command: only {index}, {uuid} and {indices} can be filled "
            f"in ({exc!r})"
        ) from None
