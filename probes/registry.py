"""The catalog: which probes exist, one line per module, in layer order (docs/architecture.md).

The modules are imported on first use of ``PROBES`` (or ``NAMES``, ``BY_NAME``, ``TOGGLES``,
``SETTINGS``), by name, not when this module is imported: ``probes.config`` imports this
catalog, and a probe module may import ``probes.config``. A probe module imports
``probes.spec``, never this catalog.
"""

from __future__ import annotations

from probes.spec import Setting, load

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# One line per probe module, in layer order.
MODULES = (
    "probes.hardware.nvidia_smi",
    "probes.hardware.nvml",
    "probes.hardware.runtime",
    "probes.framework.checkpoint",
    "probes.framework.torch_cuda",
    "probes.framework.model",
    "probes.framework.nccl",
    "probes.services.jupyter",
    "probes.services.jupyter_kernel",
    "probes.services.ssh",
    "probes.services.ssh_keys",
    "probes.services.ssh_login",
)


_cache: dict[str, Any] = {}


def _build() -> dict[str, Any]:
    if not _cache:
        specs = tuple(load(m).SPEC for m in MODULES)
        toggles = tuple(dict.fromkeys(s.toggle for s in specs))
        settings: dict[str, Setting] = {}
        for s in specs:
            for setting in s.settings:
                if settings.setdefault(setting.env, setting) != setting:
                    raise RuntimeError(f"{setting.env} is declared twice, differently")
        _cache.update(PROBES=specs, BY_NAME={s.name: s for s in specs}, NAMES=tuple(s.name for s in specs),
                      TOGGLES=toggles, SETTINGS=tuple(settings.values()))
    return _cache


def __getattr__(name: str) -> Any:
    """``PROBES``, ``BY_NAME``, ``NAMES``, ``TOGGLES`` and ``SETTINGS``, built on first use."""
    if name in ("PROBES", "BY_NAME", "NAMES", "TOGGLES", "SETTINGS"):
        return _build()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
