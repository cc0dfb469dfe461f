"""The services layer: Jupyter Server and sshd, judged by their protocols. Shared causes live here."""

from probes.spec import Cause

CONNECT_TIMEOUT = Cause("connect-timeout", "fail", "connection not accepted before the deadline (accept "
                                                   "queue full)",
                        "the server is hung: restart it")
UNREACHABLE = Cause("unreachable", "fail", "host does not resolve or cannot be reached",
                    "set `HEALTHCHECK_HOST` (for example `127.0.0.1`)")
