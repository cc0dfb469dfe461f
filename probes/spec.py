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

from probes.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

ALL_PROFILES = ("startup", "readiness", "liveness")
LAYERS = ("hardware", "framework", "services", "drop-in")

# Setting kinds (how config parses the value); see probes.config.parse_setting.
BOOL, NUMBER, INTEGER, PORT = "bool", "number", "integer", "port"
TEXT, CHOICE, URL_PATH, HOST, ABSOLUTE_PATH = "text", "choice", "path", "host", "absolute-path"


class Setting(Record):
    """One environment variable a probe reads, with its validation and its row in docs/probes.md."""

    __slots__ = ("env", "field", "kind", "default", "meaning", "low", "high", "low_inclusive", "choices",
                 "shown_default", "parse")

    env: str  # HEALTHCHECK_SSH_PORT
    field: str  # the field of the probe's Settings record: config.of(Settings).ssh_port
    kind: str  # BOOL, NUMBER, INTEGER, PORT, TEXT, CHOICE, URL_PATH, HOST or ABSOLUTE_PATH
    default: Any
    meaning: str  # one line for docs/probes.md and --help
    low: float  # NUMBER and INTEGER bounds
    high: float
    low_inclusive: bool
    choices: tuple[str, ...]  # CHOICE
    shown_default: str | None  # the default column of docs/probes.md when not just the value
    # A TEXT setting's own grammar: the value (surrounding whitespace removed) -> what is kept;
    # ValueError("is not ... (accepted: ...)") refuses it with exit 3.
    parse: Any

    def __init__(self, env: str, field: str, kind: str, default: Any, meaning: str, low: float = 0.0,
                 high: float = 0.0, low_inclusive: bool = False, choices: tuple[str, ...] = (),
                 shown_default: str | None = None, parse: Any = None) -> None:
        self.env = env
        self.field = field
        self.kind = kind
        self.default = default
        self.meaning = meaning
        self.low = low
        self.high = high
        self.low_inclusive = low_inclusive
        self.choices = choices
        self.shown_default = shown_default
        self.parse = parse


class Cause(Record):
    """One row of a probe's cause table: what happened, the reason code, status and remedy."""

    __slots__ = ("reason", "status", "cause", "remedy")

    reason: str
    status: str  # "fail", "warn" or "skip"
    cause: str
    remedy: str

    def __init__(self, reason: str, status: str, cause: str, remedy: str) -> None:
        self.reason = reason
        self.status = status
        self.cause = cause
        self.remedy = remedy


def cause(reason: str, what: str, remedy: str, status: str = "fail") -> Cause:
    """A cause row written reason, what happened, remedy: a failure unless ``status`` says
    otherwise (the order the probes' long tables read best in)."""
    return Cause(reason, status, what, remedy)


class Spec(Record):
    __slots__ = ("name", "layer", "module", "toggle", "timeout", "profiles", "requires", "measurement",
                 "settings", "causes", "about", "dropin", "default_on", "on_with", "follows")

    name: str
    layer: str
    module: str
    toggle: str  # the ENABLE_* variable that switches it on or off
    timeout: float  # default per-probe deadline in seconds (capped by the run's)
    profiles: tuple[str, ...]
    requires: tuple[str, ...]  # probes whose failure skips this one
    measurement: str
    settings: tuple[Setting, ...]
    causes: tuple[Cause, ...]
    about: str  # what it proves, one line (--help, docs/probes.md)
    dropin: Any  # probes.dropins.Check for a drop-in check
    # Deep, costly checks are opt-in: off unless their toggle says true, or (``on_with``, the
    # ``field`` of one of its settings) unless that setting is given and the toggle is not.
    default_on: bool
    on_with: str
    follows: str  # another probe's toggle: when this one's is not given, it takes that one's value


    def __init__(self, name: str, layer: str, module: str, toggle: str, timeout: float,
                 profiles: tuple[str, ...], requires: tuple[str, ...] = (), measurement: str = "status",
                 settings: tuple[Setting, ...] = (), causes: tuple[Cause, ...] = (), about: str = "",
                 dropin: Any = None, default_on: bool = True, on_with: str = "", follows: str = "") -> None:
        self.name = name
        self.layer = layer
        self.module = module
        self.toggle = toggle
        self.timeout = timeout
        self.profiles = profiles
        self.requires = requires
        self.measurement = measurement
        self.settings = settings
        self.causes = causes
        self.about = about
        self.dropin = dropin
        self.default_on = default_on
        self.on_with = on_with
        self.follows = follows

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


