"""`[http] listen` addresses: HOST:PORT parsed, loopback told from remote."""

from __future__ import annotations

import pytest

from supervisor.core.listen import is_loopback, split_listen


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.0.0.1:9400", ("127.0.0.1", 9400)),
        ("localhost:0", ("localhost", 0)),
        ("[::1]:9400", ("::1", 9400)),
        ("0.0.0.0:65535", ("0.0.0.0", 65535)),
    ],
)
def test_host_and_port_are_split(text, address):
    assert split_listen(text) == address


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("9400", "not HOST:PORT"),
        (":9400", "not HOST:PORT"),
        ("127.0.0.1:", "port must be a number"),
        ("127.0.0.1:http", "port must be a number"),
        ("127.0.0.1:65536", "port must be a number"),
        ("::1:9400", "in brackets"),
        ("[]:9400", "has no host"),
    ],
)
def test_a_malformed_address_says_what_is_wrong(text, why):
    with pytest.raises(ValueError, match=why):
        split_listen(text)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("metrics.example.com", False),  # a name is not known to be local without resolving it
    ],
)
def test_loopback_is_told_from_remote(host, loopback):
    assert is_loopback(host) is loopback
