"""A listen address (`[http] listen = "127.0.0.1:9400"`): parsed, and judged local or not."""

from __future__ import annotations

import ipaddress


def split_listen(listen: str) -> tuple[str, int]:
    """("127.0.0.1", 9400) from "127.0.0.1:9400"; IPv6 in brackets: "[::1]:9400".

    Raises:
        ValueError: no host or port, a port outside 0-65535, or IPv6 without brackets.
    """
    host, sep, port_text = listen.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{listen!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{listen!r}: write an IPv6 address in brackets, [::1]:PORT")
    if not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"{listen!r}: the port must be a number from 0 to 65535")
    if not host:
        raise ValueError(f"{listen!r} has no host")
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses. Any other name counts as remote: whether
    it resolves to this host only is not known without resolving it."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def probe_host(host: str) -> str:
    """Where to connect for a server bound to `host` (a wildcard is reached over loopback)."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host
