"""Probes with scripted behaviour (pass, warn, fail, raise, hang, slow), to exercise the real runner.

This module is the probe module of every fake probe: the runner imports it by name as it imports
the product's probes (``Spec.load``), and each probe's behaviour is its spec's ``about``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from probes.result import Result, Status
from probes.spec import ALL_PROFILES, Spec

SEEN: list[tuple[str, dict[str, Result]]] = []
THREADS: list[int] = []  # the process's threads as each probe starts
_never = threading.Event()


def gather(ctx: Any) -> str:
    name, behaviour = ctx.spec.name, ctx.spec.about
    SEEN.append((name, dict(ctx.results)))
    THREADS.append(len(os.listdir("/proc/self/task")))
    if behaviour == "hang":
        _never.wait(3600)  # like a driver call that never returns
    if behaviour == "slow":
        time.sleep(0.3)
    if behaviour == "raise":
        raise RuntimeError("secret-token-abc123 inside an exception text")
    return str(behaviour)


def judge(data: str, ctx: Any) -> Result:
    name = ctx.spec.name
    status = {"pass": Status.PASS, "slow": Status.PASS, "warn": Status.WARN}.get(data, Status.FAIL)
    return Result(name, status, f"{name} said {data}", observed=1, unit="things",
                  reason=None if status is Status.PASS else data)


def spec(name: str, behaviour: str, layer: str = "services", timeout: float = 2.0,
         requires: tuple[str, ...] = ()) -> Spec:
    return Spec(name, layer=layer, module=__name__, toggle="ENABLE_SSH_CHECK", timeout=timeout,
                profiles=ALL_PROFILES, requires=requires, about=behaviour)
