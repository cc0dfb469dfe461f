"""Configuration: flags over environment over defaults, every value validated up front
(docs/probes.md, "Configuration")."""

from __future__ import annotations

import math
import os
import types

from probes import registry, spec
from probes.deadlines import FRONT_DOOR_GRACE
from probes.record import Record
from probes.spec import ALL_PROFILES, PROFILE_RULES, Declared, Setting, setting
from probes.untrusted import NUMBER_FORM, clean, is_integer_text, is_number_text

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, TypeVar

    from probes.spec import Profile, Spec

    D = TypeVar("D", bound=Declared)

DEFAULT_PROFILE = "readiness"
TRUE = ("true", "1", "yes", "on")
FALSE = ("false", "0", "no", "off")


class ConfigError(ValueError):
    """A usage or configuration error: one line naming what is wrong and what is accepted, exit 3."""


SPACE = " \t\n\r\f\v"  # the whitespace stripped around a value: ASCII only, as the front door's
MAX_VALUE = 4096  # characters of any value, surrounding whitespace included
MAX_TEXT_BYTES = 4095  # PATH_MAX less its NUL: no path, command or URL path setting is longer
MAX_NAME_BYTES = 255  # NAME_MAX: one component of a path
MAX_HOST = 253  # a DNS name's limit
HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:%[]")


def shown(value: object) -> str:
    """A bad value as an error line shows it: quoted, invisible characters as escapes, short."""
    return f"'{clean(value, 40)}'"


def _refuse(name: str, raw: str, why: str) -> ConfigError:
    return ConfigError(f"{name}={shown(raw)} {why}")


def _bounded(name: str, raw: str) -> str:
    if len(raw) > MAX_VALUE:
        raise _refuse(name, raw, f"is too long: {len(raw)} characters (accepted: at most {MAX_VALUE})")
    return raw.strip(SPACE)


def parse_bool(name: str, raw: str) -> bool:
    v = _bounded(name, raw).lower()
    if v in TRUE or v in FALSE:
        return v in TRUE
    raise _refuse(name, raw, "is not a boolean (accepted: true/false, 1/0, yes/no, on/off)")


def parse_number(name: str, raw: str, *, low: float, high: float, low_inclusive: bool = False,
                 integer: bool = False) -> float:
    text = _bounded(name, raw)
    kind = "an integer" if integer else "a number"
    bound = f"{'at least' if low_inclusive else 'greater than'} {low:g} and at most {high:g}"
    if not (is_integer_text(text) if integer else is_number_text(text)):
        raise _refuse(name, raw, f"is not {kind} (accepted: {'digits' if integer else NUMBER_FORM}, {bound})")
    # More whole digits than any bound has is out of range before int() reads them (it refuses a
    # text past Python's int-string limit); fraction digits past 30 cannot change a setting.
    whole, _, frac = text.partition(".")
    whole = whole.lstrip("0") or "0"
    value = math.inf if len(whole) > 30 else int(whole) if integer else float(f"{whole}.{frac[:30] or '0'}")
    if not (math.isfinite(value) and (value >= low if low_inclusive else value > low) and value <= high):
        raise _refuse(name, raw, f"is out of range (accepted: {kind} {bound})")
    return value


def parse_port(name: str, raw: str) -> int:
    text = _bounded(name, raw)
    if not (is_integer_text(text) and len(text) <= 5 and 1 <= int(text) <= 65535):
        raise _refuse(name, raw, "is not a port number (accepted: an integer 1-65535)")
    return int(text)


def parse_choice(name: str, raw: str, choices: Sequence[str]) -> str:
    v = _bounded(name, raw)
    if v not in choices:
        raise _refuse(name, raw, f"is not accepted (accepted: {', '.join(choices)})")
    return v


def parse_names(flag: str, raw: str, known: Sequence[str]) -> tuple[str, ...]:
    accepted = clean(", ".join(known), 200)
    names = tuple(n.strip(SPACE) for n in raw.split(",") if n.strip(SPACE))
    if not names:
        raise ConfigError(f"{flag} {shown(raw)} names no probe (accepted: {accepted})")
    for n in names:
        if n not in known:
            raise ConfigError(f"{flag}: unknown probe {shown(n)} (accepted: {accepted})")
    return names


def os_bytes(value: str) -> bytes:
    """The bytes the system holds for ``value`` (the environment was decoded in the locale's encoding)."""
    try:
        return os.fsencode(value)
    except UnicodeEncodeError:  # not from the environment: a caller's own text
        return value.encode("utf-8", "surrogatepass")


def parse_text(name: str, raw: str) -> str:
    """One word of printable characters, judged as its bytes spell it: UTF-8 where they are (under a
    Latin-1 locale Python reads '€' with a control character), else the locale's reading; kept as
    Python read it, so the system is given the same bytes back."""
    v = _bounded(name, raw)
    try:
        written = os_bytes(v).decode("utf-8")
    except UnicodeDecodeError:
        written = v
    if not v or any(not ch.isprintable() or ch.isspace() for ch in written):
        raise _refuse(name, raw, "is not accepted (accepted: a non-empty value without spaces)")
    if len(os_bytes(v)) > MAX_TEXT_BYTES:
        raise _refuse(name, raw, f"is too long (accepted: at most {MAX_TEXT_BYTES} bytes)")
    return v


def parse_host(name: str, raw: str) -> str:
    """In ASCII: a name is resolved as bytes (no IDNA), and an HTTP Host header carries only ASCII."""
    v = parse_text(name, raw)
    if len(v) > MAX_HOST or any(ch not in HOST_CHARS for ch in v):
        raise _refuse(name, raw, "is not a host (accepted: an IP address or a host name in ASCII: letters, "
                                 f"digits, '.', '-', '_', ':', at most {MAX_HOST} characters)")
    return v


def parse_absolute_path(name: str, raw: str) -> str:
    v = parse_text(name, raw)
    if not v.startswith("/"):
        raise _refuse(name, raw, "is not an absolute path (accepted: a path starting with /)")
    if any(len(part) > MAX_NAME_BYTES for part in os_bytes(v).split(b"/")):
        raise _refuse(name, raw, f"has a path component longer than {MAX_NAME_BYTES} bytes "
                                 "(accepted: an absolute path the system can open)")
    return v


def parse_base_url(name: str, raw: str) -> str:
    v = parse_text(name, raw)
    if not v.startswith("/"):
        raise _refuse(name, raw, "is not a URL path (accepted: a path starting with /, e.g. /lab/)")
    return v if v.endswith("/") else v + "/"


class Globals(Declared):  # the suite's own settings
    profile: str = setting("HEALTHCHECK_PROFILE", spec.CHOICE, DEFAULT_PROFILE,
                           "`startup`, `readiness` or `liveness` (`--profile` wins)", choices=ALL_PROFILES)
    timeout: float = setting(
        "HEALTHCHECK_TIMEOUT", spec.NUMBER, None, "whole-run deadline in seconds, digits with an optional "
        f"fraction (0 < t <= 3600); the front door kills the run {FRONT_DOOR_GRACE} s later",
        low=0, high=3600,
        shown_default="per profile: " + " / ".join(f"{p.timeout:g}" for p in PROFILE_RULES.values()))
    host: str = setting("HEALTHCHECK_HOST", spec.HOST, "127.0.0.1", "where the services (Jupyter, sshd) are "
                        "probed: an IP address (`::1` works) or an ASCII host name")
    state_dir: str | None = setting(
        "HEALTHCHECK_STATE_DIR", spec.ABSOLUTE_PATH, None, "cache, locks, latch (an absolute path); made "
        "0700, a symlink, a foreign directory or one below a directory another user can change is refused "
        "(caching off); see \"Runs anywhere\" in docs/kubernetes.md",
        shown_default="the first usable of `/run/healthcheck`, `$XDG_RUNTIME_DIR/healthcheck`, "
                      "`$TMPDIR/healthcheck-<uid>`, `/tmp/healthcheck-<uid>`, "
                      "`/dev/shm/healthcheck-<uid>` (each of the last three, when another user "
                      "took the name first: the suite's own `<name>.<time><random>` beside it); "
                      "none: caching off")
    log_file: str | None = setting("HEALTHCHECK_LOG_FILE", spec.ABSOLUTE_PATH, None, "one line per run plus "
                                   "error details (an absolute path); rotated at 1 MiB (one backup); a "
                                   "regular file only (see below)", shown_default="unset")
    checks_dir: str = setting("HEALTHCHECK_CHECKS_DIR", spec.ABSOLUTE_PATH, "/etc/healthcheck.d",
                              "drop-in checks (an absolute path): every executable file there is a check "
                              "(see \"Drop-in checks\")")
    notices: bool = setting("HEALTHCHECK_NOTICES", spec.BOOL, True,
                            "tell the person at the keyboard: a line in the container's log when the verdict "
                            "changes, the notice shown at an SSH login and in a notebook's first cell "
                            "(docs/image.md, \"Notices\"); `false` turns all three off")
    notice_file: str = setting("HEALTHCHECK_NOTICE_FILE", spec.ABSOLUTE_PATH,
                               "/run/healthcheck-notice/notice", "the published notice (an absolute path), "
                               "world-readable in a directory of the suite's user (0755); the login and "
                               "notebook readers read this one file")


GLOBAL_SETTINGS = Globals.SETTINGS

# Read outside the suite's configuration (the front door): listed in docs/probes.md.
OTHER_SETTINGS = (
    Setting("HEALTHCHECK_PYTHON", "", spec.TEXT, None,
            "the suite's own interpreter (front door only; one that cannot run the suite is exit 3)",
            shown_default="the `.venv` beside the `healthcheck` script"),
    Setting("HEALTHCHECK_DEBUG", "", spec.TEXT, None, "trace the front door (`set -x`)",
            shown_default="unset"),
)


class Config(Globals):
    """The global settings as attributes, a probe's declared ones as ``config.of(Settings).ssh_port``;
    ``Config(**fields)`` and ``_replace`` take a declared setting's ``field`` too."""

    timeout: float = PROFILE_RULES[DEFAULT_PROFILE].timeout
    json: bool = False
    verbose: bool = False
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    toggles: Mapping[str, bool] = types.MappingProxyType({})
    dropins: tuple[Spec, ...] = ()
    values: Mapping[str, Any] = types.MappingProxyType({})  # the declared settings', by field

    def __init__(self, **fields: Any) -> None:
        known = {row[0] for row in registry.DECLARED.values()}
        values = dict(fields.pop("values", {}))  # a setting not given here is its declared default
        values.update({name: fields.pop(name) for name in [*fields] if name in known})
        Record.__init__(self, **fields, values=types.MappingProxyType(values))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Config is immutable: use _replace()")

    @property
    def profile_rules(self) -> Profile:
        return PROFILE_RULES[self.profile]

    def of(self, kind: type[D]) -> D:
        return kind.read(self.values)

    def enabled(self, probe: Spec | registry.Entry) -> bool:
        if self.profile not in probe.profiles:
            return False
        if self.only:
            return probe.name in self.only
        return probe.name not in self.skip and self.toggles.get(probe.toggle, default_on(probe, self.values))

    def selected(self) -> list[Spec]:
        return [*(e.spec() for e in registry.ENTRIES if self.enabled(e)),
                *(s for s in self.dropins if self.enabled(s))]


def default_on(probe: Spec | registry.Entry, values: Mapping[str, Any]) -> bool:
    """Whether a probe runs when its toggle is not given: an opt-in one when its ``on_with`` setting is."""
    return probe.default_on or bool(probe.on_with and values.get(probe.on_with) is not None)


def parse_setting(row: Setting, raw: str) -> Any:
    name, kind = row.env, row.kind
    if kind in (spec.NUMBER, spec.INTEGER):
        return parse_number(name, raw, low=row.low, high=row.high, low_inclusive=row.low_inclusive,
                            integer=kind == spec.INTEGER)
    if kind == spec.CHOICE:
        return parse_choice(name, raw, row.choices)
    parse = {spec.BOOL: parse_bool, spec.PORT: parse_port, spec.URL_PATH: parse_base_url,
             spec.HOST: parse_host, spec.ABSOLUTE_PATH: parse_absolute_path}.get(kind, parse_text)
    value = parse(name, raw)
    if row.parse is None:
        return value
    try:
        return row.parse(value)
    except ValueError as exc:
        raise _refuse(name, raw, str(exc)) from None


def load(environ: Mapping[str, str] | None = None, *, profile: str | None = None,
         json: bool = False, verbose: bool = False, only: str | None = None,
         skip: str | None = None) -> Config:
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {"json": json, "verbose": verbose}
    if profile is not None:  # the flag wins: HEALTHCHECK_PROFILE is not read
        values["profile"] = parse_choice("--profile", profile, ALL_PROFILES)
    for row in GLOBAL_SETTINGS:
        if row.field not in values:
            raw = env.get(row.env)
            values[row.field] = parse_setting(row, raw) if raw else row.default
    for name, declared in registry.DECLARED.items():  # a probe's own
        raw = env.get(name)
        values[declared[0]] = parse_setting(registry.setting(name), raw) if raw else declared[-1]
    if values["timeout"] is None:
        values["timeout"] = PROFILE_RULES[values["profile"]].timeout
    found: tuple[Spec, ...] = ()
    if os.path.lexists(values["checks_dir"]):  # none (the image has none): nothing of drop-ins is imported
        from probes import dropins

        owners = {t: "the built-in " + ", ".join(e.name for e in registry.ENTRIES if e.toggle == t)
                  for t in registry.TOGGLES}
        found = dropins.specs(values["checks_dir"], frozenset(registry.NAMES), owners)
    defaults = {t: any(default_on(e, values) for e in registry.ENTRIES if e.toggle == t)
                for t in registry.TOGGLES}
    # A probe that ``follows`` another's toggle is on by default only where that one is on
    # (ENABLE_SSH_CHECK=false turns the SSH login off too, unless its own toggle is given).
    follows = {e.toggle: e.follows for e in registry.ENTRIES if e.follows}
    toggles: dict[str, bool] = {}
    for t in sorted((*registry.TOGGLES, *(s.toggle for s in found)), key=lambda t: t in follows):
        default = defaults.get(t, True) and toggles.get(follows.get(t, ""), True)
        toggles[t] = parse_bool(t, env[t]) if env.get(t) else default
    known = (*registry.NAMES, *(s.name for s in found))
    values.update(
        toggles=types.MappingProxyType(toggles), dropins=found,
        only=parse_names("--only", only, known) if only is not None else (),
        skip=parse_names("--skip", skip, known) if skip is not None else (),
    )
    return Config(**values)
