"""What the service probes share: the causes of a failed or stalled connection, and reading a reply."""

from __future__ import annotations

from probes.spec import cause
from probes.untrusted import clean, load_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CONNECT_TIMEOUT = cause("connect-timeout", "connection not accepted before the deadline (accept queue full)",
                        "the server is hung or its accept queue is full: restart it",
                        action="restart-app", actor="tenant")
UNREACHABLE = cause("unreachable", "host does not resolve or cannot be reached",
                    "check `HEALTHCHECK_HOST` (an address such as `127.0.0.1`)", action="fix-config",
                    actor="tenant")
SSHD_STUCK = cause("deadline", "sshd gave no complete answer before the deadline "
                               "(a banner cut short, a stall in key exchange, a hung session)",
                   "sshd is overloaded or stuck: restart it", action="restart-app", actor="tenant")


def host_header(host: str, port: int) -> str:
    """``host:port`` as an HTTP Host header (IPv6 literals in brackets)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def json_or_none(raw: bytes | str) -> Any:
    try:
        return load_json(raw)
    except ValueError:
        return None


def excerpt(raw: bytes) -> str:
    """The first line a server sent, quoted and cleaned; latin-1 shows its bytes, never an error."""
    line = raw.lstrip(b"\r\n\t ").split(b"\n", 1)[0].rstrip(b"\r")
    return "'" + clean(line[:160].decode("latin-1").strip(), 40) + "'"
