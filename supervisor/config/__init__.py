"""The supervisor's configuration: TOML sections, their loader, and the settings of one run."""

from supervisor.config.loader import load_config, read_toml
from supervisor.config.sections import (
    GpuConfig,
    HostConfig,
    NumaNodeSpec,
    PreflightConfig,
    RunConfig,
    ServerConfig,
    SupervisorConfig,
    WatchdogConfig,
)
from supervisor.config.settings import RunSettings

__all__ = [
    "GpuConfig",
    "HostConfig",
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
