"""What a probe sees while it runs, and the suite's logger."""

from __future__ import annotations

from probes.config import Config
from probes.record import Record
from probes.result import Result
from probes.state import State

TYPE_CHECKING = False
if TYPE_CHECKING:
    import logging
    from collections.abc import Mapping

    from probes.spec import Spec

def logger() -> logging.Logger:
    """The suite's logger, set up on first use: importing logging costs every run ~5 ms.

    Details (exception texts) go only to HEALTHCHECK_LOG_FILE when one is set, never to
    stderr: Docker and the kubelet would show them to anyone reading the health log.
    """
    import logging

    log = logging.getLogger("healthcheck")
    if not log.handlers:
        log.addHandler(logging.NullHandler())
        log.propagate = False
    return log


class Context(Record):
    __slots__ = ("config", "deadline", "results", "state", "started", "spec")

    config: Config
    deadline: float  # time.monotonic() by which gather() must return
    results: Mapping[str, Result]  # probes that already finished in this run
    state: State
    started: float  # wall clock (time.time()) at run start
    spec: Spec | None  # the probe being run (a drop-in check reads its file from here)

    def __init__(self, config: Config, deadline: float, results: Mapping[str, Result], state: State,
                 started: float = 0.0, spec: Spec | None = None) -> None:
        self.config = config
        self.deadline = deadline
        self.results = results
        self.state = state
        self.started = started
        self.spec = spec

    def remaining(self) -> float:
        import time

        return max(0.0, self.deadline - time.monotonic())
