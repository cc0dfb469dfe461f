"""The probe-module contract: what the runner, config and docs read of a probe module.

``SPEC``, ``gather(ctx)`` and ``judge(data, ctx)``: docs/development.md, "Adding a probe"
(``SPEC`` may be bound to its layer package's declaration, so a run need not import the module;
``probes.dropin_check`` has none: each drop-in's ``Spec`` comes from its file). Optional
(a Protocol cannot say so; ``OPTIONAL`` lists them): ``on_deadline(ctx) -> Result``, the result
when ``gather`` overran its deadline; ``requirements(config) -> Iterable[str]``, the probes it
requires when that depends on a setting; ``Settings``, its declared settings.

Imported only by the type checker and the tests, so ``typing`` stays off the liveness path: mypy
holds every built-in probe module to ``ProbeModule``; tests/core/test_contract.py checks it at run time.
"""

from __future__ import annotations

from typing import Any, Protocol

from probes.context import Context
from probes.result import Result
from probes.spec import Spec


class ProbeModule(Protocol):
    SPEC: Spec

    def gather(self, ctx: Context) -> Any: ...

    def judge(self, data: Any, ctx: Context) -> Result: ...


OPTIONAL = ("on_deadline", "requirements", "Settings")


def required() -> tuple[str, ...]:
    """The members every probe module must define: ``ProbeModule``'s own."""
    return tuple(n for n in (*ProbeModule.__annotations__, *vars(ProbeModule)) if not n.startswith("_"))


def missing(module: object) -> list[str]:
    """What ``module`` lacks of the contract, or defines but cannot call: [] for a probe module."""
    gaps = [n for n in required() if not hasattr(module, n)]
    gaps += [n for n in required() if n != "SPEC" and hasattr(module, n) and not callable(getattr(module, n))]
    gaps += [n for n in OPTIONAL if hasattr(module, n) and not callable(getattr(module, n))]
    if hasattr(module, "SPEC") and not isinstance(module.SPEC, Spec):
        gaps.append("SPEC")
    return gaps
