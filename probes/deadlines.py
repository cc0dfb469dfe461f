"""The deadline ladder, from a probe's child out to what runs the suite, each margin with its reason;
a profile's own deadline is its ``Profile.timeout``. The front door, k8s/check_probes.py and
docs/kubernetes.md's ladder table derive from here."""

from __future__ import annotations

import math

# A child (probes/proc.py): ended within TERM_GRACE + KILL_WAIT of its deadline, so a probe that must
# itself answer by ``ctx.deadline`` gives the child that less MARGIN.
TERM_GRACE = 0.15  # SIGTERM to SIGKILL: a well-behaved child exits on TERM well within it
KILL_WAIT = 0.15  # after SIGKILL, for what was killed to vanish (one stuck in the driver never does)
DYING_WAIT = 1.0  # more, for a killed child still runnable: a starved machine has not run its exit yet
MARGIN = TERM_GRACE + KILL_WAIT + 0.05
DRAIN_AFTER_EXIT = 0.05  # output still in the pipe after the child exits
LINGER = 1.0  # a child whose answer is complete (``until``) gets this long to exit
# The run (probes/runner.py).
GRACE = 0.4  # past a probe's deadline (x2 for a dependency, x3 for the run): its child's TERM+KILL, 0.3 s
RUN_MARGIN = 0.5  # kept of the run's budget (at most half of it) for the report
WRITE_WAIT = 1.0  # for room to write the report: a full pipe that nobody reads costs it, not the verdict
# The notice (probes/notice.py), after the verdict: another check holds its lock for a few milliseconds;
# with the runner's 3 x GRACE it stays within FRONT_DOOR_GRACE. Not had by then: nothing is told.
NOTICE_WAIT = 0.5
# The front door (./healthcheck: its `sleep 3` and `sleep 1`; the hard stop, the run tells it).
FRONT_DOOR_GRACE = 3  # TERM this long past the budget (rounded up): the runner's 3 x GRACE, the report
FRONT_DOOR_KILL_AFTER = 1  # then KILL, and it answers at once without the suite (one stuck in D)
# Until the suite has said its hard stop: the interpreter's start, imports and settings take well
# under a second; no longer than the least hard stop (a 1 s budget + GRACE), so the ladder holds.
FRONT_DOOR_START_UP = 3
# healthcheck serve's monitor runs `python -m probes` itself, and ends it this long after its budget:
# the suite's own deadline, not the monitor's, normally ends a slow run.
SERVE_RUN_GRACE = 5.0


def hard_stop(timeout: float) -> int:
    """Seconds into a run at which the front door TERMs it (the run tells the door)."""
    return math.ceil(timeout) + FRONT_DOOR_GRACE


def probe_timeout_floor(timeout: float) -> int:
    """The least timeoutSeconds above the front door's KILL: the kubelet leaves a timed-out probe's
    grandchildren, so the front door must end them."""
    return hard_stop(timeout) + FRONT_DOOR_KILL_AFTER + 1
