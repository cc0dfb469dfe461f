"""What the service probes share: the causes of a connection that failed or stalled, and how a
place (``host:port``) and a server's first line are written in a message."""

from __future__ import annotations

from probes.spec import cause
from probes.untrusted import clean

CONNECT_TIMEOUT = cause("connect-timeout", "connection not accepted before the deadline (accept queue full)",
                        "the server is hung or its accept queue is full: restart it",
                        action="restart-app", actor="tenant")
UNREACHABLE = cause("unreachable", "host does not resolve or cannot be reached",
                    "check `HEALTHCHECK_HOST` (an address such as `127.0.0.1`)", action="fix-config",
                    actor="tenant")
# ssh and ssh-login: sshd took the connection but did not finish its part in time.
SSHD_STUCK = cause("deadline", "sshd gave no complete answer before the deadline "
                               "(a banner cut short, a stall in key exchange, a hung session)",
                   "sshd is overloaded or stuck: restart it", action="restart-app", actor="tenant")


def host_header(host: str, port: int) -> str:
    """``host:port`` as an HTTP Host header (IPv6 literals in brackets)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def excerpt(raw: bytes, limit: int = 40) -> str:
    """The first line a server sent, quoted and cleaned; latin-1 shows its bytes, never an error."""
    line = raw.lstrip(b"\r\n\t ").split(b"\n", 1)[0].rstrip(b"\r")
    return "'" + clean(line[: limit * 4].decode("latin-1").strip(), limit) + "'"
