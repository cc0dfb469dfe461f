"""What a probe sees while it runs, and the suite's logger."""

from __future__ import annotations

from probes.config import Config
from probes.result import Result
from probes.state import State

TYPE_CHECKING = False
if TYPE_CHECKING:
    import logging
    from collections.abc import Mapping
    from typing import NamedTuple

    from probes.spec import Spec
else:
    from probes._typing import NamedTuple


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


class Context(NamedTuple):
    config: Config
    deadline: float  # time.monotonic() by which gather() must return
    results: Mapping[str, Result]  # probes that already finished in this run
    state: State
    started: float = 0.0  # wall clock (time.time()) at run start
    spec: Spec | None = None  # the probe being run (a drop-in check reads its file from here)

    @property
    def profile(self) -> str:
        return self.config.profile

    def remaining(self) -> float:
        import time

        return max(0.0, self.deadline - time.monotonic())
