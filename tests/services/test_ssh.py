"""The ssh probe against a real sshd and against servers that misbehave in the ways that matter."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from probes.result import Result, Status
from probes.services import net, ssh
from tests.conftest import ROOT, clean_env, run_cli
from tests.services.conftest import Listener, free_port, make_ctx, neighbour_port, trickle


def probe(port: int, timeout: float = 3.0, host: str = "127.0.0.1") -> Result:
    ctx = make_ctx(timeout, host=host, ssh_port=port)
    result = ssh.judge(ssh.gather(ctx), ctx)
    assert time.monotonic() <= ctx.deadline + 0.5, "the probe overran its deadline"
    assert "\n" not in result.message
    return result


def test_real_sshd_passes_and_reports_its_version(sshd: Any) -> None:
    r = probe(sshd.port)
    assert r.status is Status.PASS, r.message
    assert str(r.observed).startswith("OpenSSH_")
    assert r.facts["protocol"] == "2.0"


def test_real_sshd_over_ipv6_loopback(sshd: Any) -> None:
    try:
        socket.create_connection(("::1", sshd.port), timeout=1).close()
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    r = probe(sshd.port, host="::1")
    assert r.status is Status.PASS, r.message
    assert f"[::1]:{sshd.port}" in r.message


def test_stopped_sshd_is_refused_and_says_what_listens(sshd: Any) -> None:
    assert probe(sshd.port).status is Status.PASS
    sshd.stop()
    r = probe(sshd.port)
    assert r.status is Status.FAIL
    assert r.reason == "refused"
    assert "refused" in r.message and "HEALTHCHECK_SSH_PORT" in r.message


def test_silent_listener_fails_with_no_banner_by_the_deadline(silent: Listener) -> None:
    t0 = time.monotonic()
    r = probe(silent.port, timeout=1.0)
    assert time.monotonic() - t0 < 1.5
    assert (r.status, r.reason) == (Status.FAIL, "no-banner")
    assert "no banner" in r.message


def test_http_server_on_the_ssh_port_is_not_an_ssh_banner(hello_http: Any) -> None:
    r = probe(hello_http.server_address[1])
    assert (r.status, r.reason) == (Status.FAIL, "not-ssh")
    assert "not an SSH banner" in r.message


def test_server_that_greets_with_http_first(scripted: Any) -> None:
    srv = scripted(lambda c: c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n"))
    r = probe(srv.port)
    assert r.reason == "not-ssh"
    assert "'HTTP/1.1 400 Bad Request'" in r.message


def echo(conn: socket.socket) -> None:
    """An echo service: sends back whatever it receives."""
    while True:
        chunk = conn.recv(1024)
        if not chunk:
            return
        conn.sendall(chunk)


def test_echo_server_is_not_sshd(scripted: Any) -> None:
    # Sending our identification first used to read it back as a valid banner: a pass.
    srv = scripted(echo)
    t0 = time.monotonic()
    r = probe(srv.port)
    assert time.monotonic() - t0 < ssh.SPEAK_AFTER + 1.0
    assert (r.status, r.reason) == (Status.FAIL, "echo"), r.message
    assert "sent back our own identification line (SSH-2.0-healthcheck)" in r.message
    assert "echo service" in r.message and "HEALTHCHECK_SSH_PORT" in r.message


def test_the_server_speaks_first(scripted: Any) -> None:
    # A server that takes a moment to send its banner must get nothing from us before it;
    # after its banner it gets our identification line.
    seen: dict[str, bytes] = {}
    finished = threading.Event()

    def patient(conn: socket.socket) -> None:
        try:
            time.sleep(0.3)
            conn.setblocking(False)
            try:
                seen["before"] = conn.recv(1024, socket.MSG_PEEK)
            except BlockingIOError:
                seen["before"] = b""
            conn.setblocking(True)
            conn.sendall(b"SSH-2.0-Patient_1.0\r\n")
            conn.settimeout(2.0)
            got = b""
            while not got.endswith(b"\n"):
                chunk = conn.recv(1024)
                if not chunk:
                    break
                got += chunk
            seen["after"] = got
        finally:
            finished.set()

    srv = scripted(patient)
    r = probe(srv.port)
    assert r.status is Status.PASS and r.observed == "Patient_1.0", r.message
    assert finished.wait(5)
    assert seen == {"before": b"", "after": ssh.CLIENT_ID}


def answers_after_a_line(reply: bytes) -> Any:
    """A request/response server: says nothing until it has read a line, then ``reply``."""
    def handler(conn: socket.socket) -> None:
        got = b""
        while b"\n" not in got:
            chunk = conn.recv(1024)
            if not chunk:
                return
            got += chunk
        conn.sendall(reply)
        time.sleep(0.5)
    return handler


def test_server_that_answers_only_after_our_line_is_not_ssh(scripted: Any) -> None:
    srv = scripted(answers_after_a_line(b"HTTP/1.1 400 Bad Request\r\n\r\n"))
    t0 = time.monotonic()
    r = probe(srv.port)
    assert time.monotonic() - t0 < ssh.SPEAK_AFTER + 1.0
    assert (r.status, r.reason) == (Status.FAIL, "not-ssh"), r.message
    assert "'HTTP/1.1 400 Bad Request'" in r.message


def test_sshd_that_waits_for_the_client_still_passes(scripted: Any) -> None:
    srv = scripted(answers_after_a_line(b"SSH-2.0-Shy_1.0\r\n"))
    r = probe(srv.port)
    assert r.status is Status.PASS and r.observed == "Shy_1.0", r.message


def test_only_a_neighbouring_port_listens(silent: Listener) -> None:
    # The neighbour is the silent listener's port + 1 when free; what matters is that the
    # message names the port that does listen.
    port = neighbour_port(silent)
    r = probe(port)
    assert r.reason == "refused"
    assert f"127.0.0.1:{silent.port}" in r.message, r.message


def test_one_byte_per_second_returns_by_the_deadline(scripted: Any) -> None:
    srv = scripted(trickle(b"SSH-2.0-OpenSSH_9.9\r\n", every=0.5))
    t0 = time.monotonic()
    r = probe(srv.port, timeout=1.2)
    assert time.monotonic() - t0 < 1.2 + 0.5
    assert (r.status, r.reason) == (Status.FAIL, "deadline")


def test_lines_before_the_banner_are_allowed(scripted: Any) -> None:
    srv = scripted(lambda c: c.sendall(b"Welcome\r\nplease wait\r\nSSH-2.0-Example_1.0 extra\r\n"))
    r = probe(srv.port)
    assert r.status is Status.PASS, r.message
    assert r.observed == "Example_1.0"
    assert r.facts["comments"] == "extra"


def test_ssh_1_99_is_accepted_and_ssh_1_5_is_not(scripted: Any) -> None:
    ok = scripted(lambda c: c.sendall(b"SSH-1.99-Old_2\r\n"))
    assert probe(ok.port).status is Status.PASS
    old = scripted(lambda c: c.sendall(b"SSH-1.5-Ancient\r\n"))
    r = probe(old.port)
    assert r.reason == "not-ssh" and "protocol" in r.message


def test_overlong_line_is_not_ssh(scripted: Any) -> None:
    srv = scripted(lambda c: (c.sendall(b"A" * 300), time.sleep(2)))
    r = probe(srv.port, timeout=1.5)
    assert r.reason == "not-ssh"


def test_closed_without_banner(scripted: Any) -> None:
    srv = scripted(lambda c: None)
    r = probe(srv.port)
    assert r.reason == "no-banner" and "closed" in r.message


def test_banner_bytes_are_made_safe(scripted: Any) -> None:
    srv = scripted(lambda c: c.sendall(b"\x1b[31mevil\x07\r\n"))
    r = probe(srv.port)
    assert r.reason == "not-ssh"
    assert "\x1b" not in r.message and "\x07" not in r.message


def test_judge_is_pure() -> None:
    ctx = make_ctx()
    data: dict[str, Any] = {"host": "127.0.0.1", "port": 22, "budget": 3.0, "outcome": "banner",
                            "line": b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13"}
    r = ssh.judge(data, ctx)
    assert (r.status, r.observed) == (Status.PASS, "OpenSSH_9.6p1")
    data = {"host": "127.0.0.1", "port": 22, "budget": 3.0, "outcome": "refused", "listening": []}
    assert "no TCP port is listening" in ssh.judge(data, ctx).message
    data = {"host": "127.0.0.1", "port": 22, "budget": 3.0, "outcome": "echo"}
    assert ssh.judge(data, ctx).reason == "echo"


def test_nothing_anywhere_unused_port() -> None:
    r = probe(free_port())
    assert r.reason == "refused"


@pytest.mark.skipif(not (ROOT / "probes" / "cli.py").exists(), reason="the CLI is not there yet")
def test_cli_liveness_run_against_real_sshd(sshd: Any, tmp_path: Any) -> None:
    env = clean_env(HEALTHCHECK_SSH_PORT=str(sshd.port), HEALTHCHECK_STATE_DIR=str(tmp_path))
    out = run_cli("--profile", "liveness", "--only", "ssh", "--json", env=env, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    check = json.loads(out.stdout)["checks"]["ssh:banner"][0]
    assert check["status"] == "pass" and check["observedValue"].startswith("OpenSSH_")
    sshd.stop()
    out = run_cli("--profile", "liveness", "--only", "ssh", env=env, timeout=60)
    assert out.returncode == 1 and "refused" in out.stdout


def accepted(peers: list[int], count: int, within: float = 5.0) -> bool:
    end = time.monotonic() + within
    while len(peers) < count and time.monotonic() < end:
        time.sleep(0.01)
    return len(peers) >= count


def test_the_probe_takes_over_a_connection_dialled_early(scripted: Any) -> None:
    peers: list[int] = []
    server = scripted(lambda conn: (peers.append(conn.getpeername()[1]), conn.sendall(b"SSH-2.0-OpenSSH_9.9\r\n"),
                                    conn.recv(64)))
    net.dial("127.0.0.1", server.port)
    assert accepted(peers, 1)  # connected before the probe runs
    r = probe(server.port)
    assert r.status is Status.PASS, r.message
    time.sleep(0.2)  # a second connection would have been accepted by now
    assert len(peers) == 1


def test_an_early_connection_that_is_refused_is_reported_as_refused() -> None:
    port = free_port()
    net.dial("127.0.0.1", port)
    r = probe(port)
    assert (r.status, r.reason) == (Status.FAIL, "refused")
    assert "listening here" in r.message


def test_a_host_name_is_not_dialled_early(scripted: Any) -> None:
    """Resolving a name can block, and the run's deadlines are not armed yet: only addresses."""
    peers: list[int] = []
    server = scripted(lambda conn: (peers.append(1), conn.sendall(b"SSH-2.0-OpenSSH_9.9\r\n"), conn.recv(64)))
    net.dial("localhost", server.port)
    assert not accepted(peers, 1, within=0.3)
    assert probe(server.port, host="localhost").status is Status.PASS


def test_a_run_connects_to_sshd_before_it_imports_the_probes(scripted: Any, tmp_path: Any) -> None:
    """sshd forks and re-executes itself before it speaks (docs/benchmark.md): the run's connection
    is made while the suite imports the rest, and it is the only one the probe makes."""
    peers: list[int] = []
    server = scripted(lambda conn: (peers.append(1), conn.sendall(b"SSH-2.0-OpenSSH_9.9\r\n"), conn.recv(64)))
    script = ("import sys\nfrom probes.services import net\nfrom probes.cli import check\ndial, seen = net.dial, []\n"
              "net.dial = lambda *a: (seen.extend(m for m in ('probes.runner', 'probes.state', 'probes.services.ssh') "
              "if m in sys.modules), dial(*a))\n"
              "code, out, _ = check(['--profile', 'liveness', '--only', 'ssh'])\nprint(code, seen, out)\n")
    env = clean_env(HEALTHCHECK_SSH_PORT=str(server.port), HEALTHCHECK_STATE_DIR=str(tmp_path))
    res = subprocess.run([sys.executable, "-I", "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.stdout.startswith("0 [] healthy: liveness"), res.stdout + res.stderr
    time.sleep(0.2)
    assert len(peers) == 1
