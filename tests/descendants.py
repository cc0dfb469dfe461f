"""Descendants that leave their parent's session or group: the faults behind "nothing
outlives a probe", as bash fragments for the stub executables of every test layer.

Each fragment starts its processes in the background and returns at once, so the stub
can then answer, exit or hang as its test needs. Every process it starts carries
``marker`` in its command line (``exec -a``, or an argument), so tests.servers.leftovers
finds a survivor wherever it was re-parented. No braces in the text: the stress suite's
stub bodies are str.format templates.
"""

from __future__ import annotations

import sys
from pathlib import Path

PY = sys.executable  # any python will do; -I -S keeps its start-up short
SLEEPER = "bash -c 'exec -a \"$0\" sleep 300'"

# A grandchild that calls setsid(): it leaves the child's session and group.
SETSID = f"setsid {SLEEPER} '{{m}}-setsid' &"

# The classic daemon: fork, setsid, fork again, the middle process exits; the daemon is
# an orphan in a session of its own, below nobody we started.
DOUBLE_FORK = (
    f"{PY} -I -S -c 'import os, sys\n"
    "if os.fork(): os._exit(0)\n"
    "os.setsid()\n"
    "if os.fork(): os._exit(0)\n"
    "os.execvp(\"sleep\", [sys.argv[1], \"300\"])' '{m}-daemon' &"
)

STORM_SIZE = 100
# A fork storm: STORM_SIZE processes, each in a session of its own, forked (not exec'd, so
# that a storm costs little) by a process that then exits and leaves them all orphans.
STORM = (
    f"{PY} -I -S -c 'import os, sys, time\n"
    f"for _ in range({STORM_SIZE}):\n"
    "    if os.fork() == 0:\n"
    "        os.setsid()\n"
    "        time.sleep(300)\n"
    "        os._exit(0)' '{m}-storm' &"
)

FRAGMENTS = {"setsid": SETSID, "double-fork": DOUBLE_FORK, "storm": STORM}
KINDS = tuple(FRAGMENTS)

# A process whose SIGTERM handler forks a new session's process before it exits: what
# the deadline's SIGTERM starts must be ended too. Replaces the stub (exec), so it is the
# child itself; it hangs until the deadline.
TERM_FORK = (
    f"exec {PY} -I -S -c 'import os, signal, sys, time\n"
    "def on_term(*_):\n"
    "    if os.fork() == 0:\n"
    "        os.setsid()\n"
    "        os.execvp(\"sleep\", [sys.argv[1] + \"-termfork\", \"300\"])\n"
    "    os._exit(0)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "print(\"ready\", flush=True)\n"
    "time.sleep(300)' '{m}'"
)


def leave(kind: str, marker: str) -> str:
    """The bash fragment that starts ``kind``'s descendants, marked with ``marker``."""
    return FRAGMENTS[kind].replace("{m}", marker)


def term_fork(marker: str) -> str:
    return TERM_FORK.replace("{m}", marker)


def hang(marker: str) -> str:
    """The rest of a stub that hangs (sh or bash): it becomes a marked sleeper."""
    return f"exec {SLEEPER} '{marker}-hang'"


def template(kind: str) -> str:
    """``kind``'s fragment as a str.format template with ``{m}`` for the marker."""
    return FRAGMENTS.get(kind, TERM_FORK)


def stub(path: Path, kind: str, marker: str, then: str = "exit 0") -> Path:
    """A bash executable that starts ``kind``'s descendants, then runs ``then`` (answer
    and exit, or hang); ``term-fork`` is the child whose SIGTERM handler forks."""
    from tests.stress.conftest import write_exe

    return write_exe(path, term_fork(marker) if kind == "term-fork" else f"{leave(kind, marker)}\n{then}")
