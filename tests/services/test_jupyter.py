"""The jupyter probe against a real Jupyter Server (plain, base URL, HTTPS) and against
servers that are not Jupyter, hang, trickle, or speak the other side of TLS."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probes.result import Result, Status
from probes.services import jupyter
from tests.conftest import ROOT, clean_env, run_cli
from tests.services.conftest import TOKEN, Jupyter, Listener, free_port, make_ctx, neighbour_port, trickle

PROXIES = {k: "http://127.0.0.1:9" for k in
           ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")}


def probe(timeout: float = 3.0, **config: Any) -> Result:
    ctx = make_ctx(timeout, **config)
    result = jupyter.judge(jupyter.gather(ctx), ctx)
    assert time.monotonic() <= ctx.deadline + 0.5, "the probe overran its deadline"
    assert "\n" not in result.message
    assert TOKEN not in repr(result) and TOKEN not in json.dumps(result.to_dict())
    return result


def no_runtime(tmp_path: Path) -> str:
    empty = tmp_path / "no-runtime"
    empty.mkdir(exist_ok=True)
    return str(empty)


# ---------------------------------------------------------------- real Jupyter Server

def test_found_through_its_runtime_file(jupyter: Jupyter) -> None:
    r = probe(jupyter_runtime_dir=str(jupyter.runtime), jupyter_port=1)
    assert r.status is Status.PASS, r.message
    assert r.facts["runtime_file"].startswith("jpserver-") and r.facts["port"] == jupyter.port
    assert r.unit == "ms" and r.observed >= 0
    assert r.facts["version"]


def test_found_through_the_port(jupyter: Jupyter, tmp_path: Path) -> None:
    r = probe(jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=jupyter.port)
    assert r.status is Status.PASS, r.message
    assert r.facts["runtime_file"] is None


def test_runtime_dir_from_the_jupyter_environment(jupyter: Jupyter, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(jupyter.runtime))
    r = probe(jupyter_port=1)
    assert r.status is Status.PASS, r.message


def test_base_url_through_runtime_file_and_port(jupyter_base: Jupyter, tmp_path: Path) -> None:
    r = probe(jupyter_runtime_dir=str(jupyter_base.runtime))
    assert r.status is Status.PASS, r.message
    assert "/user/alice/api" in r.message
    r = probe(jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=jupyter_base.port,
              jupyter_base_url="/user/alice/")
    assert r.status is Status.PASS, r.message


def test_wrong_base_url_is_explained(jupyter_base: Jupyter, tmp_path: Path) -> None:
    r = probe(jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=jupyter_base.port)
    assert (r.status, r.reason) == (Status.FAIL, "not-jupyter")
    assert "404" in r.message and "HEALTHCHECK_JUPYTER_BASE_URL" in r.message


def test_https_jupyter_through_its_runtime_file(jupyter_tls: Jupyter) -> None:
    r = probe(jupyter_runtime_dir=str(jupyter_tls.runtime))
    assert r.status is Status.PASS, r.message
    assert r.facts["secure"] is True and "https://" in r.message


def test_https_jupyter_probed_as_plain_http_is_a_tls_mismatch(jupyter_tls: Jupyter, tmp_path: Path) -> None:
    r = probe(jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=jupyter_tls.port)
    assert (r.status, r.reason) == (Status.FAIL, "tls-mismatch")
    assert "HTTPS" in r.message and "HEALTHCHECK_JUPYTER_RUNTIME_DIR" in r.message


def test_runtime_file_saying_https_for_a_plain_server_is_a_tls_mismatch(jupyter: Jupyter,
                                                                        tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    rt.mkdir()
    (rt / f"jpserver-{os.getpid()}.json").write_text(json.dumps(
        {"pid": os.getpid(), "port": jupyter.port, "base_url": "/", "secure": True,
         "hostname": "127.0.0.1", "token": TOKEN, "url": f"https://127.0.0.1:{jupyter.port}/"}))
    r = probe(jupyter_runtime_dir=str(rt))
    assert (r.status, r.reason) == (Status.FAIL, "tls-mismatch")
    assert "plain HTTP" in r.message


def test_proxy_variables_do_not_apply(jupyter: Jupyter, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in PROXIES.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert probe(jupyter_runtime_dir=str(jupyter.runtime)).status is Status.PASS
    assert probe(jupyter_runtime_dir=str(jupyter.runtime), jupyter_port=jupyter.port).status is Status.PASS


def test_a_live_runtime_file_wins_over_a_stale_one(jupyter: Jupyter, tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    rt.mkdir()
    live = next(jupyter.runtime.glob("jpserver-*.json"))
    (rt / live.name).write_text(live.read_text())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = rt / f"jpserver-{dead.stdout.strip()}.json"
    stale.write_text(json.dumps({"pid": int(dead.stdout), "port": free_port(), "base_url": "/",
                                 "secure": False, "hostname": "127.0.0.1"}))
    os.utime(stale)  # newer than the live one: liveness still decides
    r = probe(jupyter_runtime_dir=str(rt))
    assert r.status is Status.PASS, r.message
    assert r.facts["runtime_file"] == live.name


def test_stale_runtime_file_alone_is_explained(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    (tmp_path / f"jpserver-{dead.stdout.strip()}.json").write_text(json.dumps(
        {"pid": int(dead.stdout), "port": free_port(), "base_url": "/", "secure": False, "token": TOKEN}))
    r = probe(jupyter_runtime_dir=str(tmp_path))
    assert r.reason == "refused" and "stale" in r.message


def test_only_imports_what_it_needs(jupyter: Jupyter) -> None:
    code = ("import sys, time\n"
            "from probes.config import Config\nfrom probes.context import Context\n"
            "from probes.state import State\nfrom probes.services import jupyter, ssh\n"
            f"ctx = Context(Config(jupyter_runtime_dir={str(jupyter.runtime)!r}), time.monotonic() + 3, "
            "{}, State.off('t'))\n"
            "r = jupyter.judge(jupyter.gather(ctx), ctx)\n"
            "print(r.status.value, sorted(m for m in ('ssl', 'http.client', 'email.parser', 'psutil', "
            "'urllib.request') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=clean_env(), timeout=30, check=False)
    assert out.stdout.split() == ["pass", "[]"], out.stdout + out.stderr


# ---------------------------------------------------------------- the whole CLI: no token anywhere

@pytest.mark.skipif(not (ROOT / "probes" / "cli.py").exists(), reason="the CLI is not there yet")
@pytest.mark.parametrize("flags", [(), ("--json",), ("-v",), ("--json", "-v")])
def test_cli_never_shows_the_token(jupyter: Jupyter, tmp_path: Path, flags: tuple[str, ...]) -> None:
    env = clean_env(HEALTHCHECK_JUPYTER_RUNTIME_DIR=str(jupyter.runtime), HEALTHCHECK_STATE_DIR=str(tmp_path),
                    HEALTHCHECK_LOG_FILE=str(tmp_path / "log"), **PROXIES)
    out = run_cli("--only", "jupyter", *flags, env=env, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert TOKEN not in out.stdout + out.stderr
    log = tmp_path / "log"
    assert not log.exists() or TOKEN not in log.read_text()
    if "--json" in flags:
        doc = json.loads(out.stdout)
        assert doc["checks"]["jupyter:responseTime"][0]["status"] == "pass"


@pytest.mark.skipif(not (ROOT / "probes" / "cli.py").exists(), reason="the CLI is not there yet")
def test_cli_failure_never_shows_the_token(jupyter: Jupyter, tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    rt.mkdir()
    (rt / f"jpserver-{os.getpid()}.json").write_text(json.dumps(
        {"pid": os.getpid(), "port": jupyter.port, "base_url": f"/{TOKEN}/", "secure": True,
         "token": TOKEN, "url": f"https://127.0.0.1:{jupyter.port}/?token={TOKEN}"}))
    env = clean_env(HEALTHCHECK_JUPYTER_RUNTIME_DIR=str(rt), HEALTHCHECK_STATE_DIR=str(tmp_path))
    out = run_cli("--only", "jupyter", "--json", env=env, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "tls-mismatch" in out.stdout
    # A base URL is not a secret, but this one carries the token's text: only the token field is
    # guaranteed to stay out, so check that the file's token field did not leak on its own.
    assert out.stdout.count(TOKEN) <= out.stdout.count(f"/{TOKEN}/")


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
    assert data["received"] <= jupyter.MAX_REPLY + 1
    assert (r.status, r.reason) == (Status.FAIL, "not-jupyter")
    assert "not Jupyter" in r.message and "reply too large" in r.message


def test_ssh_server_on_the_jupyter_port(scripted: Any, tmp_path: Path) -> None:
    srv = scripted(lambda c: (c.sendall(b"SSH-2.0-OpenSSH_9.2\r\n"), time.sleep(3)))
    r = probe(2.0, jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=srv.port)
    assert r.reason == "not-jupyter" and "SSH-2.0-OpenSSH_9.2" in r.message


def _fake_jupyter(seen: list[bytes]) -> Any:
    def handler(conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                return
            data += chunk
        seen.append(data)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                     b"\r\n5\r\n{\"ver\r\n10\r\nsion\": \"9.9.9\"} \r\n0\r\n\r\n")
    return handler


def test_ipv6_loopback_and_request_shape(scripted: Any, tmp_path: Path) -> None:
    seen: list[bytes] = []
    try:
        srv = scripted(_fake_jupyter(seen), host="::1")
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
    ok = jupyter.parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", eof=False)
    assert ok == {"status": 200, "content_type": "", "body": b"{}"}
    assert jupyter.parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{}", eof=False) is None
    assert jupyter.parse_response(b"HTTP/1.0 200 OK\r\n\r\nabc", eof=True)["body"] == b"abc"
    assert jupyter.parse_response(b"HTTP/1.0 200 OK\r\n\r\nabc", eof=False) is None
    assert jupyter.parse_response(b"HTT", eof=False) is None


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
    with pytest.raises(jupyter.HttpError):
        jupyter.parse_response(raw, eof=True)


def test_parser_bounds_the_whole_reply() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    with pytest.raises(jupyter.TooLarge):
        jupyter.parse_response(head + b"0\r\n" + b"X-Pad: a\r\n" * 3000, eof=False)  # trailer
    with pytest.raises(jupyter.TooLarge, match="too many chunks"):  # tiny chunks, a small body
        jupyter.parse_response(head + b"1\r\nx\r\n" * 2000, eof=False)
    # Every part within its own bound (body, chunk count, size lines, trailer), the whole too large.
    chunk = b"3f;" + b"e" * 61 + b"\r\n" + b"x" * 63 + b"\r\n"
    flood = head + chunk * 1020 + b"0\r\nX-Pad: " + b"a" * 16000 + b"\r\n"
    with pytest.raises(jupyter.TooLarge, match="reply too large"):
        jupyter.parse_response(flood, eof=False)
    ok = head + b"1\r\nx\r\n" * 100 + b"0\r\nX-Pad: a\r\n\r\n"
    assert jupyter.parse_response(ok, eof=False)["body"] == b"x" * 100


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.booleans())
def test_parser_only_ever_raises_http_error(raw: bytes, eof: bool) -> None:
    try:
        jupyter.parse_response(b"HTTP/1.1 200 OK\r\n" + raw, eof)
        jupyter.parse_response(raw, eof)
    except jupyter.HttpError:
        pass


def test_request_path_is_encoded() -> None:
    assert jupyter._request_path("/user/a b/") == "/user/a%20b/api"
    assert jupyter._request_path("/ü/") == "/%C3%BC/api"
