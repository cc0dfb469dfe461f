"""The probe-module contract: what the runner, config and docs read of a probe module.

``SPEC``, ``gather(ctx)`` and ``judge(data, ctx)``: docs/development.md, "Adding a probe". Optional
(a Protocol cannot say so): ``on_deadline(ctx) -> Result``, the result when ``gather`` overran its
deadline; ``requirements(config) -> Iterable[str]``, the probes it requires when that depends on a
setting; ``Settings``, its declared settings. ``probes.dropin_check`` has no ``SPEC``: each
drop-in's comes from its file. Imported only by the type checker and the tests.
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
