"""Addresses in group mode: the leader's host as a launcher gives it, and SGLang's
--dist-init-addr HOST:PORT, read the way SGLang reads it (NetworkAddress.parse,
sglang/srt/utils/network.py): an IPv6 address in brackets, a bare one is ambiguous.
"""

from __future__ import annotations

import ipaddress
import re

# A DNS name or an IPv4 address: what a Kubernetes headless service or SkyPilot gives.
_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9._-]*[A-Za-z0-9_.])?")


def parse_host(text: str) -> str:
    """A host without a port: a DNS name, an IPv4 address, or IPv6 (brackets optional, dropped).

    Raises:
        ValueError: empty, a port or a scheme, characters no host has.
    """
    host = text.strip()
    if not host:
        raise ValueError("empty")
    inner = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" in inner:
        try:
            return str(ipaddress.IPv6Address(inner))
        except ValueError:
            pass
    elif _HOST_NAME.fullmatch(inner) and inner == host:
        return host
    raise ValueError("not a host name or IP address (no port, no scheme)")


def format_host_port(host: str, port: int) -> str:
    """HOST:PORT, an IPv6 address in brackets (as SGLang's NetworkAddress writes it)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(text: str) -> tuple[str, int]:
    """(host, port) from HOST:PORT or [IPv6]:PORT.

    Raises:
        ValueError: no host, no port, a port outside 0-65535, an unbracketed IPv6 address.
    """
    bad = ValueError(f"{text!r} is not HOST:PORT (an IPv6 address in brackets: [fd00::1]:20000)")
    if text.startswith("["):
        inner, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise bad
        try:
            host = str(ipaddress.IPv6Address(inner))
        except ValueError:
            raise bad from None
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host or ":" in host or host != host.strip():
            raise bad
    if not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
        raise bad
    return host, int(port_text)


def same_host(a: str, b: str) -> bool:
    """Whether two hosts are written the same: IP addresses by value, DNS names ignoring case
    and a trailing dot (no name is resolved)."""
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return a.lower().rstrip(".") == b.lower().rstrip(".")
