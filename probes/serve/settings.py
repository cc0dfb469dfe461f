"""Settings of `healthcheck serve`: flags override environment, environment overrides defaults.

Every value is validated up front; a bad one raises probes.config.ConfigError (exit 3).
The probe settings themselves (HEALTHCHECK_TIMEOUT, ENABLE_*, ...) are validated
too, so a typo fails at start instead of in every scheduled run.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping

from probes import config as cfg
from probes.deadlines import SERVE_RUN_GRACE
from probes.hardware import xids
from probes.numbers import is_integer_text

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEFAULT_HOST = "127.0.0.1"
# 9400 is dcgm-exporter's, 8888 Jupyter's, 8787 Dask's and RStudio's, 6006 TensorBoard's.
DEFAULT_PORT = 8779
# Seconds between the end of one run of a profile and the start of the next.
DEFAULT_INTERVALS = {"startup": 5.0, "readiness": 15.0, "liveness": 10.0}
# From NVIDIA's Xid catalog (probes.hardware.xids): the Xids whose immediate action resets the GPU
# or restarts the machine latch; those whose action is RESTART_APP (the application's errors,
# possibly another tenant's) warn for a while. The rest of the catalog is not in either list:
# IGNORE is counted only, every other action warns with what the catalog says to do.
DEFAULT_XID_CRITICAL = tuple(sorted(x for x in xids.CATALOG if xids.bucket(x).severity == xids.CRITICAL))
DEFAULT_XID_APPLICATION = tuple(sorted(x for x in xids.CATALOG
                                       if xids.bucket(x).severity == xids.APPLICATION))
MAX_INTERVAL = 86400.0
# Each run starts a Python interpreter (about 0.1 s of CPU): a shorter pause would keep a core
# busy with runs back to back and change nothing a probe could see.
MIN_INTERVAL = 0.25
# What HEALTHCHECK_SERVE_HOST and --host accept: an address bound as written, never a name to
# resolve (its answer could change, or be every interface).
HOST_FORMS = ("an IPv4 or IPv6 address of this machine, e.g. 127.0.0.1 or ::1 (0.0.0.0 or :: for every "
              "interface), or localhost for 127.0.0.1")
MAX_HOST = 45  # characters of the longest IPv6 literal
# The NVML watcher reads each GPU's clock event reasons this often; a reading with HW slowdown
# or power brake is one slowdown event, judged by rate over a window (probes.serve.xid).
DEFAULT_SLOWDOWN_SAMPLE = 60.0
MIN_SLOWDOWN_SAMPLE = 0.1  # or 0 (off): NVML is read this often at most


@dataclasses.dataclass(frozen=True)
class Settings:
    host: str = DEFAULT_HOST
    host_from: str = "HEALTHCHECK_SERVE_HOST"  # where the host came from, for an error that names it
    port: int = DEFAULT_PORT
    intervals: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(DEFAULT_INTERVALS))
    # Per profile: a result older than interval + slack is stale (503, reason "stale").
    slack: Mapping[str, float] = dataclasses.field(default_factory=dict)
    deadlines: Mapping[str, float] = dataclasses.field(default_factory=dict)  # monitor's, per run
    readiness_gating: bool = True
    deep: bool = True
    xid_watch: bool = True
    xid_critical: frozenset[int] = frozenset(DEFAULT_XID_CRITICAL)
    xid_application: frozenset[int] = frozenset(DEFAULT_XID_APPLICATION)
    xid_ignore: frozenset[int] = frozenset()  # counted only: never latched, never a warning
    slowdown_sample: float = DEFAULT_SLOWDOWN_SAMPLE  # seconds between clock-reason readings (0: off)
    python: str = sys.executable
    state_dir: str | None = None
    log_file: str | None = None

    def stale_after(self, profile: str) -> float:
        return self.intervals[profile] + self.slack[profile]


def parse_serve_port(name: str, raw: str) -> int:
    """A TCP port, or 0 for a free one chosen by the kernel (it is logged and kept in serve.json)."""
    if raw.strip(cfg.SPACE) == "0":
        return 0
    return cfg.parse_port(name, raw)


def parse_host(name: str, raw: str) -> str:
    """An address literal to listen on (HOST_FORMS); ``localhost`` is 127.0.0.1."""
    import ipaddress

    text = raw.strip(cfg.SPACE)
    if text.lower() == "localhost":
        return DEFAULT_HOST
    try:
        address = ipaddress.ip_address(text) if len(text) <= MAX_HOST and "%" not in text else None
    except ValueError:
        address = None
    if address is None:
        raise cfg.ConfigError(
            f"{name}={cfg.shown(raw)} is not an address to listen on (accepted: {HOST_FORMS})")
    return text


def parse_interval(name: str, raw: str) -> float:
    return cfg.parse_number(name, raw, low=MIN_INTERVAL, high=MAX_INTERVAL, low_inclusive=True)


def parse_sample(name: str, raw: str) -> float:
    """Seconds between clock-reason readings: 0 (off), or MIN_SLOWDOWN_SAMPLE to 3600."""
    seconds = cfg.parse_number(name, raw, low=0, high=3600, low_inclusive=True)
    if 0 < seconds < MIN_SLOWDOWN_SAMPLE:
        raise cfg.ConfigError(f"{name}={cfg.shown(raw)} is too short (accepted: 0 for off, or seconds "
                              f"from {MIN_SLOWDOWN_SAMPLE:g} to 3600)")
    return seconds


def parse_intervals(name: str, raw: str) -> dict[str, float]:
    """``15`` (every profile) or ``readiness=15,liveness=5`` (those profiles), or both mixed."""
    out: dict[str, float] = {}
    parts = [p.strip(cfg.SPACE) for p in raw.split(",") if p.strip(cfg.SPACE)]
    if not parts:
        raise cfg.ConfigError(f"{name}={cfg.shown(raw)} is empty (accepted: seconds, or profile=seconds,...)")
    for part in parts:
        prof, sep, value = part.partition("=")
        if not sep:
            seconds = parse_interval(name, part)
            out.update({p: seconds for p in cfg.PROFILES})
            continue
        prof = cfg.parse_choice(name, prof, cfg.PROFILES)
        out[prof] = parse_interval(f"{name} {prof}", value)
    return out


def parse_xids(name: str, raw: str) -> frozenset[int]:
    """Comma-separated Xid numbers, or ``none`` for an empty list."""
    if raw.strip(cfg.SPACE).lower() == "none":
        return frozenset()
    values = [v.strip(cfg.SPACE) for v in raw.split(",") if v.strip(cfg.SPACE)]
    if not values:
        raise cfg.ConfigError(f"{name}={cfg.shown(raw)} lists no Xid (accepted: numbers like 48,79 or none)")
    out = set()
    for v in values:
        # isdigit() alone accepts '\u00b2', which int() refuses.
        if not is_integer_text(v) or len(v) > 4 or not 1 <= int(v) <= 9999:
            raise cfg.ConfigError(
                f"{name}: {cfg.shown(v)} is not an Xid number "
                "(accepted: comma-separated integers 1-9999, or none)")
        out.add(int(v))
    return frozenset(out)


def _env(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name)
    return None if raw is None or raw == "" else raw


def load(environ: Mapping[str, str] | None = None, *, host: str | None = None, port: str | None = None,
         interval: str | None = None) -> Settings:
    env = os.environ if environ is None else environ
    # The probe configuration of every profile the monitor runs: validated now.
    probe_cfgs = {p: cfg.load(env, profile=p) for p in cfg.PROFILES}

    def read(name: str, parse: Callable[[str, str], Any], default: Any) -> Any:
        raw = _env(env, name)
        return default if raw is None else parse(name, raw)

    host_from = "--host" if host is not None else "HEALTHCHECK_SERVE_HOST"
    raw = host if host is not None else _env(env, "HEALTHCHECK_SERVE_HOST")
    h = parse_host(host_from, raw) if raw is not None else DEFAULT_HOST
    if port is not None:
        prt = parse_serve_port("--port", port)
    else:
        prt = read("HEALTHCHECK_SERVE_PORT", parse_serve_port, DEFAULT_PORT)
    intervals = {**DEFAULT_INTERVALS, **read("HEALTHCHECK_SERVE_INTERVAL", parse_intervals, {})}
    if interval is not None:
        intervals.update(parse_intervals("--interval", interval))

    deadlines = {p: probe_cfgs[p].timeout + SERVE_RUN_GRACE for p in cfg.PROFILES}
    raw = _env(env, "HEALTHCHECK_SERVE_SLACK")
    if raw is not None:
        s = cfg.parse_number("HEALTHCHECK_SERVE_SLACK", raw, low=0, high=MAX_INTERVAL, low_inclusive=True)
        slack = {p: s for p in cfg.PROFILES}
    else:
        # By default a result goes stale only when a run overran the monitor's deadline:
        # a slow but working run never turns readiness off by itself.
        slack = dict(deadlines)

    crit, app, ign = "HEALTHCHECK_XID_CRITICAL", "HEALTHCHECK_XID_APPLICATION", "HEALTHCHECK_XID_IGNORE"
    lists = {crit: read(crit, parse_xids, frozenset(DEFAULT_XID_CRITICAL)),
             app: read(app, parse_xids, frozenset(DEFAULT_XID_APPLICATION)),
             ign: read(ign, parse_xids, frozenset())}
    # A default list may hold an ignored Xid; a list given explicitly may not.
    for one, other in ((crit, app), (crit, ign), (app, ign)):
        both = lists[one] & lists[other]
        if both and (other != ign or _env(env, one) is not None):
            raise cfg.ConfigError(f"Xid {min(both)} is in both {one} and {other} "
                                  "(accepted: each Xid in one list at most)")
    # An ignored Xid leaves the default lists (HEALTHCHECK_XID_IGNORE=79 stops 79 from latching).
    ignore = lists[ign]
    critical, application = lists[crit] - ignore, lists[app] - ignore
    sample = read("HEALTHCHECK_SERVE_SLOWDOWN_SAMPLE", parse_sample, DEFAULT_SLOWDOWN_SAMPLE)
    python = read("HEALTHCHECK_SERVE_PYTHON", cfg.parse_text, sys.executable)
    gpu_on = probe_cfgs["readiness"].toggles.get("ENABLE_GPU_CHECK", True)
    return Settings(
        host=h, host_from=host_from, port=prt, intervals=intervals, slack=slack, deadlines=deadlines,
        readiness_gating=read("HEALTHCHECK_SERVE_READINESS_GATING", cfg.parse_bool, True),
        deep=read("HEALTHCHECK_SERVE_DEEP", cfg.parse_bool, True),
        # Default: watch whenever the GPU checks are on; an explicit value decides alone.
        xid_watch=read("HEALTHCHECK_SERVE_XID_WATCH", cfg.parse_bool, bool(gpu_on)),
        xid_critical=critical, xid_application=application, xid_ignore=ignore, slowdown_sample=sample,
        python=python,
        state_dir=probe_cfgs["readiness"].state_dir, log_file=probe_cfgs["readiness"].log_file,
    )
