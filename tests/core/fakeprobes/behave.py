"""Probes with scripted behaviour (pass, warn, fail, raise, hang, slow), to exercise the real runner."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from probes import registry
from probes.result import Result, Status

SEEN: list[tuple[str, dict[str, Result]]] = []
_never = threading.Event()


def make(name: str, behaviour: str) -> Any:
    """A module-like object for one fake probe."""

    class Probe:
        NAME = name
        MEASUREMENT = "status"

        @staticmethod
        def gather(ctx: Any) -> str:
            SEEN.append((name, dict(ctx.results)))
            if behaviour == "hang":
                _never.wait(3600)  # like a driver call that never returns
            if behaviour == "slow":
                time.sleep(0.3)
            if behaviour == "raise":
                raise RuntimeError("secret-token-abc123 inside an exception text")
            return behaviour

        @staticmethod
        def judge(data: str, ctx: Any) -> Result:
            status = {"pass": Status.PASS, "slow": Status.PASS, "warn": Status.WARN}.get(data, Status.FAIL)
            return Result(name, status, f"{name} said {data}", observed=1, unit="things",
                          reason=None if status is Status.PASS else data)

    return Probe


@dataclasses.dataclass(frozen=True)
class FakeSpec(registry.Spec):
    behaviour: str = "pass"

    def load(self) -> Any:
        return make(self.name, self.behaviour)


def spec(name: str, behaviour: str, layer: str = "services", timeout: float = 2.0,
         requires: tuple[str, ...] = ()) -> FakeSpec:
    return FakeSpec(name, layer, "unused", "ENABLE_SSH_CHECK", timeout, registry.ALL_PROFILES,
                    requires, behaviour=behaviour)
