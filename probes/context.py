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
    """The suite's logger: details (exception texts) go only to HEALTHCHECK_LOG_FILE, never to
    stderr, where Docker and the kubelet would show them."""
    import logging

    log = logging.getLogger("healthcheck")
    if not log.handlers:
        log.addHandler(logging.NullHandler())
        log.propagate = False
    return log


def log_exception(message: str, *args: object) -> None:
    """To the log if it can be had: under an open-file limit the logging module may not load."""
    try:
        logger().exception(message, *args)
    except Exception:  # noqa: S110 - best effort by design
        pass


class Context(Record):
    config: Config
    deadline: float  # time.monotonic() by which gather() must return
    results: Mapping[str, Result]  # probes that already finished in this run
    state: State
    spec: Spec | None = None  # the probe being run (a drop-in check reads its file from here)

    def remaining(self) -> float:
        import time

        return max(0.0, self.deadline - time.monotonic())
