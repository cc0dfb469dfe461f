"""Probes with scripted behaviour (pass, warn, fail, raise, hang, slow), to exercise the real runner.

Each fake probe is a real module object registered in sys.modules, so the runner
loads it exactly as it loads the product's probes (Spec.load imports by name).
"""

from __future__ import annotations

import sys
import threading
import time
import types
from typing import Any

from probes.result import Result, Status
from probes.spec import ALL_PROFILES, Spec

SEEN: list[tuple[str, dict[str, Result]]] = []
_never = threading.Event()


def make(name: str, behaviour: str) -> types.ModuleType:
    """A probe module for one fake probe."""
    module = types.ModuleType(f"tests.core.fakeprobes.probe_{name.replace('-', '_')}_{behaviour}")
    module.NAME = name  # type: ignore[attr-defined]
    module.MEASUREMENT = "status"  # type: ignore[attr-defined]

    def gather(ctx: Any) -> str:
        SEEN.append((name, dict(ctx.results)))
        if behaviour == "hang":
            _never.wait(3600)  # like a driver call that never returns
        if behaviour == "slow":
            time.sleep(0.3)
        if behaviour == "raise":
            raise RuntimeError("secret-token-abc123 inside an exception text")
        return behaviour

    def judge(data: str, ctx: Any) -> Result:
        status = {"pass": Status.PASS, "slow": Status.PASS, "warn": Status.WARN}.get(data, Status.FAIL)
        return Result(name, status, f"{name} said {data}", observed=1, unit="things",
                      reason=None if status is Status.PASS else data)

    module.gather = gather  # type: ignore[attr-defined]
    module.judge = judge  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    return module


def spec(name: str, behaviour: str, layer: str = "services", timeout: float = 2.0,
         requires: tuple[str, ...] = ()) -> Spec:
    module = make(name, behaviour)
    return Spec(name, layer=layer, module=module.__name__, toggle="ENABLE_SSH_CHECK", timeout=timeout,
                profiles=ALL_PROFILES, requires=requires)
