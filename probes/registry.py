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

# In layer order: a layer's package declares its probes (``SPECS``), so reading them imports no
# probe module (each is imported only to run: ``Spec.load``); a module of its own (a plug-in)
# declares one (``SPEC``).
MODULES = ("probes.hardware", "probes.framework",
           "probes.services.jupyter",
           "probes.services.jupyter_kernel",
           "probes.services.ssh",
           "probes.services.ssh_keys",
           "probes.services.ssh_login")


def specs_of(name: str) -> tuple[Any, ...]:
    """The probes a line of ``MODULES`` declares."""
    found = load(name)
    return tuple(getattr(found, "SPECS", None) or (found.SPEC,))


_cache: dict[str, Any] = {}


def _build() -> dict[str, Any]:
    if not _cache:
        specs = tuple(s for m in MODULES for s in specs_of(m))
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
