"""A strict HTTP/1.x client on one socket, under one overall deadline, for the service probes.

``http.client`` would import ``ssl`` and ``email`` (tens of milliseconds) on every liveness run;
this writes one small request and parses the reply strictly (``parse_response``), every part of
it bounded, so a reply that never ends is cut at once instead of buffered until the deadline.
``ssl`` is imported only for a TLS server or to explain a failure. The connection is direct
(proxy variables do not apply); a self-signed certificate is accepted on loopback only.
"""

from __future__ import annotations

import time

from probes.services import _net

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_HEAD = 16 * 1024
MAX_BODY = 64 * 1024
MAX_REPLY = MAX_HEAD + 2 * MAX_BODY
MAX_CHUNKS = 1024  # the reply is parsed again as it grows: bound the work of each parse
TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


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

    Strict: a status line ``HTTP/1.0|1.1 NNN reason``, CRLF line ends, token header names, no
    folded lines, one Content-Length, chunked as the only transfer coding, bounded sizes (head,
    body, trailer, MAX_REPLY bytes in all). Raises HttpError (TooLarge for what exceeds a bound).
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


def _tls_wrap(sock: _net.Socket, host: str, deadline: float) -> _net.Socket:
    import ssl  # only for TLS servers: ~5 ms that a plain-HTTP liveness run never pays

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if _net.peer_is_loopback(sock):
        # Jupyter's certificate is usually self-signed; on loopback nobody sits in between.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.load_default_certs()
    # ssl takes any _socket.socket: it reads family, type, proto and fileno, then detaches it.
    tls = context.wrap_socket(sock, server_hostname=host.strip("[]"),  # type: ignore[arg-type]
                              do_handshake_on_connect=False)
    _net.arm(tls, deadline)
    tls.do_handshake()
    return tls


def exchange(host: str, port: int, path: str, secure: bool, deadline: float, *, method: str = "GET",
             headers: str = "", body: bytes = b"") -> dict[str, Any]:
    """One ``method path`` under ``deadline``; returns what happened, never raises for network faults.

    ``headers``: more header lines, each ending in CRLF (a token's, which nothing here shows);
    ``body``: sent with its Content-Length, as JSON."""
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
            except _net.timeout:
                return {"outcome": "tls-timeout"}
            except OSError as exc:
                verify = type(exc).__name__ == "SSLCertVerificationError"
                return {"outcome": "tls-verify" if verify else "tls-failed",
                        "detail": str(getattr(exc, "reason", "") or "")[:40]}
        sent = (f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                if body or method in ("POST", "PUT") else "")
        request = (f"{method} {path} HTTP/1.1\r\nHost: {_net.host_header(host, port)}\r\n"
                   f"User-Agent: healthcheck\r\nAccept: application/json\r\n{headers}{sent}"
                   "Connection: close\r\n\r\n")
        try:
            _net.arm(sock, deadline)
            sock.sendall(request.encode("ascii") + body)
        except _net.timeout:
            return {"outcome": "timeout", "received": 0}
        except OSError:
            pass  # the server closed early; what it sent (if anything) decides
        buf = b""
        while True:
            try:
                _net.arm(sock, deadline)
                chunk = sock.recv(min(65536, MAX_REPLY + 1 - len(buf)))
            except _net.timeout:
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
