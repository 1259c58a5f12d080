"""The one HTTP listener: routes added by whoever has an endpoint, on loopback, port 0 or a
given one; an address in use is an OSError for the caller to report."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import requests

from supervisor.adapters.http_server import HttpListener, Request, Response


@pytest.fixture
def listener() -> Iterator[HttpListener]:
    served = HttpListener("127.0.0.1", 0)

    def echo(request: Request) -> Response:
        return Response(200, f"{request.method} {request.path} {dict(request.query)}".encode())

    served.route("/echo", echo, methods=("GET", "POST"))
    served.start()
    yield served
    served.close()


def url(listener: HttpListener, path: str) -> str:
    return f"http://127.0.0.1:{listener.port}{path}"


def test_port_0_binds_a_free_port_and_a_route_answers(listener):
    assert listener.port != 0
    answer = requests.get(url(listener, "/echo?x=1&x=2"), timeout=5)
    assert answer.status_code == 200
    assert answer.text == "GET /echo {'x': ['1', '2']}"
    assert answer.headers["Content-Type"] == "text/plain; charset=utf-8"


def test_a_route_added_after_start_is_served_and_post_bodies_reach_it(listener):
    listener.route("/late", lambda request: Response(201, request.body[::-1]), methods=("POST",))
    answer = requests.post(url(listener, "/late"), data=b"abc", timeout=5)
    assert (answer.status_code, answer.content) == (201, b"cba")


def test_unknown_paths_are_404_and_wrong_methods_405(listener):
    assert requests.get(url(listener, "/nothing"), timeout=5).status_code == 404
    listener.route("/only-get", lambda _r: Response(200, b"x"))
    assert requests.post(url(listener, "/only-get"), timeout=5).status_code == 405
    # HEAD is answered wherever GET is, without a body.
    head = requests.head(url(listener, "/only-get"), timeout=5)
    assert (head.status_code, head.content, head.headers["Content-Length"]) == (200, b"", "1")


def test_a_failing_endpoint_answers_500_and_the_listener_lives_on(listener, capfd):
    def broken(_request: Request) -> Response:
        raise RuntimeError("a bug")

    listener.route("/broken", broken)
    assert requests.get(url(listener, "/broken"), timeout=5).status_code == 500
    assert requests.get(url(listener, "/echo"), timeout=5).status_code == 200
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")  # nothing on stderr: a JSON log must stay JSON lines


def test_an_address_in_use_is_an_oserror_and_close_frees_the_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match="in use"):
            HttpListener("127.0.0.1", port).start()
    first = HttpListener("127.0.0.1", 0)
    _host, port = first.start()
    first.close()
    again = HttpListener("127.0.0.1", port)
    again.start()  # the port was released
    again.close()


def test_ipv6_loopback_is_served():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    served = HttpListener("::1", 0)
    try:
        served.start()
    except OSError as exc:
        pytest.skip(f"::1 cannot be bound here: {exc}")
    try:
        served.route("/x", lambda _r: Response(200, b"six"))
        assert requests.get(f"http://[::1]:{served.port}/x", timeout=5).text == "six"
    finally:
        served.close()
