"""What a probe declares about itself: ``SPEC = Spec(...)``, its settings (``Declared``) and its
causes (``Cause``: the catalog a judge's ``verdict`` points into). docs/architecture.md says how
they are read; tests/core/test_contract.py holds the module contract."""

from __future__ import annotations

import sys

from probes.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, ClassVar, Self


class Profile(Record):  # what a profile (--profile) means: probes ask config.profile_rules, never its name
    name: str
    timeout: float  # the run's deadline when HEALTHCHECK_TIMEOUT is unset (the margins: probes/deadlines.py)
    reuses_cache: bool = False  # a passing costly result (torch-cuda, model, nccl) within its TTL answers
    spawns_worker: bool = False  # a GPU worker may start; else torch-cuda answers from the latch alone
    hardware: bool = False  # the GPU's state is judged (nvidia-smi, NVML, serve's slowdown)
    once: bool = False  # runs till its first pass, once per container start (serve): one-time advice
    gates: bool = False  # serve: a failure takes the pod out of the Service (..._SERVE_READINESS_GATING)
    tells: bool = False  # judges whether the container can do its job: told to the person (notice.py)
    # How often it runs and how many misses its runner allows (``stale_after``).
    period: float = 10.0
    retries: int = 3

    @property
    def stale_after(self) -> int:
        return int(self.period * self.retries)


# Periods and retries: readiness's are the image's HEALTHCHECK (--interval=30s --retries=3); startup's
# period is the kubelet's (k8s/base), and its 9 retries make it stale after 90 s as readiness: a startup
# run may take its whole 60 s deadline before the next starts. Liveness's are the kubelet's; it tells nothing.
PROFILE_RULES = {p.name: p for p in (
    Profile("startup", 60.0, spawns_worker=True, hardware=True, once=True, tells=True, retries=9),
    Profile("readiness", 25.0, reuses_cache=True, spawns_worker=True, hardware=True, gates=True, tells=True,
            period=30.0),
    Profile("liveness", 10.0, retries=6),  # cheap, dependency-free: the services, the latch
)}
ALL_PROFILES = tuple(PROFILE_RULES)
LAYERS = ("hardware", "framework", "services", "drop-in")

# Setting kinds (how config parses the value); see probes.config.parse_setting.
BOOL, NUMBER, INTEGER, PORT = "bool", "number", "integer", "port"
TEXT, CHOICE, URL_PATH, HOST, ABSOLUTE_PATH = "text", "choice", "path", "host", "absolute-path"


class Setting(Record):  # an environment variable a probe reads, its validation, its row in docs/probes.md
    env: str  # HEALTHCHECK_SSH_PORT
    field: str  # the field of the probe's Settings record: config.of(Settings).ssh_port
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


# What to do about a cause, and who can do it: every cause declares both, and every warn or fail
# check carries them (health+json, the healthcheck_probe_reason labels, the alert routes).
ACTIONS = ("none", "retry", "restart-app", "restart-container", "reset-gpu", "reboot-node",
           "service-hardware", "fix-config")
STATUSES = ("pass", "warn", "fail", "skip")  # "pass": a reason that is not a fault (action none)
# tenant: whoever runs the container (a notebook user, the pod's owner); operator: whoever runs the node.
ACTORS = ("tenant", "operator")


class Cause(Record):
    """One cause in the catalog. The remedy is written once, here: the docs table shows it as
    written (Markdown), a probe's message ends with it, backticks dropped (``probes.result.verdict``)."""

    reason: str
    status: str  # one of STATUSES
    cause: str
    remedy: str
    action: str  # one of ACTIONS
    actor: str  # one of ACTORS

    def __post_init__(self) -> None:
        for field, allowed in (("status", STATUSES), ("action", ACTIONS), ("actor", ACTORS)):
            if getattr(self, field) not in allowed:
                raise ValueError(f"cause {self.reason!r}: {field} {getattr(self, field)!r} is not one of "
                                 f"{', '.join(allowed)}")


def cause(reason: str, what: str, remedy: str, status: str = "fail", *, action: str, actor: str) -> Cause:
    """A cause row in the order the long tables read best: a failure unless ``status`` says otherwise."""
    return Cause(reason, status, what, remedy, action, actor)


def setting(env: str, kind: str, default: Any, meaning: str, **more: Any) -> Any:
    """One field of a ``Declared`` record: ``gpu_count: int = setting(...)``, typed ``Any`` so that
    the annotation is the field's type for mypy."""
    return Setting(env, "", kind, default, meaning, **more)


class Declared(Record):
    """A probe's settings, each field ``name: type = setting(...)``; ``SETTINGS`` holds their rows in
    order (a base's first), ``config.of(TheClass)`` the record of this run's values."""

    SETTINGS: ClassVar[tuple[Setting, ...]] = ()

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        rows = list(cls.SETTINGS)
        for name, value in list(vars(cls).items()):
            if isinstance(value, Setting):
                row = value._replace(field=name)
                setattr(cls, name, row)
                rows.append(row)
                cls._defaults = {**cls._defaults, name: row.default}
        cls.SETTINGS = tuple(rows)

    @classmethod
    def read(cls, values: Any) -> Self:
        return cls(**{row.field: values.get(row.field, row.default) for row in cls.SETTINGS})


class Spec(Record):
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
    follows: str = ""  # another probe's toggle: when this one's is not given, it takes that one's value
    dials: str = ""  # a port setting's field: the run connects there first (probes/cli.py, check)

    def load(self) -> ModuleType:
        return load(self.module)

    def requirements(self, config: Any) -> tuple[str, ...]:
        """The probes this one needs in this configuration (a module may decide by a setting)."""
        decide = getattr(self.load(), "requirements", None) if self.requires else None
        return tuple(decide(config)) if decide is not None else self.requires


def load(name: str) -> ModuleType:
    """The module ``name``; ``__import__`` waits for one that another thread is still importing."""
    __import__(name)
    return sys.modules[name]
