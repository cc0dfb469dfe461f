"""jupyter: Jupyter Server answers its unauthenticated ``GET {base_url}api``.

Proves that the Jupyter Server (JupyterLab, Notebook 7) is serving HTTP requests: it must
answer ``200`` with a JSON object holding ``version``. This endpoint needs no token and
does not reset the server's idle timers. A port that accepts connections is not enough:
the kernel completes the TCP handshake for a hung server.

Command-line equivalent::

    curl --noproxy '*' -ksS --max-time 3 http://127.0.0.1:8888/api

Where the server is: a running server writes ``jpserver-<pid>.json`` (url, port,
base_url, secure, and its token) into its runtime directory (HEALTHCHECK_JUPYTER_RUNTIME_DIR,
else $JUPYTER_RUNTIME_DIR, else $JUPYTER_DATA_DIR/runtime, else
~/.local/share/jupyter/runtime). A file whose pid is alive wins; without one the probe
uses HEALTHCHECK_HOST, HEALTHCHECK_JUPYTER_PORT and HEALTHCHECK_JUPYTER_BASE_URL over
plain HTTP. The token in that file is never used, kept or shown.

The request is a small HTTP/1.1 GET written on a socket, with a strict response parser:
``http.client`` would import ``ssl`` and ``email`` (tens of milliseconds) on every
liveness run. ``ssl`` is imported only for a TLS server (``secure`` in the runtime file)
or to explain a failure. The connection is direct: proxy variables do not apply. On
loopback a self-signed certificate is accepted; elsewhere the certificate is verified.
All socket calls share one deadline, so a server that trickles bytes cannot hold us, and
one reply is read up to MAX_REPLY bytes in all (head, body, chunk framing, trailer).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from probes import untrusted
from probes.config import Config
from probes.context import Context
from probes.result import Result, failed, passed
from probes.services import _net

NAME = "jupyter"
MEASUREMENT = "responseTime"

MAX_HEAD = 16 * 1024
MAX_BODY = 64 * 1024
# Everything read from one reply (head, body, chunk framing, trailer): a reply that never
# ends is cut here, not buffered until the deadline.
MAX_REPLY = MAX_HEAD + 2 * MAX_BODY
MAX_CHUNKS = 1024  # the reply is parsed again as it grows: bound the work of each parse
MAX_RUNTIME_FILE = 64 * 1024
WILDCARD_HOSTS = ("", "0.0.0.0", "::", "*")  # noqa: S104  (addresses to listen on, not to connect to)
TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
PATH_CHARS = frozenset("-._~/!$&'()*+,;=:@%0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


# ---------------------------------------------------------------- where the server is

def runtime_dir(config: Config, environ: Any = None) -> str:
    env = os.environ if environ is None else environ
    if config.jupyter_runtime_dir:
        return config.jupyter_runtime_dir
    if env.get("JUPYTER_RUNTIME_DIR"):
        return str(env["JUPYTER_RUNTIME_DIR"])
    data = env.get("JUPYTER_DATA_DIR") or os.path.join(
        env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share"), "jupyter")
    return os.path.join(data, "runtime")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


def _read_runtime_file(path: str) -> dict[str, Any] | None:
    """The fields we use from a jpserver-*.json file (never its token), or None if unusable."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_RUNTIME_FILE + 1)
        mtime = os.stat(path).st_mtime
    except OSError:
        return None
    if len(raw) > MAX_RUNTIME_FILE:
        return None
    try:
        doc = untrusted.load_json(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    port, pid, base_url = doc.get("port"), doc.get("pid"), doc.get("base_url", "/")
    if type(port) is not int or not 1 <= port <= 65535 or not isinstance(base_url, str):
        return None
    hostname = doc.get("hostname")
    return {
        "file": os.path.basename(path),
        "port": port,
        "base_url": _normal_base_url(base_url),
        "secure": doc.get("secure") is True,
        "hostname": hostname if isinstance(hostname, str) else "",
        "alive": type(pid) is int and pid > 0 and _pid_alive(pid),
        "mtime": mtime,
    }


def find_runtime_file(config: Config, environ: Any = None) -> dict[str, Any] | None:
    """The runtime file of the server to probe: alive first, then the configured port, then newest."""
    directory = runtime_dir(config, environ)
    try:
        names = [e.name for e in os.scandir(directory)
                 if e.name.startswith("jpserver-") and e.name.endswith(".json")]
    except OSError:
        return None
    found = [f for f in (_read_runtime_file(os.path.join(directory, n)) for n in names) if f]
    if not found:
        return None
    return max(found, key=lambda f: (f["alive"], f["port"] == config.jupyter_port, f["mtime"]))


def _normal_base_url(raw: str) -> str:
    path = raw if raw.startswith("/") else "/" + raw
    return path if path.endswith("/") else path + "/"


def _request_path(base_url: str) -> str:
    """``{base_url}api`` with anything outside the URL path characters percent-encoded."""
    out = []
    for ch in base_url + "api":
        if ch in PATH_CHARS:
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


# ---------------------------------------------------------------- HTTP

class HttpError(Exception):
    """The reply is not well-formed HTTP/1.x (the message is a short, fixed description)."""


class TooLarge(HttpError):
    """The reply (or a part of it) exceeds its bound."""


def _dechunk(body: bytes) -> bytes | None:
    """Decode a chunked body; None while incomplete. Raises HttpError on malformed framing."""
    out, pos = bytearray(), 0
    for _ in range(MAX_CHUNKS + 1):
        eol = body.find(b"\r\n", pos, pos + 66)
        if eol < 0:
            if len(body) - pos > 64:
                raise HttpError("bad chunk size line")
            return None
        size_text = body[pos:eol].split(b";", 1)[0].strip()
        if not size_text or any(c not in b"0123456789abcdefABCDEF" for c in size_text) or len(size_text) > 8:
            raise HttpError("bad chunk size")
        size = int(size_text, 16)
        if size == 0:
            # Optional trailer fields, then an empty line; bounded like a header.
            rest = eol + 2
            if body.startswith(b"\r\n", rest) or body.find(b"\r\n\r\n", rest) >= 0:
                return bytes(out)
            if len(body) - rest > MAX_HEAD:
                raise TooLarge("trailer too large")
            return None
        start, end = eol + 2, eol + 2 + size
        if len(out) + size > MAX_BODY:
            raise TooLarge("body too large")
        if len(body) < end + 2:
            return None
        if body[end:end + 2] != b"\r\n":
            raise HttpError("bad chunk framing")
        out += body[start:end]
        pos = end + 2
    raise TooLarge("too many chunks")


def parse_response(buf: bytes, eof: bool) -> dict[str, Any] | None:
    """A complete HTTP/1.x response from ``buf``, or None while more bytes are needed.

    Strict: a status line ``HTTP/1.0|1.1 NNN reason``, CRLF line ends, token header
    names, no folded lines, one Content-Length, chunked as the only transfer coding,
    bounded sizes (head, body, trailer, and MAX_REPLY bytes in all). Raises HttpError
    for anything else (TooLarge for what exceeds a bound).
    """
    response = _parse_response(buf, eof)
    if response is None and len(buf) > MAX_REPLY:
        raise TooLarge("reply too large")
    return response


def _parse_response(buf: bytes, eof: bool) -> dict[str, Any] | None:
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if not buf.startswith(b"HTTP/"[: len(buf)]):
            raise HttpError("not HTTP")
        if len(buf) > MAX_HEAD:
            raise TooLarge("header too large")
        if eof:
            raise HttpError("incomplete header")
        return None
    if end > MAX_HEAD:
        raise TooLarge("header too large")
    lines = buf[:end].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or parts[0] not in ("HTTP/1.0", "HTTP/1.1") or len(parts[1]) != 3 \
            or any(c not in "0123456789" for c in parts[1]):
        raise HttpError("bad status line")
    status = int(parts[1])
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or any(c not in TOKEN_CHARS for c in name):
            raise HttpError("bad header line")
        headers.setdefault(name.lower(), []).append(value.strip(" \t"))
    if status < 200:
        raise HttpError("interim response")
    body = buf[end + 4:]
    result: dict[str, Any] = {"status": status, "content_type": (headers.get("content-type") or [""])[0]}
    if status in (204, 304):
        return {**result, "body": b""}
    if "transfer-encoding" in headers:
        if [v.lower() for v in headers["transfer-encoding"]] != ["chunked"]:
            raise HttpError("unsupported transfer coding")
        decoded = _dechunk(body)
        if decoded is None:
            if eof:
                raise HttpError("incomplete body")
            return None
        return {**result, "body": decoded}
    if "content-length" in headers:
        values = set(headers["content-length"])
        text = values.pop()
        if values or not text or len(text) > 12 or any(c not in "0123456789" for c in text):
            raise HttpError("bad Content-Length")
        length = int(text)
        if length > MAX_BODY:
            raise TooLarge("body too large")
        if len(body) >= length:
            return {**result, "body": body[:length]}
        if eof:
            raise HttpError("incomplete body")
        return None
    if len(body) > MAX_BODY:
        raise TooLarge("body too large")
    return {**result, "body": body} if eof else None


def _looks_like_tls(buf: bytes) -> bool:
    """A TLS record (alert or handshake) where an HTTP status line should be."""
    return len(buf) >= 2 and buf[0] in (0x15, 0x16) and buf[1] == 0x03


def _tls_wrap(sock: socket.socket, host: str, deadline: float) -> socket.socket:
    import ssl  # only for TLS servers: ~5 ms that a plain-HTTP liveness run never pays

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if _net.peer_is_loopback(sock):
        # Jupyter's certificate is usually self-signed; on loopback nobody sits in between.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.load_default_certs()
    tls = context.wrap_socket(sock, server_hostname=host.strip("[]"), do_handshake_on_connect=False)
    _net.arm(tls, deadline)
    tls.do_handshake()
    return tls


def exchange(host: str, port: int, path: str, secure: bool, deadline: float) -> dict[str, Any]:
    """One ``GET path`` under ``deadline``; returns what happened, never raises for network faults."""
    t0 = time.monotonic()
    try:
        sock = _net.connect(host, port, deadline)
    except _net.NetError as exc:
        return {"outcome": "connect-timeout" if exc.kind == "timeout" else exc.kind, "detail": exc.detail}
    try:
        if secure:
            # A plain-HTTP server waits silently for a request line that a TLS ClientHello never
            # completes: the handshake gets half the time, the rest is left to find that out.
            try:
                sock = _tls_wrap(sock, host, t0 + (deadline - t0) / 2)
            except socket.timeout:
                return {"outcome": "tls-timeout"}
            except OSError as exc:
                verify = type(exc).__name__ == "SSLCertVerificationError"
                return {"outcome": "tls-verify" if verify else "tls-failed",
                        "detail": str(getattr(exc, "reason", "") or "")[:40]}
        request = (f"GET {path} HTTP/1.1\r\nHost: {_net.host_header(host, port)}\r\n"
                   "User-Agent: healthcheck\r\nAccept: application/json\r\nConnection: close\r\n\r\n")
        try:
            _net.arm(sock, deadline)
            sock.sendall(request.encode("ascii"))
        except socket.timeout:
            return {"outcome": "timeout", "received": 0}
        except OSError:
            pass  # the server closed early; what it sent (if anything) decides
        buf = b""
        while True:
            try:
                _net.arm(sock, deadline)
                chunk = sock.recv(min(65536, MAX_REPLY + 1 - len(buf)))
            except socket.timeout:
                return {"outcome": "timeout", "received": len(buf)}
            except OSError:  # reset, or a TLS error mid-stream
                chunk = b""
            buf += chunk
            if not secure and _looks_like_tls(buf):
                return {"outcome": "tls-reply"}
            try:
                response = parse_response(buf, eof=not chunk)
            except TooLarge as exc:
                return {"outcome": "too-large", "why": str(exc), "received": len(buf)}
            except HttpError as exc:
                if not buf:
                    return {"outcome": "closed", "received": 0}
                return {"outcome": "bad-http", "why": str(exc), "excerpt": _net.safe_excerpt(buf)}
            if response is not None:
                return {"outcome": "response", "elapsed": time.monotonic() - t0, **response}
            if not chunk:
                return {"outcome": "closed", "received": len(buf)}
    finally:
        sock.close()


def _speaks_tls(host: str, port: int, deadline: float) -> bool:
    """Whether the server completes a TLS handshake (only asked to explain a failure)."""
    try:
        sock = _net.connect(host, port, deadline)
    except _net.NetError:
        return False
    try:
        _tls_wrap(sock, host, deadline).close()
        return True
    except OSError:
        return False
    finally:
        sock.close()


# ---------------------------------------------------------------- probe

def gather(ctx: Context) -> dict[str, Any]:
    cfg = ctx.config
    deadline = ctx.deadline
    t0 = time.monotonic()
    found = find_runtime_file(cfg)
    if found is not None:
        host = cfg.host if found["hostname"] in WILDCARD_HOSTS else found["hostname"]
        target = {"source": found["file"], "alive": found["alive"], "host": host, "port": found["port"],
                  "base_url": found["base_url"], "secure": found["secure"]}
    else:
        target = {"source": None, "alive": None, "host": cfg.host, "port": cfg.jupyter_port,
                  "base_url": cfg.jupyter_base_url, "secure": False}
    path = _request_path(target["base_url"])
    data: dict[str, Any] = {**target, "path": path, "budget": max(0.0, deadline - t0)}
    data.update(exchange(target["host"], target["port"], path, target["secure"], deadline))
    outcome = data["outcome"]
    if not target["secure"] and (outcome == "tls-reply" or (outcome == "closed" and not data["received"])):
        if outcome == "tls-reply" or _speaks_tls(target["host"], target["port"], deadline):
            data.update(outcome="tls-mismatch", server_tls=True)
    elif target["secure"] and outcome in ("tls-failed", "tls-timeout"):
        plain = exchange(target["host"], target["port"], path, False, deadline)
        if plain["outcome"] == "response":
            data.update(outcome="tls-mismatch", server_tls=False)
        elif outcome == "tls-timeout" and plain["outcome"] == "timeout":
            data.update(plain)  # silent whatever we speak: hung
    if data["outcome"] == "refused":
        data["listening"] = _net.listening(target["port"])
    return data


def _not_jupyter_hint(status: int, data: dict[str, Any]) -> str:
    if status == 404:
        return (f"wrong base URL? the server has no {data['path']}; set HEALTHCHECK_JUPYTER_BASE_URL "
                "to Jupyter's ServerApp.base_url")
    if status == 403:
        return ("Jupyter refuses requests for a Host it does not trust: probe it via 127.0.0.1 "
                "(HEALTHCHECK_HOST) or set ServerApp.allow_remote_access")
    if status in (401, 407) or 300 <= status < 400:
        return "a proxy or login page answers instead of Jupyter; point the probe at Jupyter itself"
    return "another web server holds the port; check HEALTHCHECK_JUPYTER_PORT"


def judge(data: dict[str, Any], ctx: Context) -> Result:
    where = _net.host_header(data["host"], data["port"])
    scheme = "https" if data["secure"] else "http"
    src = f" (from {data['source']})" if data["source"] else ""
    facts = {"port": data["port"], "base_url": data["base_url"], "secure": data["secure"],
             "runtime_file": data["source"]}
    outcome = data["outcome"]
    budget = float(data["budget"])
    get = f"GET {data['path']}"

    def fail(message: str, reason: str) -> Result:
        return failed(NAME, message, reason=reason, facts=facts)

    if outcome == "response":
        status = int(data["status"])
        ctype = untrusted.clean(data["content_type"], 40) or "no type"
        if 500 <= status < 600:
            return fail(f"Jupyter at {where} answered {get} with HTTP {status}: the server is failing; "
                        "see its log", "http-error")
        if status != 200:
            return fail(f"not Jupyter: {where} answered {get} with HTTP {status}{src}: "
                        f"{_not_jupyter_hint(status, data)}", "not-jupyter")
        try:
            doc = untrusted.load_json(data["body"])
        except ValueError:
            doc = None
        version = doc.get("version") if isinstance(doc, dict) else None
        if not isinstance(version, str) or not version:
            return fail(f"not Jupyter: {where} answered {get} with HTTP 200 ({ctype}) but no JSON "
                        "version: another web server holds the port; check HEALTHCHECK_JUPYTER_PORT",
                        "not-jupyter")
        version = "".join(ch for ch in version if ch.isalnum() or ch in ".+-_")[:32]
        ms = round(float(data["elapsed"]) * 1000, 1)
        return passed(NAME, f"Jupyter Server {version} answered {get} at {scheme}://{where} in {ms:.0f} ms",
                      observed=ms, unit="ms", facts={**facts, "version": version})
    if outcome == "refused":
        listening = data.get("listening")
        extra = ""
        if listening:
            extra = f"; listening here: {', '.join(listening)}"
        elif listening == []:
            extra = "; no TCP port is listening here"
        stale = (f"; {data['source']} names this port but its process is gone: remove the stale file"
                 if data["source"] and not data["alive"] else "")
        return fail(f"nothing listening on {where} (connection refused{extra}){stale}: start Jupyter "
                    "or set HEALTHCHECK_JUPYTER_PORT to its port", "refused")
    if outcome == "connect-timeout":
        return fail(f"connection to {where} not accepted within {budget:.1f}s: Jupyter is hung or its "
                    "accept queue is full; restart it", "connect-timeout")
    if outcome == "resolve":
        return fail(f"cannot resolve host {data['host']!r}{src}: set HEALTHCHECK_HOST to an address "
                    "such as 127.0.0.1", "unreachable")
    if outcome == "unreachable":
        why = f" ({data['detail']})" if data.get("detail") else ""
        return fail(f"cannot reach {where}{why}: check HEALTHCHECK_HOST", "unreachable")
    if outcome == "timeout":
        if not data.get("received"):
            return fail(f"hung: {where} accepted the connection but did not answer {get} within "
                        f"{budget:.1f}s: Jupyter is hung or overloaded; restart it and check its log", "hung")
        return fail(f"answer from {where} incomplete at the deadline ({data['received']} bytes in "
                    f"{budget:.1f}s): Jupyter is overloaded or stuck; check its log", "deadline")
    if outcome == "tls-mismatch":
        if data["server_tls"]:
            fix = (f"{data['source']} says http: remove stale jpserver-*.json files" if data["source"] else
                   "point HEALTHCHECK_JUPYTER_RUNTIME_DIR at the server's runtime directory so the "
                   "probe reads secure=true from its jpserver-*.json")
            return fail(f"TLS mismatch: {where} speaks HTTPS but the probe spoke plain HTTP: {fix}",
                        "tls-mismatch")
        return fail(f"TLS mismatch: {where} speaks plain HTTP but {data['source']} says https: "
                    "it belongs to another server; remove stale jpserver-*.json files", "tls-mismatch")
    if outcome == "tls-verify":
        return fail(f"the TLS certificate of {where} is not trusted: probe over loopback "
                    "(HEALTHCHECK_HOST=127.0.0.1), where a self-signed certificate is accepted", "tls-error")
    if outcome in ("tls-failed", "tls-timeout"):
        return fail(f"TLS handshake with {where}{src} failed: check ServerApp.certfile and keyfile, "
                    "and that Jupyter (not another service) holds the port", "tls-error")
    if outcome == "too-large":
        return fail(f"not Jupyter: {where} answered {get} with a reply too large ({data['why']}; "
                    f"{MAX_REPLY // 1024} KiB in all at most): another service holds the port, or the "
                    "server is broken; check HEALTHCHECK_JUPYTER_PORT", "not-jupyter")
    if outcome == "bad-http":
        return fail(f"not Jupyter: {where} does not answer HTTP ({data['excerpt']}): another service "
                    "holds the port; check HEALTHCHECK_JUPYTER_PORT", "not-jupyter")
    # closed
    if data.get("received"):
        return fail(f"not Jupyter: {where} closed the connection mid-answer to {get}: the server "
                    "crashed or is not Jupyter; check its log", "not-jupyter")
    return fail(f"not Jupyter: {where} closed the connection without answering {get}: check "
                "HEALTHCHECK_JUPYTER_PORT and the server's log", "not-jupyter")


def on_deadline(ctx: Context) -> Result:
    where = _net.host_header(ctx.config.host, ctx.config.jupyter_port)
    return failed(NAME, f"no answer from Jupyter at {where} before the deadline: it is hung or "
                  "overloaded; restart it", reason="deadline")
