"""What a probe declares about itself: ``SPEC = Spec(...)``, its settings and its causes.

A probe module defines ``SPEC``: its name, layer, JSON measurement (the health+json key is
``NAME:MEASUREMENT``), ``ENABLE_*`` toggle, default deadline, profiles, the probes it
requires, its own settings (environment variable, type, default, bounds, one-line meaning)
and its table of causes (reason code, status, cause, remedy). The module contract (``SPEC``,
``gather``, ``judge``, the optional hooks) is written down in ``probes/contract.py``.

Every run reads every probe's declaration, so this module and the declarations stay cheap
to import (docs/development.md, "Start-up policy").
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, NamedTuple
else:
    from probes._typing import NamedTuple

ALL_PROFILES = ("startup", "readiness", "liveness")
LAYERS = ("hardware", "framework", "services", "drop-in")

# Setting kinds (how config parses the value); see probes.config.parse_setting.
BOOL, NUMBER, INTEGER, PORT = "bool", "number", "integer", "port"
TEXT, CHOICE, URL_PATH, HOST, ABSOLUTE_PATH = "text", "choice", "path", "host", "absolute-path"


class Setting(NamedTuple):
    """One environment variable a probe reads, with its validation and its row in docs/probes.md."""

    env: str  # HEALTHCHECK_SSH_PORT
    field: str  # the attribute on Config: config.ssh_port
    kind: str  # BOOL, NUMBER, INTEGER, PORT, TEXT, CHOICE, URL_PATH, HOST or ABSOLUTE_PATH
    default: Any
    meaning: str  # one line for docs/probes.md and --help
    low: float = 0.0  # NUMBER and INTEGER bounds
    high: float = 0.0
    low_inclusive: bool = False
    choices: tuple[str, ...] = ()  # CHOICE
    shown_default: str | None = None  # the default column of docs/probes.md when not just the value
    # A TEXT setting's own grammar: the value (surrounding whitespace removed) -> what is kept;
    # ValueError("is not ... (accepted: ...)") refuses it with exit 3.
    parse: Any = None


class Cause(NamedTuple):
    """One row of a probe's cause table: what happened, the reason code, status and remedy."""

    reason: str
    status: str  # "fail", "warn" or "skip"
    cause: str
    remedy: str


def cause(reason: str, what: str, remedy: str, status: str = "fail") -> Cause:
    """A cause row written reason, what happened, remedy: a failure unless ``status`` says
    otherwise (the order the probes' long tables read best in)."""
    return Cause(reason, status, what, remedy)


class Spec(NamedTuple):
    name: str
    layer: str
    module: str
    toggle: str  # the ENABLE_* variable that switches it on or off
    timeout: float  # default per-probe deadline in seconds (capped by the run's)
    profiles: tuple[str, ...]
    requires: tuple[str, ...] = ()  # probes whose failure skips this one
    measurement: str = "status"
    settings: tuple[Setting, ...] = ()
    causes: tuple[Cause, ...] = ()
    about: str = ""  # what it proves, one line (--help, docs/probes.md)
    dropin: Any = None  # probes.dropins.Check for a drop-in check
    # Deep, costly checks are opt-in: off unless their toggle says true, or (``on_with``, the
    # ``field`` of one of its settings) unless that setting is given and the toggle is not.
    default_on: bool = True
    on_with: str = ""

    def load(self) -> ModuleType:
        return load(self.module)

    def requirements(self, config: Any) -> tuple[str, ...]:
        """The probes this one needs in this configuration (a module may decide by a setting)."""
        decide = getattr(self.load(), "requirements", None) if self.requires else None
        return tuple(decide(config)) if decide is not None else self.requires


def load(name: str) -> ModuleType:
    """The module ``name``, imported if need be, as ``importlib.import_module`` (which is not
    imported: ~0.3 ms a run). ``__import__`` waits for a module that another thread is still
    importing."""
    __import__(name)
    return sys.modules[name]


