"""Probe SGLang's health endpoint over HTTP: refused = loading, 503 = warming, 200 = ready."""

from __future__ import annotations

import errno

import requests

from supervisor.core.lifecycle import HealthStatus
from supervisor.core.listen import probe_host

# SGLang's /health runs a one-token generation with a 20 s limit (SGLANG_HEALTH_CHECK_TIMEOUT,
# docs/sglang.md §4), so the probe's own timeout must be longer: 25 s by default. It answers 200
# no sooner than 1 s after the request (its handler sleeps first): config refuses a limit under
# two of those looks on /health and /health_generate (config/sections.py).
DEFAULT_TIMEOUT_S = 25.0


def health_url(host: str, port: int, path: str) -> str:
    target = probe_host(host)
    if ":" in target and not target.startswith("["):
        target = f"[{target}]"
    return f"http://{target}:{port}{path}"


class HttpHealthProbe:
    """One GET per check, a fresh connection each time (no stale keep-alive after a restart)."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = url
        self.timeout_s = timeout_s

    def check(self) -> HealthStatus:
        try:
            response = requests.get(
                self.url, timeout=self.timeout_s, headers={"Connection": "close"}
            )
        except requests.exceptions.Timeout:  # connect or read timeout
            return HealthStatus.TIMEOUT
        except requests.exceptions.ConnectionError as exc:
            return HealthStatus.REFUSED if _is_refused(exc) else HealthStatus.ERROR
        except requests.exceptions.RequestException:
            return HealthStatus.ERROR
        if response.status_code == 200:
            return HealthStatus.READY
        if response.status_code == 503:
            return HealthStatus.WARMING
        if response.status_code == 404:
            return HealthStatus.NOT_FOUND
        return HealthStatus.ERROR


def _is_refused(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError):
            return True
        if isinstance(current, OSError) and current.errno == errno.ECONNREFUSED:
            return True
        if "Connection refused" in str(current):
            return True
        current = current.__cause__ or current.__context__ or _first_arg_exception(current)
    return False


def _first_arg_exception(exc: BaseException) -> BaseException | None:
    for arg in getattr(exc, "args", ()):
        if isinstance(arg, BaseException):
            return arg
        reason = getattr(arg, "reason", None)
        if isinstance(reason, BaseException):
            return reason
    return None
