"""Every probe module keeps the contract that the runner, config and docs read (docs/development.md,
"Adding a probe"): ``ProbeModule`` below.

mypy (``make lint``) holds each built-in probe module to ``ProbeModule`` through ``CHECKED``;
the tests hold the catalog to the same list and check the members at run time.
"""

from __future__ import annotations

import types
from typing import Any, Protocol

from probes import registry, spec
from probes.context import Context
from probes.framework import checkpoint, model, nccl, torch_cuda
from probes.hardware import nvidia_smi, nvml, runtime
from probes.result import Result, passed
from probes.services import jupyter, jupyter_kernel, ssh, ssh_keys, ssh_login


class ProbeModule(Protocol):
    """Optional, which a Protocol cannot say: ``on_deadline(ctx) -> Result``, ``requirements(config)
    -> Iterable[str]`` and ``Settings``."""

    SPEC: spec.Spec

    def gather(self, ctx: Context) -> Any: ...

    def judge(self, data: Any, ctx: Context) -> Result: ...


CHECKED: tuple[ProbeModule, ...] = (nvidia_smi, nvml, runtime, checkpoint, torch_cuda, model, nccl, jupyter,
                                     jupyter_kernel, ssh, ssh_keys, ssh_login)


OPTIONAL = ("on_deadline", "requirements", "Settings")


def required() -> tuple[str, ...]:
    """The members every probe module must define: ``ProbeModule``'s own."""
    return tuple(n for n in (*ProbeModule.__annotations__, *vars(ProbeModule)) if not n.startswith("_"))


def missing(module: object) -> list[str]:
    """What ``module`` lacks of the contract, or defines but cannot call: [] for a probe module."""
    gaps = [n for n in required() if not hasattr(module, n)]
    gaps += [n for n in required() if n != "SPEC" and hasattr(module, n) and not callable(getattr(module, n))]
    gaps += [n for n in OPTIONAL if hasattr(module, n) and not callable(getattr(module, n))]
    if hasattr(module, "SPEC") and not isinstance(module.SPEC, spec.Spec):
        gaps.append("SPEC")
    return gaps


def test_mypy_checks_every_module_of_the_catalog() -> None:
    assert {id(m) for m in CHECKED} == {id(s.load()) for s in registry.PROBES}


def test_every_probe_module_keeps_the_contract() -> None:
    assert required() == ("SPEC", "gather", "judge")
    for s in registry.PROBES:
        assert missing(s.load()) == [], s.module


def _probe(**members: object) -> types.ModuleType:
    module = types.ModuleType("probes.thrown_away")
    for key, value in members.items():
        setattr(module, key, value)
    return module


def _judge(data: object, ctx: object) -> Result:
    return passed("thrown-away", "fine")


SPEC = spec.Spec("thrown-away", layer="services", module="probes.thrown_away", toggle="ENABLE_THROWN_AWAY_CHECK",
                 timeout=1.0, profiles=("readiness",))


def test_a_module_without_a_member_breaks_the_contract() -> None:
    assert missing(_probe(SPEC=SPEC, gather=dict, judge=_judge)) == []
    assert missing(_probe(SPEC=SPEC, gather=dict)) == ["judge"]
    assert missing(_probe(gather=dict, judge=_judge)) == ["SPEC"]
    assert missing(_probe(SPEC=SPEC, gather=dict, judge="not callable")) == ["judge"]
    assert missing(_probe(SPEC=("a", "tuple"), gather=dict, judge=_judge)) == ["SPEC"]
    assert missing(_probe(SPEC=SPEC, gather=dict, judge=_judge, on_deadline=1)) == ["on_deadline"]
