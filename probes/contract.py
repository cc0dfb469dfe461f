"""The probe-module contract: what the runner, config and docs read of a probe module.

A probe module (named by its Spec, which its layer's package declares: ``probes.registry``) defines:

- ``SPEC``: its declaration (``probes.spec.Spec``), read by every run; it may be its layer
  package's (``probes.hardware.NVML_SPEC``), bound here, so a run need not import the module;
- ``gather(ctx)``: the only part that touches hardware, subprocesses or sockets; it returns
  by ``ctx.deadline``;
- ``judge(data, ctx)``: pure, ``gather``'s data in, a ``Result`` out;

and may define (a Protocol cannot say "optional"; ``OPTIONAL`` lists them):

- ``on_deadline(ctx) -> Result``: the result when ``gather`` overran its deadline;
- ``requirements(config) -> Iterable[str]``: the probes it requires in this configuration,
  when that depends on a setting;
- ``Settings``: its declared settings (a ``probes.spec.Declared`` class), read as
  ``ctx.config.of(Settings)``.

``probes.dropin_check``, which runs every drop-in, defines ``gather`` and ``judge`` only:
each drop-in's ``Spec`` comes from its file (``probes.dropins``).

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
