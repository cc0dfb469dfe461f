"""The catalog: which probes exist, one module per line, each declaring its ``SPEC``. A run reads
them through ``probes/index.py`` (written by ``make docs``) and imports only the modules it runs; a
module the index lacks (a plug-in) is imported to read its SPEC (docs/architecture.md)."""

from __future__ import annotations

from probes.record import Record
from probes.spec import LAYERS, Setting, load

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from probes.spec import Spec

# What every image runs, in layer order.
MODULES = (
    "probes.hardware.nvidia_smi",
    "probes.hardware.nvml",
    "probes.hardware.runtime",
    "probes.framework.torch_cuda",
    "probes.services.jupyter",
    "probes.services.jupyter_kernel",
    "probes.services.ssh",
    "probes.services.ssh_keys",
    "probes.services.ssh_login",
)
# Plug-ins: a probe module outside the core, off unless its toggle (or setting) turns it on.
PLUGINS = (
    "probes.framework.checkpoint",
    "probes.framework.model",
    "probes.framework.nccl",
)


class Entry(Record):
    """What choosing a probe needs (``Config.enabled``): its SPEC's fields of these names."""

    name: str
    layer: str
    module: str
    toggle: str
    profiles: tuple[str, ...]
    default_on: bool
    on_with: str
    follows: str
    dials: str

    def spec(self) -> Spec:
        return load(self.module).SPEC  # type: ignore[no-any-return]


def setting(env: str) -> Setting:
    """What validates a probe's setting (a key of ``DECLARED``): its row as the index has it, or
    the declared row itself (its module imported) when the setting has a ``parse`` of its own."""
    field, module, kind, low, high, low_inclusive, choices, parses, default = __getattr__("DECLARED")[env]
    if not parses:
        return Setting(env, field, kind, default, "", low, high, low_inclusive, choices)
    return next(row for row in load(module).SPEC.settings if row.env == env)


# Made on first use (a probe module may import probes.config, which imports this catalog).
# ENTRIES, their NAMES and TOGGLES, and DECLARED (setting: its field, module, ...) come from the
# index; PROBES, BY_NAME and SETTINGS import every module (docs, --help, serve, tests).
_cache: dict[str, Any] = {}
_NAMES = ("ENTRIES", "NAMES", "TOGGLES", "DECLARED", "PROBES", "BY_NAME", "SETTINGS")


def _read_index() -> None:
    from probes import index

    listed = (*MODULES, *PLUGINS)
    entries = [Entry(*row) for row in index.PROBES if row[2] in listed]
    declared = {row[0]: row[1:] for row in index.SETTINGS if row[2] in listed}
    for missing in set(listed).difference(e.module for e in entries):
        s = load(missing).SPEC
        entries.append(Entry(*(getattr(s, field) for field in Entry._fields)))
        declared.update({row.env: (row.field, missing, "", 0, 0, False, (), True, row.default)
                         for row in s.settings if row.env not in declared})
    order = {layer: i for i, layer in enumerate(LAYERS)}
    entries.sort(key=lambda e: (order.get(e.layer, len(order)), listed.index(e.module)))
    _cache.update(ENTRIES=tuple(entries), NAMES=tuple(e.name for e in entries),
                  TOGGLES=tuple(dict.fromkeys(e.toggle for e in entries)), DECLARED=declared)


def _import_all() -> None:
    specs = tuple(e.spec() for e in _cache["ENTRIES"])
    settings = {row.env: row for s in specs for row in s.settings}
    _cache.update(PROBES=specs, BY_NAME={s.name: s for s in specs}, SETTINGS=tuple(settings.values()))


def __getattr__(name: str) -> Any:
    if name not in _cache and name in _NAMES:
        if "ENTRIES" not in _cache:
            _read_index()
        if name not in _cache:
            _import_all()
    try:
        return _cache[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
