"""The jupyter probe against servers that are not (working) Jupyter, on the wire: plain HTTP,
silence, trickles, endless trailers, SSH, IPv6; and the small HTTP parser it reads replies with."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probes.result import Status
from probes.services import jupyter, net
from tests.services.conftest import (
    Listener,
    fake_jupyter,
    make_ctx,
    neighbour_port,
    no_runtime,
    probe,
    trickle,
)

# ---------------------------------------------------------------- servers that are not (working) Jupyter

def test_plain_http_hello_is_not_jupyter(hello_http: Any, tmp_path: Path) -> None:
    r = probe(jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=hello_http.server_address[1])
    assert (r.status, r.reason) == (Status.FAIL, "not-jupyter")
    assert "not Jupyter" in r.message and "HTTP 200" in r.message


def test_silent_listener_is_hung_by_the_deadline(silent: Listener, tmp_path: Path) -> None:
    t0 = time.monotonic()
    r = probe(1.0, jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=silent.port)
    assert time.monotonic() - t0 < 1.5
    assert (r.status, r.reason) == (Status.FAIL, "hung")


def test_trickling_server_returns_by_the_deadline(scripted: Any, tmp_path: Path) -> None:
    body = b'{"version": "2.0.0"}'
    srv = scripted(trickle(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body), 0.2))
    t0 = time.monotonic()
    r = probe(1.0, jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=srv.port)
    assert time.monotonic() - t0 < 1.5
    assert (r.status, r.reason) == (Status.FAIL, "deadline")


def test_nothing_listening_names_what_does(silent: Listener, tmp_path: Path) -> None:
    port = neighbour_port(silent)
    r = probe(jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=port)
    assert (r.status, r.reason) == (Status.FAIL, "refused")
    assert "nothing listening" in r.message and f"127.0.0.1:{silent.port}" in r.message


def test_chunked_trailer_that_never_ends_is_bounded(scripted: Any, tmp_path: Path) -> None:
    # Head, a last chunk, then trailer fields for ever: today's reply limit must hold for all of it.
    def handler(conn: socket.socket) -> None:
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n0\r\n")
        end = time.monotonic() + 5
        while time.monotonic() < end:
            conn.sendall(b"X-Pad: " + b"a" * 1000 + b"\r\n")
    srv = scripted(handler)
    ctx = make_ctx(3.0, jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=srv.port)
    t0 = time.monotonic()
    data = jupyter.gather(ctx)
    r = jupyter.judge(data, ctx)
    assert time.monotonic() - t0 < 1.5, "it read until the deadline"
    assert data["received"] <= net.MAX_REPLY + 1
    assert (r.status, r.reason) == (Status.FAIL, "not-jupyter")
    assert "not Jupyter" in r.message and "reply too large" in r.message and "144 KiB in all at most" in r.message


def test_ssh_server_on_the_jupyter_port(scripted: Any, tmp_path: Path) -> None:
    srv = scripted(lambda c: (c.sendall(b"SSH-2.0-OpenSSH_9.2\r\n"), time.sleep(3)))
    r = probe(2.0, jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=srv.port)
    assert r.reason == "not-jupyter" and "SSH-2.0-OpenSSH_9.2" in r.message


def test_ipv6_loopback_and_request_shape(scripted: Any, tmp_path: Path) -> None:
    seen: list[bytes] = []
    try:
        srv = scripted(fake_jupyter(seen), host="::1")
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    r = probe(host="::1", jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=srv.port)
    assert r.status is Status.PASS, r.message
    assert r.facts["version"] == "9.9.9"
    request = seen[0].decode()
    assert request.startswith("GET /api HTTP/1.1\r\n")
    assert f"Host: [::1]:{srv.port}\r\n" in request
    assert "token" not in request.lower() and "authorization" not in request.lower()


# ---------------------------------------------------------------- the HTTP parser

def test_parser_accepts_well_formed_replies() -> None:
    ok = net.parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", eof=False)
    assert ok == {"status": 200, "content_type": "", "body": b"{}"}
    assert net.parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{}", eof=False) is None
    assert net.parse_response(b"HTTP/1.0 200 OK\r\n\r\nabc", eof=True)["body"] == b"abc"
    assert net.parse_response(b"HTTP/1.0 200 OK\r\n\r\nabc", eof=False) is None
    assert net.parse_response(b"HTT", eof=False) is None


@pytest.mark.parametrize("raw", [
    b"SSH-2.0-x\r\n",
    b"HTTP/2 200\r\n\r\n",
    b"HTTP/1.1 20x OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n folded\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX: " + b"a" * 20000,
])
def test_parser_rejects_malformed_replies(raw: bytes) -> None:
    with pytest.raises(net.HttpError):
        net.parse_response(raw, eof=True)


def test_parser_bounds_the_whole_reply() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    with pytest.raises(net.TooLarge):
        net.parse_response(head + b"0\r\n" + b"X-Pad: a\r\n" * 3000, eof=False)  # trailer
    with pytest.raises(net.TooLarge, match="too many chunks"):  # tiny chunks, a small body
        net.parse_response(head + b"1\r\nx\r\n" * 2000, eof=False)
    # Every part within its own bound (body, chunk count, size lines, trailer), the whole too large.
    chunk = b"3f;" + b"e" * 61 + b"\r\n" + b"x" * 63 + b"\r\n"
    flood = head + chunk * 1020 + b"0\r\nX-Pad: " + b"a" * 16000 + b"\r\n"
    with pytest.raises(net.TooLarge, match="reply too large"):
        net.parse_response(flood, eof=False)
    ok = head + b"1\r\nx\r\n" * 100 + b"0\r\nX-Pad: a\r\n\r\n"
    assert net.parse_response(ok, eof=False)["body"] == b"x" * 100


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.booleans())
def test_parser_only_ever_raises_http_error(raw: bytes, eof: bool) -> None:
    try:
        net.parse_response(b"HTTP/1.1 200 OK\r\n" + raw, eof)
        net.parse_response(raw, eof)
    except net.HttpError:
        pass


def test_request_path_is_encoded() -> None:
    assert jupyter.quote_path("/user/a b/api") == "/user/a%20b/api"
    assert jupyter.quote_path("/ü/api") == "/%C3%BC/api"


def test_the_outcome_table_speaks_only_the_declared_causes() -> None:
    """Each failing row of the judge's table is a cause of the declaration (and so of docs/probes.md's
    cause table), and each declared cause is a row's."""
    declared = {c.reason for c in jupyter.SPEC.causes}
    rows = {found.reason for found, _ in jupyter.OUTCOMES.values() if found is not None}
    assert rows == declared
    assert [row for row, (found, _) in jupyter.OUTCOMES.items() if found is None] == ["ok"]
