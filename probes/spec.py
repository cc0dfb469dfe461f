"""What a probe declares about itself: ``SPEC = Spec(...)``, its settings (``Declared``) and its
causes (``Cause``: the catalog a judge's ``verdict`` points into). docs/architecture.md says how
they are read; probes/contract.py is the module contract. Every run reads every declaration, so
this module stays cheap to import (docs/development.md, "Start-up policy").
"""

from __future__ import annotations

import sys

from probes.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Self


class Profile(Record):
    """What a profile (``--profile``) means: its whole-run deadline and what its run may do. Probes
    ask ``ctx.config.profile_rules`` instead of comparing names; serve and the docs read it too."""

    __slots__ = ("name", "timeout", "reuses_cache", "spawns_worker", "hardware", "once", "gates", "tells",
                 "period", "retries")

    name: str
    timeout: float  # the run's deadline when HEALTHCHECK_TIMEOUT is unset (the margins: probes/deadlines.py)
    reuses_cache: bool  # a passing costly result (torch-cuda, model, nccl) younger than its TTL answers
    spawns_worker: bool  # a GPU worker may start; else torch-cuda answers from the latch alone
    hardware: bool  # the GPU's state is judged (nvidia-smi, NVML, serve's slowdown): no restart repairs it
    once: bool  # runs till its first pass, once per container start (serve keeps it): one-time advice here
    gates: bool  # serve: a failure takes the pod out of the Service (HEALTHCHECK_SERVE_READINESS_GATING)
    tells: bool  # judges whether the container can do its job: its verdict is told to the person (notice.py)
    # How often it runs and how many misses its runner allows: a told verdict older than
    # period x retries is stale ("not checked since ...").
    period: float
    retries: int

    def __init__(self, name: str, timeout: float, reuses_cache: bool = False, spawns_worker: bool = False,
                 hardware: bool = False, once: bool = False, gates: bool = False, tells: bool = False,
                 period: float = 10.0, retries: int = 3) -> None:
        self.name = name
        self.timeout = timeout
        self.reuses_cache = reuses_cache
        self.spawns_worker = spawns_worker
        self.hardware = hardware
        self.once = once
        self.gates = gates
        self.tells = tells
        self.period = period
        self.retries = retries


# Periods and retries: readiness's are the image's HEALTHCHECK (--interval=30s --retries=3);
# startup's period is the kubelet's (k8s/base, 10 s), and its 9 retries make it stale after 90 s
# as readiness: a startup run may take its whole 60 s deadline before the next starts, and after
# its pass the first readiness verdict (a 10 s period, a 25 s deadline) comes well within that.
# Liveness's are the kubelet's (10 s, 6 misses); it tells nothing.
PROFILE_RULES = {p.name: p for p in (
    Profile("startup", 60.0, spawns_worker=True, hardware=True, once=True, tells=True, period=10.0,
            retries=9),
    Profile("readiness", 25.0, reuses_cache=True, spawns_worker=True, hardware=True, gates=True, tells=True,
            period=30.0, retries=3),
    Profile("liveness", 10.0, period=10.0, retries=6),  # cheap, dependency-free: the services, the latch
)}
ALL_PROFILES = tuple(PROFILE_RULES)
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


# What to do about a cause, and who can do it: every cause declares both, and every warn or fail
# check carries them (health+json, the healthcheck_probe_reason labels, the alert routes).
ACTIONS = ("none", "retry", "restart-app", "restart-container", "reset-gpu", "reboot-node",
           "service-hardware", "fix-config")
# tenant: whoever runs the container (a notebook user, the pod's owner); operator: whoever runs the node.
ACTORS = ("tenant", "operator")


class Cause(Record):
    """One cause in the catalog: its reason code, status, what it means, the remedy, and who acts
    (``actor``) and how (``action``).

    The remedy is written once, here: the docs table shows it as written (Markdown), and a
    probe's message is the detail it observed followed by the remedy with its backticks
    dropped (``probes.result.verdict``).
    """

    __slots__ = ("reason", "status", "cause", "remedy", "action", "actor")

    reason: str
    status: str  # "fail", "warn", "skip", or "pass" (a reason that is not a fault: action none)
    cause: str
    remedy: str
    action: str  # one of ACTIONS
    actor: str  # one of ACTORS

    def __init__(self, reason: str, status: str, cause: str, remedy: str, action: str, actor: str) -> None:
        if status not in ("pass", "warn", "fail", "skip"):
            raise ValueError(f"cause {reason!r}: status {status!r} is not pass, warn, fail or skip")
        if action not in ACTIONS:
            raise ValueError(f"cause {reason!r}: action {action!r} is not one of {', '.join(ACTIONS)}")
        if actor not in ACTORS:
            raise ValueError(f"cause {reason!r}: actor {actor!r} is not tenant or operator")
        self.reason = reason
        self.status = status
        self.cause = cause
        self.remedy = remedy
        self.action = action
        self.actor = actor


def cause(reason: str, what: str, remedy: str, status: str = "fail", *, action: str, actor: str) -> Cause:
    """A cause row written reason, what happened, remedy: a failure unless ``status`` says
    otherwise (the order the probes' long tables read best in), then who acts and how."""
    return Cause(reason, status, what, remedy, action, actor)


def setting(env: str, kind: str, default: Any, meaning: str, **more: Any) -> Any:
    """One field of a ``Declared`` settings record: ``gpu_count: int = setting(...)``.

    Typed ``Any`` so that the field's annotation is its type for mypy; the record class turns
    it into a ``Setting`` whose ``field`` is the attribute's name."""
    return Setting(env, "", kind, default, meaning, **more)


class Declared:
    """A probe's settings, declared once: each field is ``name: type = setting(...)``.

    The class collects its fields' ``Setting`` rows (in order, a base's first) into
    ``SETTINGS``, which the probe's ``Spec`` lists; ``config.of(TheClass)`` is an instance
    whose attributes are the values of this run.
    """

    SETTINGS: tuple[Setting, ...] = ()

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        rows = list(cls.SETTINGS)
        for name, value in list(vars(cls).items()):
            if isinstance(value, Setting):
                row = value._replace(field=name) if value.field != name else value
                setattr(cls, name, row)
                rows.append(row)
        cls.SETTINGS = tuple(rows)

    @classmethod
    def read(cls, values: Any) -> Self:
        """The record of these settings' values (a mapping from ``field`` to value)."""
        self = object.__new__(cls)
        for row in cls.SETTINGS:
            self.__dict__[row.field] = values[row.field]
        return self

    def _asdict(self) -> dict[str, Any]:
        return {row.field: self.__dict__[row.field] for row in self.SETTINGS}

    def _replace(self, **changes: Any) -> Self:
        return self.read({**self._asdict(), **changes})

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._asdict() == other._asdict()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(tuple(self._asdict().items()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._asdict().items())})"


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

    def __init__(self, name: str, *, layer: str, module: str, toggle: str, timeout: float,
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


