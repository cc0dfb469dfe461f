"""TCP and HTTP/1.x for the service probes: each blocking call gets only the time left, the reply is
parsed strictly, every part bounded (``http.client`` would import ``ssl`` and ``email`` on every
liveness run). Connections are direct (no proxy)."""

from __future__ import annotations

import errno
import os
import select
import socket
import sys
import time

from probes.services.common import excerpt, host_header

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

timeout = socket.timeout  # TimeoutError from Python 3.10
MAX_HEAD, MAX_BODY = 16 * 1024, 64 * 1024
MAX_REPLY = MAX_HEAD + 2 * MAX_BODY
_dialed: dict[tuple[str, int], socket.socket] = {}  # dial's connections, for connect to take over
TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class HttpError(Exception):
    """The reply is not well-formed HTTP/1.x (in short, fixed words)."""


class TooLarge(HttpError):
    """The reply, or a part of it, exceeds its bound."""


def arm(sock: socket.socket, deadline: float) -> None:
    """Give the next blocking call on ``sock`` only the time left (timeout when none is)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise timeout("deadline")
    sock.settimeout(max(left, 0.001))  # settimeout(0) would mean non-blocking, not "no time left"


def dial(host: str, port: int) -> None:
    """Start connecting to ``host:port`` (an address: a name could block) for ``connect`` to take over."""
    try:
        info = socket.getaddrinfo(host.encode("ascii"), port, 0, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
        sock = socket.socket(*info[0][:3])
    except (OSError, UnicodeError):
        return
    sock.setblocking(False)
    if sock.connect_ex(info[0][4]) in (0, errno.EINPROGRESS):
        _dialed[(host, port)] = sock
    else:
        sock.close()


def connect(host: str, port: int, deadline: float) -> socket.socket | dict[str, str]:
    """A socket to the first address of ``host`` that accepts by ``deadline``, else why none did:
    ``outcome`` resolve, refused, connect-timeout or unreachable (with the ``detail`` of the last)."""
    if (early := _dialed.pop((host, port), None)) is not None:
        ready = select.select([], [early], [], max(0.0, deadline - time.monotonic()))[1]
        if ready and not early.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            return early
        early.close()  # not accepted in time, refused, unreachable: said as a new connection says it
    try:
        # An ASCII name goes as bytes: a str would import the IDNA codec to encode it.
        name: str | bytes = host.encode("ascii") if host.isascii() else host
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return {"outcome": "resolve", "detail": ""}
    failed = {"outcome": "unreachable", "detail": ""}
    for family, type_, proto, _, addr in infos:
        sock = socket.socket(family, type_, proto)
        try:
            arm(sock, deadline)
            sock.connect(addr)
            return sock
        except ConnectionRefusedError:
            failed = {"outcome": "refused", "detail": ""}
        except timeout:
            sock.close()
            return {"outcome": "connect-timeout", "detail": ""}
        except OSError as exc:
            if failed["outcome"] != "refused":
                failed["detail"] = os.strerror(exc.errno) if exc.errno else ""
        sock.close()
    return failed


def is_loopback(host: str) -> bool:
    """Whether ``host`` is "localhost" or a loopback address literal (127/8, ::1, ::ffff:127/104)."""
    name = host.strip("[]").lower()
    try:
        return name == "localhost" or socket.inet_pton(socket.AF_INET, name)[0] == 127
    except (OSError, ValueError):
        pass
    try:
        packed = socket.inet_pton(socket.AF_INET6, name)
    except (OSError, ValueError):
        return False
    return packed == bytes(15) + b"\x01" or packed[:13] == bytes(10) + b"\xff\xff\x7f"


def listening() -> list[tuple[int, bytes, int, int]]:
    """(family, packed address, port, uid) of each listening TCP socket, without CAP_SYS_PTRACE (root
    lacks it in Docker's default set): from the kernel's socket diagnostics, which walk the listening
    sockets alone, else from /proc/net/tcp and tcp6, whose every read walks all connections."""
    try:
        return _diag_listening()
    except OSError:
        pass
    found: list[tuple[int, bytes, int, int]] = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            with open(table, "rb") as f:
                next(f, None)  # the header
                for line in f:
                    # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
                    fields = line.split()
                    if len(fields) < 8 or fields[3] != b"0A":  # 0A: LISTEN, listed first
                        break
                    addr, _, port = fields[1].partition(b":")
                    # The address as 32-bit words, each printed as a number in host order.
                    packed = b"".join(int(addr[i:i + 8], 16).to_bytes(4, sys.byteorder)
                                      for i in range(0, len(addr), 8))
                    found.append((family, packed, int(port, 16), int(fields[7])))
        except (OSError, ValueError):
            continue
    return found


def _diag_listening() -> list[tuple[int, bytes, int, int]]:
    """The listening TCP sockets from a NETLINK_SOCK_DIAG dump (linux/inet_diag.h); OSError when refused."""
    found: list[tuple[int, bytes, int, int]] = []
    order = sys.byteorder
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, 4) as sock:  # SOCK_DIAG
        sock.settimeout(1.0)
        for family in (socket.AF_INET, socket.AF_INET6):
            # nlmsghdr (SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP), then inet_diag_req_v2 for TCP in
            # the state LISTEN (1 << 10), any address (a zero inet_diag_sockid).
            body = bytes((family, socket.IPPROTO_TCP, 0, 0)) + (1 << 10).to_bytes(4, order) + bytes(48)
            head = (16 + len(body)).to_bytes(4, order) + (20).to_bytes(2, order) + (0x301).to_bytes(2, order)
            sock.send(head + bytes(8) + body)
            done = False
            while not done:
                data = sock.recv(65536)
                pos = 0
                while not done and pos + 16 <= len(data):
                    size = int.from_bytes(data[pos:pos + 4], order)
                    kind = int.from_bytes(data[pos + 4:pos + 6], order)
                    if kind == 2 or size < 16:  # NLMSG_ERROR: the kernel refused the dump
                        raise OSError("sock_diag refused")
                    msg = data[pos + 16:pos + size]
                    done = kind == 3  # NLMSG_DONE
                    if not done and len(msg) >= 72:  # inet_diag_msg: id at 4, uid at 64
                        addr = msg[8:12] if family == socket.AF_INET else msg[8:24]
                        port, uid = int.from_bytes(msg[4:6], "big"), int.from_bytes(msg[64:68], order)
                        found.append((family, addr, port, uid))
                    pos += (size + 3) & ~3
                done = done or not data
    return found


def listeners() -> dict[int, set[int]]:
    by_port: dict[int, set[int]] = {}
    for _, _, port, uid in listening():
        by_port.setdefault(port, set()).add(uid)
    return by_port


def nearby(expected: int) -> list[str]:
    """The five listening ports nearest to ``expected`` ("127.0.0.1:2222", "*:8888"), to explain a refusal."""
    seen = set()
    for family, addr, port, _ in listening():
        ip = socket.inet_ntop(family, addr)
        seen.add(("*" if ip in ("0.0.0.0", "::") else ip, port))  # noqa: S104
    ordered = sorted(seen, key=lambda a: (abs(a[1] - expected), a[1], a[0]))
    shown = (f"*:{port}" if ip == "*" else host_header(ip, port) for ip, port in ordered)
    return list(dict.fromkeys(shown))[:5]


def _dechunk(body: bytes) -> bytes | None:
    """A chunked body decoded; None while incomplete."""
    out, pos = bytearray(), 0
    for _ in range(1025):  # 1024 chunks at most: the reply is parsed again as it grows
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
    """A complete HTTP/1.x response in ``buf``, or None while more bytes are needed. Strict: CRLF line
    ends, token header names, no folded lines, one Content-Length, chunked the only transfer coding,
    each part bounded. Raises HttpError (TooLarge for what exceeds a bound)."""
    if len(buf) > MAX_REPLY:
        raise TooLarge("reply too large")
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
            or any(c not in "0123456789" for c in parts[1]) or parts[1] < "200":
        raise HttpError("bad or interim status line")
    status = int(parts[1])
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or any(c not in TOKEN_CHARS for c in name):
            raise HttpError("bad header line")
        headers.setdefault(name.lower(), []).append(value.strip(" \t"))
    rest = buf[end + 4:]
    body: bytes | None = rest
    if status in (204, 304):
        body = b""
    elif "transfer-encoding" in headers:
        if [v.lower() for v in headers["transfer-encoding"]] != ["chunked"]:
            raise HttpError("unsupported transfer coding")
        body = _dechunk(rest)
    elif "content-length" in headers:
        values = set(headers["content-length"])
        text = values.pop()
        if values or not text or len(text) > 12 or any(c not in "0123456789" for c in text):
            raise HttpError("bad Content-Length")
        length = int(text)
        if length > MAX_BODY:
            raise TooLarge("body too large")
        body = rest[:length] if len(rest) >= length else None
    elif len(rest) > MAX_BODY:
        raise TooLarge("body too large")
    elif not eof:
        body = None
    if body is None and eof:
        raise HttpError("incomplete body")
    content_type = (headers.get("content-type") or [""])[0]
    return None if body is None else {"status": status, "content_type": content_type, "body": body}


def _tls(sock: socket.socket, host: str, deadline: float) -> socket.socket:
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if is_loopback(str(sock.getpeername()[0])):  # Jupyter's is often self-signed; nobody sits between
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.load_default_certs()
    tls = context.wrap_socket(sock, server_hostname=host.strip("[]"), do_handshake_on_connect=False)
    arm(tls, deadline)
    tls.do_handshake()
    return tls


def exchange(host: str, port: int, path: str, secure: bool, deadline: float, *, method: str = "GET",
             headers: str = "", body: bytes = b"") -> dict[str, Any]:
    """One ``method path`` by ``deadline``: what happened (``outcome``); never raises for the network.
    ``headers``: more lines, each ending in CRLF (a token's, which nothing here shows); ``body``: JSON."""
    t0 = time.monotonic()
    if isinstance(sock := connect(host, port, deadline), dict):
        return sock
    try:
        if secure:
            # A plain-HTTP server waits silently for a request line that a TLS ClientHello never
            # completes: the handshake gets half the time, the rest is left to find that out.
            try:
                sock = _tls(sock, host, t0 + (deadline - t0) / 2)
            except timeout:
                return {"outcome": "tls-timeout"}
            except OSError as exc:
                return {"outcome": "tls-verify" if type(exc).__name__ == "SSLCertVerificationError"
                        else "tls-failed"}
        sent = (f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                if body or method in ("POST", "PUT") else "")
        request = (f"{method} {path} HTTP/1.1\r\nHost: {host_header(host, port)}\r\n"
                   f"User-Agent: healthcheck\r\nAccept: application/json\r\n{headers}{sent}"
                   "Connection: close\r\n\r\n")
        try:
            arm(sock, deadline)
            sock.sendall(request.encode("ascii") + body)
        except timeout:
            return {"outcome": "timeout", "received": 0}
        except OSError:
            pass  # the server closed early; what it sent (if anything) decides
        buf = b""
        while True:
            try:
                arm(sock, deadline)
                chunk = sock.recv(min(65536, MAX_REPLY + 1 - len(buf)))
            except timeout:
                return {"outcome": "timeout", "received": len(buf)}
            except OSError:  # reset, or a TLS error mid-stream
                chunk = b""
            buf += chunk
            if not secure and len(buf) >= 2 and buf[0] in (0x15, 0x16) and buf[1] == 3:
                return {"outcome": "tls-reply"}  # a TLS record where the status line should be
            try:
                response = parse_response(buf, eof=not chunk)  # at the end: a response, or an error
            except TooLarge as exc:
                why = f"{exc}; {MAX_REPLY // 1024} KiB in all at most"
                return {"outcome": "too-large", "why": why, "received": len(buf)}
            except HttpError:
                return {"outcome": "bad-http", "excerpt": excerpt(buf)} if buf else {"outcome": "closed"}
            if response is not None:
                return {"outcome": "response", "elapsed": time.monotonic() - t0, **response}
    finally:
        sock.close()
