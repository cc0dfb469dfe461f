"""The services layer: Jupyter Server and sshd, judged by their protocols. Shared causes live here."""

from probes.spec import cause

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
