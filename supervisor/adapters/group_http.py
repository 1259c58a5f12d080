"""The network of a multi-node group: whether the leader's name resolves, a worker's report to
the leader's supervisor, and the knock on SGLang's launch gate. Every call is bounded by its
timeout and answers with a status or raises Unreachable; nothing here retries (the caller's
wait loop does, on its interruptible clock).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass

import requests

# A leader that accepted the connection answers a report in microseconds: a slow answer is a
# sick leader, and the worker's loop asks again.
CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 5.0


class Unreachable(Exception):
    """No HTTP answer (refused, timed out, reset, no route); the message says which."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes


def resolves(host: str) -> bool:
    """True when `host` resolves to at least one address (a DNS name, or an IP literal)."""
    try:
        return bool(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM))
    except (OSError, UnicodeError):  # gaierror is an OSError; a bad IDNA label a UnicodeError
        return False


def url(host: str, port: int, path: str) -> str:
    """http://HOST:PORT/path, an IPv6 literal in brackets."""
    target = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{target}:{port}{path}"


def post_json(address: str, payload: Mapping[str, object], *, token: str | None = None) -> Answer:
    """POST `payload` as JSON (with `Authorization: Bearer <token>` when given).

    Raises:
        Unreachable: no answer; the message says why, without the token.
    """
    headers = {"Connection": "close", "Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return _call("POST", address, headers, json.dumps(payload).encode())


def get(address: str, *, timeout_s: float | None = None) -> Answer:
    """GET `address`, waiting for the answer up to `timeout_s` (default READ_TIMEOUT_S).

    Raises:
        Unreachable: no answer.
    """
    return _call("GET", address, {"Connection": "close"}, None, timeout_s)


def post_empty(address: str) -> Answer:
    """POST with no body (SGLang's `/gate/activate`).

    Raises:
        Unreachable: no answer.
    """
    return _call("POST", address, {"Connection": "close"}, b"")


def _call(
    method: str,
    address: str,
    headers: dict[str, str],
    body: bytes | None,
    timeout_s: float | None = None,
) -> Answer:
    read_s = READ_TIMEOUT_S if timeout_s is None else timeout_s
    connect_s = min(CONNECT_TIMEOUT_S, read_s)
    try:
        response = requests.request(
            method,
            address,
            headers=headers,
            data=body,
            timeout=(connect_s, read_s),
            allow_redirects=False,
        )
    except requests.exceptions.ConnectTimeout:
        raise Unreachable(f"no connection within {connect_s:g} s") from None
    except requests.exceptions.ReadTimeout:
        raise Unreachable(f"no answer within {read_s:g} s") from None
    except requests.exceptions.ConnectionError as exc:
        raise Unreachable(_why(exc)) from None
    except requests.exceptions.RequestException as exc:
        raise Unreachable(type(exc).__name__) from None
    return Answer(response.status_code, response.content)


def _why(exc: BaseException) -> str:
    """A short reason from urllib3's nested errors (never the whole chain)."""
    text = str(exc)
    for marker in (
        "Connection refused",
        "Name or service not known",
        "No route to host",
        "Connection reset",
        "Temporary failure in name resolution",
    ):
        if marker in text:
            return marker.lower()
    return "connection failed"
