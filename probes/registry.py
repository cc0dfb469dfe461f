"""The catalog: which probes exist, one module per line, each declaring its ``SPEC``,
imported by name on first use of the names below: a probe module may import ``probes.config``,
which imports this catalog."""

from __future__ import annotations

from probes.spec import LAYERS, Setting, load

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

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


_cache: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    if name not in ("PROBES", "BY_NAME", "NAMES", "TOGGLES", "SETTINGS"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not _cache:
        listed = [load(m).SPEC for m in (*MODULES, *PLUGINS)]
        order = {layer: i for i, layer in enumerate(LAYERS)}
        specs = tuple(sorted(listed, key=lambda s: order.get(s.layer, len(order))))  # stable: in listed order
        settings: dict[str, Setting] = {}
        for s in specs:
            for setting in s.settings:
                if settings.setdefault(setting.env, setting) != setting:
                    raise RuntimeError(f"{setting.env} is declared twice, differently")
        _cache.update(PROBES=specs, BY_NAME={s.name: s for s in specs}, NAMES=tuple(s.name for s in specs),
                      TOGGLES=tuple(dict.fromkeys(s.toggle for s in specs)),
                      SETTINGS=tuple(settings.values()))
    return _cache[name]
