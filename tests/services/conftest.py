"""Real servers on free loopback ports for the service probes: sshd, Jupyter Server, and
small misbehaving TCP/HTTP servers (silent, trickling, wrong protocol)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

from probes.config import Config
from probes.context import Context
from probes.result import Result
from probes.services import jupyter as jupyter_probe
from probes.state import State
from tests.servers import SSHD, Jupyter, Sshd, free_port, stop, wait_port

__all__ = ["OTHER_UID", "SSHD", "Jupyter", "Sshd", "free_port", "make_ctx", "stop", "wait_port"]

def make_ctx(timeout: float = 3.0, **config: Any) -> Context:
    return Context(Config(**config), time.monotonic() + timeout, {}, State.off("tests"))


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    why = Sshd.missing()
    if why:
        pytest.skip(why)
    server = Sshd(tmp_path)
    server.start()
    yield server
    server.stop()


# ---------------------------------------------------------------- small TCP servers

class Listener:
    """A listening socket that never accepts: the kernel completes the handshake, nothing answers."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])

    def close(self) -> None:
        self.sock.close()


def neighbour_port(listener: Listener) -> int:
    """The listener's port + 1, free, for "only a neighbouring port listens": where another
    process holds it, the listener moves to another port (the test always runs, never skips)."""
    for _ in range(64):
        port = listener.port + 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                pass
        listener.close()
        listener.__init__()  # type: ignore[misc]  # a fresh ephemeral port
    pytest.fail("64 listening ports in a row had their neighbour taken")


@pytest.fixture
def silent() -> Iterator[Listener]:
    lst = Listener()
    yield lst
    lst.close()


class ScriptedServer:
    """Accepts connections and runs ``handler(conn)`` for each in a thread."""

    def __init__(self, handler: Callable[[socket.socket], None], host: str = "127.0.0.1") -> None:
        self.listener = Listener(host)
        self.port = self.listener.port
        self.handler = handler
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.listener.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            self.handler(conn)

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.listener.sock.shutdown(socket.SHUT_RDWR)
        self.listener.close()


@pytest.fixture
def scripted() -> Iterator[Callable[..., ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def make(handler: Callable[[socket.socket], None], host: str = "127.0.0.1") -> ScriptedServer:
        servers.append(ScriptedServer(handler, host))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def trickle(payload: bytes, every: float = 1.0) -> Callable[[socket.socket], None]:
    def handler(conn: socket.socket) -> None:
        for i in range(len(payload)):
            conn.sendall(payload[i: i + 1])
            time.sleep(every)
    return handler


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hello_http() -> Iterator[http.server.ThreadingHTTPServer]:
    """A plain HTTP server that answers every GET with 200 "hello"."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


# ---------------------------------------------------------------- Jupyter Server

TOKEN = "tok-7f3e9c1d-never-shown-5b2a"  # a test secret the output must never contain


def probe(timeout: float = 3.0, **config: Any) -> Result:
    """One jupyter probe run, held to its deadline and to never showing the token."""
    ctx = make_ctx(timeout, **config)
    result = jupyter_probe.judge(jupyter_probe.gather(ctx), ctx)
    assert time.monotonic() <= ctx.deadline + 0.5, "the probe overran its deadline"
    assert "\n" not in result.message
    assert TOKEN not in repr(result) and TOKEN not in json.dumps(result.to_dict())
    return result


def no_runtime(tmp_path: Path) -> str:
    empty = tmp_path / "no-runtime"
    empty.mkdir(exist_ok=True)
    return str(empty)


def fake_jupyter(seen: list[bytes]) -> Any:
    """A scripted-server handler that answers like Jupyter's /api and keeps each request it got."""
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


def _self_signed(root: Path) -> tuple[str, str]:
    cert, key = root / "cert.pem", root / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return str(cert), str(key)


def _jupyter(tmp_path_factory: pytest.TempPathFactory, name: str, **kw: Any) -> Iterator[Jupyter]:
    pytest.importorskip("jupyter_server")
    root = tmp_path_factory.mktemp(name)
    if kw.pop("tls", False):
        if not shutil.which("openssl"):
            pytest.skip("needs the openssl command to make a self-signed certificate")
        kw["certfile"], kw["keyfile"] = _self_signed(root)
    server = Jupyter(root, token=TOKEN, **kw)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def jupyter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jupyter]:
    yield from _jupyter(tmp_path_factory, "jupyter")


@pytest.fixture(scope="session")
def jupyter_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jupyter]:
    yield from _jupyter(tmp_path_factory, "jupyter-base", base_url="/user/alice/")


@pytest.fixture(scope="session")
def jupyter_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jupyter]:
    yield from _jupyter(tmp_path_factory, "jupyter-tls", tls=True)


# ---------------------------------------------------------------- another user's files and servers

OTHER_UID = 54321  # stands for the notebook user: not root, not the suite's uid


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: files and processes of another uid are made with chown and setuid")


def write_runtime(directory: Path, name: str, owner: int | None = None, **fields: Any) -> Path:
    """A jpserver-*.json file with ``fields`` (a token included), owned by ``owner`` if given."""
    path = directory / name
    path.write_text(json.dumps({"base_url": "/", "secure": False, "token": TOKEN, **fields}))
    if owner is not None:
        os.chown(path, owner, owner)
    return path


# A Jupyter look-alike that drops to a uid and then listens (so the listening socket is that
# uid's in /proc/net/tcp): it answers {base_url}api with a version and anything else with 404,
# and prints the head of every request it gets, one JSON string a line.
_AS_OTHER_USER = r"""
import json, os, socket, sys
uid, base = int(sys.argv[1]), sys.argv[2]
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(16)
print(srv.getsockname()[1], flush=True)
ok = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n{"version": "7.7.7"}'
nf = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
while True:
    conn, _ = srv.accept()
    try:
        conn.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
        print(json.dumps(data.decode("latin-1")), flush=True)
        path = data.split(b" ", 2)[1].decode() if data.count(b" ") >= 2 else ""
        conn.sendall(ok if path == base + "api" else nf)
    except OSError:
        pass
    finally:
        conn.close()
"""


class OtherUserServer:
    """A process of ``uid`` listening on a loopback port (see _AS_OTHER_USER)."""

    def __init__(self, base_url: str = "/", uid: int = OTHER_UID) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _AS_OTHER_USER, str(uid), base_url],
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.pid = self.proc.pid

    def stop(self) -> list[str]:
        """Stop it; the heads of the requests it got."""
        stop(self.proc)
        if self.proc.stdout is None or self.proc.stdout.closed:
            return []
        heads = [json.loads(line) for line in self.proc.stdout.read().splitlines()]
        self.proc.stdout.close()
        return heads


@pytest.fixture
def other_user_server() -> Iterator[Callable[..., OtherUserServer]]:
    needs_root()
    servers: list[OtherUserServer] = []

    def make(base_url: str = "/", uid: int = OTHER_UID) -> OtherUserServer:
        servers.append(OtherUserServer(base_url, uid))
        return servers[-1]

    yield make
    for s in servers:
        s.stop()
