"""The supervisor's configuration: TOML sections, their loader, and the settings of one run."""

from typing import TYPE_CHECKING, Any

from supervisor.config.gpu_section import GpuConfig
from supervisor.config.group_section import GroupConfig
from supervisor.config.hooks import HooksConfig
from supervisor.config.loader import load_config, read_toml
from supervisor.config.sections import (
    HostConfig,
    LogConfig,
    NumaNodeSpec,
    PreflightConfig,
    RunConfig,
    ServerConfig,
    SupervisorConfig,
    WatchdogConfig,
)

if TYPE_CHECKING:
    from supervisor.config.settings import RunSettings

__all__ = [
    "GpuConfig",
    "GroupConfig",
    "HooksConfig",
    "HostConfig",
    "LogConfig",
    "NumaNodeSpec",
    "PreflightConfig",
    "RunConfig",
    "RunSettings",
    "ServerConfig",
    "SupervisorConfig",
    "WatchdogConfig",
    "load_config",
    "read_toml",
]


def __getattr__(name: str) -> Any:
    # RunSettings is `run`'s alone: loaded on first use, the pre-flight does not build its class.
    if name == "RunSettings":
        from supervisor.config.settings import RunSettings

        return RunSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
