"""Socket helpers shared by the service probes: connect and read under one overall deadline.

Every blocking call gets the time left until the probe's deadline as its timeout, so a
server that trickles one byte a second cannot stretch a read past the deadline (a
per-call timeout would restart with each byte). psutil is imported only to explain a
refused connection, never on the passing path.
"""

from __future__ import annotations

# _socket, not socket: socket.py builds four enums when imported, ~2.5 ms of every liveness
# run (make bench); the probes need only the C module's socket type, getaddrinfo and constants.
import _socket
import os
import time

from probes.untrusted import clean

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

Socket = _socket.socket
timeout = _socket.timeout  # socket.timeout (TimeoutError from Python 3.10)
MIN_TIMEOUT = 0.001  # socket.settimeout(0) would mean non-blocking, not "no time left"


class NetError(Exception):
    """A connection that failed; ``kind`` is refused, timeout, unreachable or resolve."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(kind)
        self.kind = kind
        self.detail = detail


def remaining(deadline: float) -> float:
    return deadline - time.monotonic()


def arm(sock: Socket, deadline: float) -> None:
    """Give the next blocking call on ``sock`` only the time left; raise timeout when none is."""
    left = remaining(deadline)
    if left <= 0:
        raise timeout("deadline")
    sock.settimeout(max(left, MIN_TIMEOUT))


def connect(host: str, port: int, deadline: float) -> Socket:
    """Connect to every address of ``host`` in turn (IPv6 and IPv4) until one accepts.

    Like socket.create_connection, but the deadline covers all attempts together.
    Raises NetError. Proxy variables play no part: this is a direct TCP connection.
    """
    if remaining(deadline) <= 0:
        raise NetError("timeout")
    try:
        # An ASCII name goes as bytes: a str is encoded with the IDNA codec, whose import costs
        # every probe run about 1 ms even for 127.0.0.1.
        name: str | bytes = host.encode("ascii") if host.isascii() else host
        infos = _socket.getaddrinfo(name, port, type=_socket.SOCK_STREAM)
    except (_socket.gaierror, UnicodeError):
        raise NetError("resolve") from None
    kind, detail = "unreachable", ""
    for family, type_, proto, _, addr in infos:
        sock = Socket(family, type_, proto)
        try:
            arm(sock, deadline)
            sock.connect(addr)
            return sock
        except ConnectionRefusedError:
            kind = "refused"
        except timeout:
            sock.close()
            raise NetError("timeout") from None
        except OSError as exc:
            if kind != "refused":
                kind, detail = "unreachable", os.strerror(exc.errno) if exc.errno else ""
        sock.close()
    raise NetError(kind, detail)


def peer_is_loopback(sock: Socket) -> bool:
    try:
        addr = str(sock.getpeername()[0])
    except OSError:
        return False
    return addr.startswith(("127.", "::ffff:127.")) or addr == "::1"


def host_header(host: str, port: int) -> str:
    """``host:port`` as an HTTP Host header (IPv6 literals in brackets)."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def safe_excerpt(raw: bytes, limit: int = 40) -> str:
    """The first line a server sent, quoted and cleaned (probes.untrusted.clean), for messages."""
    raw = raw.lstrip(b"\r\n\t ").split(b"\n", 1)[0].rstrip(b"\r")
    # latin-1: a server's bytes are shown byte for byte, never as a decoding error.
    return "'" + clean(raw[: limit * 4].decode("latin-1").strip(), limit) + "'"


def listening(expected: int, limit: int = 5) -> list[str] | None:
    """TCP ports in LISTEN state, nearest to ``expected`` first ("127.0.0.1:2222", "*:8888").

    Only used to explain a failure. None when psutil is missing or may not look.
    """
    try:
        import psutil  # lazily: ~15 ms of imports that a passing probe never needs
    except ImportError:
        return None
    try:
        conns: list[Any] = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    seen: dict[tuple[str, int], None] = {}
    for c in conns:
        if c.status != psutil.CONN_LISTEN or not c.laddr:
            continue
        ip, port = str(c.laddr[0]), int(c.laddr[1])
        seen[("*" if ip in ("0.0.0.0", "::") else ip, port)] = None  # noqa: S104
    ports = sorted(seen, key=lambda a: (abs(a[1] - expected), a[1], a[0]))
    out = []
    for ip, port in ports:
        shown = host_header(ip, port) if ip != "*" else f"*:{port}"
        if shown not in out:
            out.append(shown)
    return out[:limit]
