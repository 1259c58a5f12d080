"""`[http]` and `[metrics]`: the supervisor's HTTP listener and its Prometheus metrics."""

from __future__ import annotations

import dataclasses

from supervisor.config.limits import check_limits
from supervisor.core.listen import is_loopback, split_listen
from supervisor.errors import ConfigError

_FROZEN = {"frozen": True, "slots": True, "kw_only": True}


@dataclasses.dataclass(**_FROZEN)
class HttpConfig:
    """The one HTTP listener (`/metrics`); off unless `listen` is given."""

    listen: str = ""  # HOST:PORT ([::1]:PORT for IPv6); empty: no listener
    # /metrics tells whoever can reach it what the host runs: loopback only unless asked.
    allow_remote: bool = False

    def __post_init__(self) -> None:
        check_limits(self, "http")
        if not self.listen:
            return
        try:
            host, _port = split_listen(self.listen)
        except ValueError as exc:
            raise ConfigError(f"config key http.listen: {exc}") from None
        if not is_loopback(host) and not self.allow_remote:
            raise ConfigError(
                f"config key http.listen: {host} is not a loopback address; serving beyond "
                "this host needs http.allow_remote = true"
            )

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) to bind, or None when the listener is off."""
        return split_listen(self.listen) if self.listen else None


@dataclasses.dataclass(**_FROZEN)
class MetricsConfig:
    """Where the metrics go besides `/metrics`."""

    # A file for node_exporter's textfile collector (it reads *.prom only), rewritten at most
    # every 5 s and at exit; relative to the config file's directory. Empty: none.
    textfile: str = ""

    def __post_init__(self) -> None:
        check_limits(self, "metrics")
        if self.textfile and not self.textfile.endswith(".prom"):
            raise ConfigError(
                f"config key metrics.textfile must end in .prom, the only files node_exporter's "
                f"textfile collector reads (got {self.textfile!r})"
            )
