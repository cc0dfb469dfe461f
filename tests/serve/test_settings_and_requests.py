"""What `healthcheck serve` accepts: the address it binds, its intervals, the requests it answers.

Settings are judged by load (the same code serve runs) and by a real serve process;
requests are raw bytes on a real socket to a real server.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from probes.config import ConfigError
from probes.serve.cli import load
from probes.state import State
from tests.conftest import ROOT, clean_env
from tests.serve.conftest import ALL_OFF, PYTHON, watch_env

# --------------------------------------------------------------------------- the address


@pytest.mark.parametrize("raw", [
    "0", "1", "127.1", "0x7f000001", "256.1.1.1", "1.2.3.4.5", "example.invalid", "localhost.localdomain", "*",
    "[::1]", "::1::", "fe80::1%lo", "127.0.0.1:8779", "\uff11\uff12\uff17.0.0.1", "\u0661.0.0.1", "1" * 100_000,
])
def test_a_host_that_is_no_address_literal_is_refused_naming_the_setting(raw: str):
    with pytest.raises(ConfigError) as env_error:
        load(clean_env(HEALTHCHECK_SERVE_HOST=raw))
    with pytest.raises(ConfigError) as flag_error:
        load(clean_env(HEALTHCHECK_SERVE_HOST="127.0.0.1"), host=raw)
    # A value longer than any setting takes is refused as every setting refuses it.
    accepted = "accepted: at most 4096" if len(raw) > 4096 else "accepted: an IPv4 or IPv6 address"
    for error, name in ((env_error, "HEALTHCHECK_SERVE_HOST="), (flag_error, "--host=")):
        text = str(error.value)
        assert text.startswith(name) and accepted in text, text
        assert len(text) < 400 and text.isprintable()


@pytest.mark.parametrize(("raw", "bound"), [
    ("127.0.0.1", "127.0.0.1"), (" ::1 ", "::1"), ("0.0.0.0", "0.0.0.0"), ("::", "::"),
    ("localhost", "127.0.0.1"), ("LocalHost", "127.0.0.1"), ("192.0.2.7", "192.0.2.7"),
    ("::ffff:127.0.0.1", "::ffff:127.0.0.1"),
])
def test_address_literals_and_localhost_are_accepted(raw: str, bound: str):
    assert load(clean_env(HEALTHCHECK_SERVE_HOST=raw))[0].host == bound
    assert load(clean_env(), host=raw)[0].host == bound


def _serve(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "probes", "serve", "--port", "0", *args], cwd=ROOT,
                          env=clean_env(**ALL_OFF, **env), capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize(("args", "env", "name"), [
    ([], {"HEALTHCHECK_SERVE_HOST": "example.invalid"}, "HEALTHCHECK_SERVE_HOST"),
    (["--host", "256.1.1.1"], {}, "--host"),
    ([], {"HEALTHCHECK_SERVE_HOST": "0"}, "HEALTHCHECK_SERVE_HOST"),
    # Well-formed, but no address of this machine (TEST-NET-1 is never assigned).
    ([], {"HEALTHCHECK_SERVE_HOST": "192.0.2.1"}, "HEALTHCHECK_SERVE_HOST=192.0.2.1 cannot be bound here"),
    (["--host", "::ffff:192.0.2.1"], {}, "--host=::ffff:192.0.2.1 cannot be bound here"),
])
def test_an_address_serve_cannot_bind_is_a_configuration_error(args: list[str], env: dict[str, str], name: str):
    r = _serve(*args, **env)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 3, r
    assert len(lines) == 1 and name in lines[0] and "accepted:" in lines[0], r.stderr
    assert "Unknown error" not in r.stderr and "--port" not in r.stderr and "Traceback" not in r.stderr


# --------------------------------------------------------------------------- timing settings


@pytest.mark.parametrize(("env", "interval"), [
    ({"HEALTHCHECK_SERVE_INTERVAL": "0.0000001"}, None),
    ({"HEALTHCHECK_SERVE_INTERVAL": "liveness=0.2"}, None),
    ({}, "0.1"),
    ({}, "readiness=15,startup=0.24"),
    ({"HEALTHCHECK_SERVE_SLOWDOWN_SAMPLE": "0.0001"}, None),
    ({"HEALTHCHECK_SERVE_SLOWDOWN_SAMPLE": "0.09"}, None),
])
def test_intervals_too_short_to_pause_are_refused(env: dict[str, str], interval: str | None):
    with pytest.raises(ConfigError, match="accepted: "):
        load(clean_env(**env), intervals=interval)


def test_the_floors_are_where_the_docs_say():
    s = load(clean_env(HEALTHCHECK_SERVE_SLOWDOWN_SAMPLE="0.1"), intervals="0.25")[0]
    assert dict(s.intervals) == {"startup": 0.25, "readiness": 0.25, "liveness": 0.25}
    assert s.slowdown_sample == 0.1
    assert load(clean_env(HEALTHCHECK_SERVE_SLOWDOWN_SAMPLE="0"))[0].slowdown_sample == 0  # off
    with pytest.raises(ConfigError, match=r"at least 0\.25 "):
        load(clean_env(), intervals="0.2499")
    with pytest.raises(ConfigError, match=r"0 for off, or seconds from 0\.1 to 3600"):
        load(clean_env(HEALTHCHECK_SERVE_SLOWDOWN_SAMPLE="0.0999"))


# --------------------------------------------------------------------------- requests


def _raw(port: int, request: bytes) -> bytes:
    """What the server answers ``request`` (sent as is) until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


LINE_MAX = 65536  # http.server's limit on the request line and on each header line
# Each is sent whole and read whole by the server before it answers (a request cut short
# would leave unread bytes, and the kernel answers those with a reset that can eat the answer).
REFUSED = [
    (b"GET /livez\r\n", 505),  # HTTP/0.9: no version
    (b"GET /livez HTTP/0.9\r\n\r\n", 505),
    (b"GET /livez HTTP/2.0\r\n\r\n", 505),
    (b"GET /readyz HTTP/3\r\n\r\n", 400),
    (b"GET /livez HTTP/x.y-secret-token\r\n\r\n", 400),
    (b"GET /livez HTTP/1.1 secret-token\r\n\r\n", 400),
    (b"BREW\r\n", 400),
    (bytes.fromhex("16030100f4010000f00303") + bytes(range(0x80, 0xa0)) + b"\r\n", 400),  # a TLS hello
    (b"\x00\xff\xfe secret-token \x1b[31m\r\n", 400),
    (b"POST /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 501),
    (b"SECRET-TOKEN /livez HTTP/1.0\r\n\r\n", 501),
    ((b"GET /" + b"secret-token" * 6000)[:LINE_MAX + 1], 414),
    ((b"GET /livez HTTP/1.1\r\nX-Pad: " + b"secret-token" * 6000)[:21 + LINE_MAX + 1], 431),
    (b"GET /livez HTTP/1.1\r\n" + b"".join(b"X-%d: secret-token\r\n" % i for i in range(101)), 431),
]


def test_every_refused_request_gets_a_status_line_and_health_json(start_server):
    srv = start_server(ALL_OFF, "--interval", "3600")
    for request, code in REFUSED:
        case = f"{request[:40]!r}: "
        answer = _raw(srv.port, request)
        head, _, body = answer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        assert lines[0].startswith(b"HTTP/1.1 %d " % code), case + repr(answer[:200])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
        assert headers[b"content-type"] == b"application/health+json", case + repr(head)
        assert headers[b"connection"] == b"close", case + repr(head)
        assert int(headers[b"content-length"]) == len(body) < 400, case + repr(answer)
        doc = json.loads(body)
        assert doc["status"] == "fail" and doc["reason"] and doc["checks"] == {}, case + repr(doc)
        assert b"secret" not in answer.lower() and b"<html" not in answer.lower(), case + repr(answer)
        assert b"\x1b" not in answer, case + repr(answer)
    assert srv.health("/livez")[0] in (200, 503)  # and it still serves
    assert srv.terminate() == 0


def test_a_head_request_refused_has_no_body(start_server):
    srv = start_server(ALL_OFF, "--interval", "3600")
    answer = _raw(srv.port, (b"HEAD /livez HTTP/1.1\r\nX-Pad: " + b"a" * LINE_MAX)[:22 + LINE_MAX + 1])
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 ") and b"application/health+json" in head and body == b""
    assert srv.terminate() == 0


# --------------------------------------------------------------------------- /<endpoint>/latch


def test_latch_is_a_check_of_every_endpoint(start_server):
    srv = start_server(ALL_OFF, "--interval", "0.5")
    srv.wait_runs_ended()
    for path in ("/livez", "/readyz", "/startupz"):
        _, body = srv.wait_for(f"{path}/latch", lambda c, b: c == 200, 20, f"{path}/latch answers")
        assert list(body["checks"]) == ["latch:state"] and body["checks"]["latch:state"][0]["status"] == "pass"
    _, _, text = srv.get("/readyz?verbose")
    assert "[+]latch ok" in text.decode().splitlines()
    _, body = srv.health("/readyz?exclude=latch")
    assert "latch:state" not in body["checks"] and not any("no matches" in n for n in body["notes"])

    State(str(srv.state)).set_latch("torch-cuda", "fatal CUDA error (illegal address)")
    for path in ("/livez/latch", "/readyz/latch"):
        _, body = srv.wait_for(path, lambda c, b: c == 503, 20, f"{path} turns 503")
        entry = body["checks"]["latch:state"][0]
        assert entry["status"] == "fail" and "illegal address" in entry["output"], body
    assert srv.health("/startupz/latch")[0] == 200  # startup passed before: that answer stands
    assert srv.terminate() == 0


# --------------------------------------------------------------------------- the event watch's state


def _watch_state(srv) -> str:
    _, _, text = srv.get("/metrics")
    on = [line for line in text.decode().splitlines()
          if line.startswith("healthcheck_nvml_event_watch{") and line.endswith(" 1.0")]
    assert len(on) == 1, on
    return on[0].split('"')[1]


@pytest.mark.parametrize("stuck", ["nvmlInit", "nvmlDeviceRegisterEvents"])
def test_the_event_watch_is_starting_until_nvml_has_registered_it(start_server, fake_nvml, tmp_path: Path,
                                                                  stuck: str):
    srv = start_server(watch_env(fake_nvml, tmp_path, f"gpus 1\nhang {stuck} 4000\n"), "--interval", "3600")
    seen = set()
    end = time.monotonic() + 2.0  # well inside the 4 s NVML is stuck for
    while time.monotonic() < end:
        seen.add(_watch_state(srv))
        time.sleep(0.05)
    assert seen == {"starting"}, seen
    end = time.monotonic() + 20
    while (state := _watch_state(srv)) != "running":
        assert time.monotonic() < end, f"never running: {state}\n{srv.log_text()}"
        time.sleep(0.1)
    assert srv.terminate() == 0
