"""The probe-module contract (docs/development.md, "Adding a probe"), for the type checker and the
tests. Optional, which a Protocol cannot say: ``on_deadline(ctx) -> Result``, ``requirements(config)
-> Iterable[str]`` and ``Settings``.
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
