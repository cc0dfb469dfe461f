"""What a probe sees while it runs."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping

from probes.config import Config
from probes.result import Result
from probes.state import State

log = logging.getLogger("healthcheck")
# Details (exception texts) go only to HEALTHCHECK_LOG_FILE when one is set, never to
# stderr: Docker and the kubelet would show them to anyone reading the health log.
log.addHandler(logging.NullHandler())
log.propagate = False


@dataclasses.dataclass(frozen=True)
class Context:
    config: Config
    deadline: float  # time.monotonic() by which gather() must return
    results: Mapping[str, Result]  # probes that already finished in this run
    state: State
    started: float = dataclasses.field(default_factory=time.time)  # wall clock at run start

    @property
    def profile(self) -> str:
        return self.config.profile

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())
