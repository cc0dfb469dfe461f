"""Configuration: flags override environment, environment overrides defaults.

Every value is validated up front; a bad one raises ConfigError with one line that
names the variable or flag, the bad value and what is accepted (exit status 3).
"""

from __future__ import annotations

import math
import os
import types
from collections.abc import Mapping, Sequence
from typing import Callable, NamedTuple, TypeVar

from probes import registry
from probes.untrusted import clean

T = TypeVar("T")

PROFILES = registry.ALL_PROFILES
DEFAULT_PROFILE = "readiness"
# Whole-run deadline per profile when HEALTHCHECK_TIMEOUT is unset. Kept below the
# Docker HEALTHCHECK --timeout and the Kubernetes timeoutSeconds that run them.
PROFILE_TIMEOUTS = {"startup": 60.0, "readiness": 25.0, "liveness": 10.0}
MAX_TIMEOUT = 3600.0
TRUE = ("true", "1", "yes", "on")
FALSE = ("false", "0", "no", "off")


class ConfigError(ValueError):
    """A usage or configuration error: one line, exit status 3."""


# The grammar the suite and the front door (./healthcheck) both read, so that they agree on
# the whole-run budget and the profile for every value: surrounding ASCII whitespace (and
# only that), then ASCII digits with an optional fraction. No sign, exponent, underscore,
# inf/nan or non-ASCII digits (int() and float() take '\u0663' or '1_0'; bash does not).
SPACE = " \t\n\r\f\v"
DIGITS = frozenset("0123456789")
NUMBER_FORM = "digits with an optional fraction, e.g. 25 or 2.5"


def shown(value: object) -> str:
    """A bad value as it may appear in an error line: quoted, invisible characters as escapes, short."""
    return f"'{clean(value, 40)}'"


def is_integer_text(text: str) -> bool:
    return bool(text) and all(ch in DIGITS for ch in text)


def is_number_text(text: str) -> bool:
    whole, dot, frac = text.partition(".")
    if frac and not is_integer_text(frac):
        return False
    return is_integer_text(whole) or (not whole and bool(dot) and bool(frac))


def parse_bool(name: str, raw: str) -> bool:
    v = raw.strip(SPACE).lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise ConfigError(f"{name}={shown(raw)} is not a boolean (accepted: true/false, 1/0, yes/no, on/off)")


def parse_number(name: str, raw: str, *, low: float, high: float, low_inclusive: bool = False,
                 integer: bool = False) -> float:
    kind = "an integer" if integer else "a number"
    bound = f"{'at least' if low_inclusive else 'greater than'} {low:g} and at most {high:g}"
    text = raw.strip(SPACE)
    if not (is_integer_text(text) if integer else is_number_text(text)):
        form = "digits" if integer else NUMBER_FORM
        raise ConfigError(f"{name}={shown(raw)} is not {kind} (accepted: {form}, {bound})")
    value = int(text) if integer else float(text)
    ok = math.isfinite(value) and (value >= low if low_inclusive else value > low) and value <= high
    if not ok:
        raise ConfigError(f"{name}={shown(raw)} is out of range (accepted: {kind} {bound})")
    return value


def parse_port(name: str, raw: str) -> int:
    text = raw.strip(SPACE)
    value = int(text) if is_integer_text(text) and len(text) <= 5 else -1
    if not 1 <= value <= 65535:
        raise ConfigError(f"{name}={shown(raw)} is not a port number (accepted: an integer 1-65535)")
    return value


def parse_choice(name: str, raw: str, choices: Sequence[str]) -> str:
    v = raw.strip(SPACE)
    if v not in choices:
        raise ConfigError(f"{name}={shown(raw)} is not accepted (accepted: {', '.join(choices)})")
    return v


def parse_names(flag: str, raw: str) -> tuple[str, ...]:
    names = tuple(n.strip(SPACE) for n in raw.split(",") if n.strip(SPACE))
    if not names:
        raise ConfigError(f"{flag} {shown(raw)} names no probe (accepted: {', '.join(registry.NAMES)})")
    for n in names:
        if n not in registry.BY_NAME:
            raise ConfigError(f"{flag}: unknown probe {shown(n)} (accepted: {', '.join(registry.NAMES)})")
    return names


def parse_text(name: str, raw: str) -> str:
    v = raw.strip(SPACE)
    if not v or any(not ch.isprintable() or ch.isspace() for ch in v):
        raise ConfigError(f"{name}={shown(raw)} is not accepted (accepted: a non-empty value without spaces)")
    return v


def parse_base_url(name: str, raw: str) -> str:
    v = parse_text(name, raw)
    if not v.startswith("/"):
        raise ConfigError(
            f"{name}={shown(raw)} is not a URL path (accepted: a path starting with /, e.g. /lab/)")
    return v if v.endswith("/") else v + "/"


ALL_ON: Mapping[str, bool] = types.MappingProxyType(dict.fromkeys(registry.TOGGLES, True))


class Config(NamedTuple):
    """The validated settings of one run (``cfg._replace(...)`` derives another)."""

    profile: str = DEFAULT_PROFILE
    timeout: float = PROFILE_TIMEOUTS[DEFAULT_PROFILE]
    json: bool = False
    verbose: bool = False
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    toggles: Mapping[str, bool] = ALL_ON
    host: str = "127.0.0.1"
    jupyter_port: int = 8888
    jupyter_base_url: str = "/"
    jupyter_runtime_dir: str | None = None
    ssh_port: int = 22
    gpu_count: int = 1
    torch_device: str = "cuda"
    torch_python: str = "python3"
    torch_ttl: float = 300.0
    state_dir: str | None = None
    log_file: str | None = None

    def enabled(self, spec: registry.Spec) -> bool:
        """Whether a probe runs in this configuration (flags override the toggles)."""
        if self.profile not in spec.profiles:
            return False
        if self.only:
            return spec.name in self.only
        if spec.name in self.skip:
            return False
        return bool(self.toggles.get(spec.toggle, True))

    def selected(self) -> list[registry.Spec]:
        return [s for s in registry.PROBES if self.enabled(s)]


def _env(environ: Mapping[str, str], name: str, parse: Callable[[str, str], T], default: T) -> T:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    return parse(name, raw)


def load(environ: Mapping[str, str] | None = None, *, profile: str | None = None,
         json: bool = False, verbose: bool = False, only: str | None = None,
         skip: str | None = None) -> Config:
    """Build the configuration from flags (keyword arguments) and the environment."""
    env = os.environ if environ is None else environ
    if profile is not None:
        prof = parse_choice("--profile", profile, PROFILES)
    else:
        prof = _env(env, "HEALTHCHECK_PROFILE", lambda n, r: parse_choice(n, r, PROFILES), DEFAULT_PROFILE)
    toggles = {t: _env(env, t, parse_bool, True) for t in registry.TOGGLES}
    timeout = _env(env, "HEALTHCHECK_TIMEOUT",
                   lambda n, r: parse_number(n, r, low=0, high=MAX_TIMEOUT), PROFILE_TIMEOUTS[prof])
    return Config(
        profile=prof,
        timeout=timeout,
        json=json,
        verbose=verbose,
        only=parse_names("--only", only) if only is not None else (),
        skip=parse_names("--skip", skip) if skip is not None else (),
        toggles=types.MappingProxyType(toggles),
        host=_env(env, "HEALTHCHECK_HOST", parse_text, "127.0.0.1"),
        jupyter_port=_env(env, "HEALTHCHECK_JUPYTER_PORT", parse_port, 8888),
        jupyter_base_url=_env(env, "HEALTHCHECK_JUPYTER_BASE_URL", parse_base_url, "/"),
        jupyter_runtime_dir=_env(env, "HEALTHCHECK_JUPYTER_RUNTIME_DIR", parse_text, None),
        ssh_port=_env(env, "HEALTHCHECK_SSH_PORT", parse_port, 22),
        gpu_count=int(_env(env, "HEALTHCHECK_GPU_COUNT",
                           lambda n, r: parse_number(n, r, low=0, high=1024, low_inclusive=True,
                                                     integer=True), 1.0)),
        torch_device=_env(env, "HEALTHCHECK_TORCH_DEVICE", lambda n, r: parse_choice(n, r, ("cuda", "cpu")),
                          "cuda"),
        torch_python=_env(env, "HEALTHCHECK_TORCH_PYTHON", parse_text, "python3"),
        torch_ttl=_env(env, "HEALTHCHECK_TORCH_TTL",
                       lambda n, r: parse_number(n, r, low=0, high=86400, low_inclusive=True), 300.0),
        state_dir=_env(env, "HEALTHCHECK_STATE_DIR", parse_text, None),
        log_file=_env(env, "HEALTHCHECK_LOG_FILE", parse_text, None),
    )
