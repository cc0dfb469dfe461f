"""`healthcheck serve` (docs/serve.md): its settings, read by ``probes.serve.cli.load``, and the
causes of the checks it adds to a report."""

from __future__ import annotations

import ipaddress

from probes import spec
from probes.config import SPACE
from probes.hardware import xids
from probes.spec import BOOL, INTEGER, NUMBER, TEXT, cause, setting
from probes.untrusted import is_integer_text, is_number_text

PROFILES = spec.ALL_PROFILES
DEFAULT_PORT = 8779
DEFAULT_INTERVALS = {"startup": 5.0, "readiness": 15.0, "liveness": 10.0}
# Each run starts an interpreter: a shorter pause would only keep a core busy with runs.
MIN_INTERVAL, MAX_INTERVAL = 0.25, 86400.0
MIN_SAMPLE = 0.1  # seconds between clock-reason readings, or 0 (off): NVML is read this often at most
HOST_FORMS = ("an IPv4 or IPv6 address of this machine, e.g. 127.0.0.1 or ::1 (0.0.0.0 or :: for every "
              "interface), or localhost for 127.0.0.1")


def parse_address(text: str) -> str:
    """An address literal, never a name to resolve (its answer could change, or be every interface)."""
    if text.lower() == "localhost":
        return "127.0.0.1"
    try:
        if "%" not in text and ipaddress.ip_address(text):
            return text
    except ValueError:
        pass
    raise ValueError(f"is not an address to listen on (accepted: {HOST_FORMS})")


def parse_intervals(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in text.split(","):
        profile, _, seconds = (p.strip(SPACE) for p in part.rpartition("="))
        if profile not in ("", *PROFILES) or not is_number_text(seconds) or not (
                MIN_INTERVAL <= float(seconds) <= MAX_INTERVAL):
            raise ValueError(f"is not accepted (accepted: seconds, at least {MIN_INTERVAL:g} and at most "
                             f"{MAX_INTERVAL:g}, or profile=seconds,... for {', '.join(PROFILES)})")
        out.update(dict.fromkeys([profile] if profile else PROFILES, float(seconds)))
    return out


def parse_xids(text: str) -> frozenset[int]:
    if text.lower() == "none":
        return frozenset()
    values = [v.strip(SPACE) for v in text.split(",") if v.strip(SPACE)]
    if not values or not all(is_integer_text(v) and len(v) <= 4 and int(v) > 0 for v in values):
        raise ValueError("is not a list of Xids (accepted: comma-separated integers 1-9999, or none)")
    return frozenset(int(v) for v in values)


class ServeSettings(spec.Declared):
    host: str = setting(
        "HEALTHCHECK_SERVE_HOST", TEXT, "127.0.0.1",
        f"address to bind (`--host` wins): {HOST_FORMS}. Loopback only unless told otherwise (`0.0.0.0` or "
        "`::` as a pod's httpGet needs); no host name is resolved, and an address this machine does not "
        "have is a configuration error", parse=parse_address)
    port: int = setting("HEALTHCHECK_SERVE_PORT", INTEGER, DEFAULT_PORT,
                        "TCP port (`--port` wins; 0: a free one, logged). 9400 is avoided (dcgm-exporter), "
                        "as are 8888, 8787, 6006", low=0, high=65535, low_inclusive=True)
    intervals: dict[str, float] = setting(
        "HEALTHCHECK_SERVE_INTERVAL", TEXT, DEFAULT_INTERVALS,
        f"seconds between the end of one run and the next, at least {MIN_INTERVAL:g} (each run starts an "
        "interpreter); `15` sets every profile (`--interval` wins, profile by profile)",
        parse=parse_intervals, shown_default="`startup=5,readiness=15,liveness=10`")
    slack: float | None = setting(
        "HEALTHCHECK_SERVE_SLACK", NUMBER, None,
        "a result older than interval + slack is stale (503, reason `stale`)",
        low=0, high=MAX_INTERVAL, low_inclusive=True,
        shown_default="the profile's run deadline (`HEALTHCHECK_TIMEOUT` or its default) + 5")
    gating: bool = setting("HEALTHCHECK_SERVE_READINESS_GATING", BOOL, True,
                           "`false`: `/readyz` always answers 200, the body stays honest")
    deep: bool = setting("HEALTHCHECK_SERVE_DEEP", BOOL, True,
                         "`false`: the monitor skips `torch-cuda` in readiness and startup")
    xid_watch: bool | None = setting("HEALTHCHECK_SERVE_XID_WATCH", BOOL, None, "watch NVML Xid/ECC events",
                                     shown_default="the value of `ENABLE_GPU_CHECK`")
    xid_critical: frozenset[int] = setting(
        "HEALTHCHECK_XID_CRITICAL", TEXT, frozenset(filter(xids.latches, xids.CATALOG)),
        "Xids that latch unhealthy (`none` for none); replaces the default list", parse=parse_xids,
        shown_default="the catalog's GPU-reset and machine-restart Xids (see \"Xid policy\")")
    xid_application: frozenset[int] = setting(
        "HEALTHCHECK_XID_APPLICATION", TEXT,
        frozenset(x for x in xids.CATALOG if xids.bucket(x).severity == xids.APPLICATION),
        "warn only, never latch; an Xid in both lists is a configuration error", parse=parse_xids,
        shown_default="the catalog's RESTART_APP Xids")
    xid_ignore: frozenset[int] = setting(
        "HEALTHCHECK_XID_IGNORE", TEXT, frozenset(),
        "Xids only counted in metrics: never latched, never a warning (wins over the defaults; with an "
        "explicit list above, a configuration error)", parse=parse_xids, shown_default="unset")
    slowdown_sample: float = setting(
        "HEALTHCHECK_SERVE_SLOWDOWN_SAMPLE", NUMBER, 60.0,
        f"seconds between readings of each GPU's clock reasons, {MIN_SAMPLE:g} to 3600 (0: off); HW slowdown "
        "or power brake in 0.5 or more readings a minute over the last 10 minutes warns in readiness and "
        "startup (`nvml:slowdown`, reason `hw-slowdown-sustained`); one reading never does",
        low=0, high=3600, low_inclusive=True)
    python: str | None = setting("HEALTHCHECK_SERVE_PYTHON", TEXT, None,
                                 "interpreter for the monitor's `-m probes` runs",
                                 shown_default="the server's interpreter")


# The checks serve adds to a run's report: serve:result-age, xid:events, nvml:slowdown, latch:state.
PENDING = cause("pending", "the profile's first run since serve started has not finished",
                "wait for it (the startup probe covers this window)", action="retry", actor="tenant")
STALE = cause("stale", "no run of the profile has finished for longer than its interval + slack: a run is "
              "stuck (a wedged driver) or serve is", "see the log for the run; restart the container, and if "
              "runs stay stuck the node's operator checks the driver", action="restart-container",
              actor="tenant")
# Why a run gave no report (probes/serve/monitor.py names one).
RUN_FAILED = {c.reason: c for c in (
    cause("deadline", "the run gave no report by serve's deadline and was stopped", "a component is hung: "
          "see the log for the run, then the probe's own remedy", action="retry", actor="tenant"),
    cause("config-error", "the run exited 3: a setting serve passes on is not valid",
          "fix the `HEALTHCHECK_*` setting the log names", action="fix-config", actor="tenant"),
    cause("crashed", "the run was killed by a signal", "see the log; check the container's memory limit "
          "(an OOM kill is SIGKILL)", action="restart-container", actor="tenant"),
    cause("bad-exit", "the run exited with a status other than 0, 1 or 3 and no report",
          "see the log for its output", action="restart-container", actor="tenant"),
    cause("bad-output", "the run printed no valid health+json report", "see the log for its output",
          action="restart-container", actor="tenant"),
    cause("spawn-error", "serve cannot start the run's Python (`HEALTHCHECK_SERVE_PYTHON`)",
          "fix `HEALTHCHECK_SERVE_PYTHON` or the image", action="fix-config", actor="tenant"),
    cause("internal-error", "serve's monitor failed while it ran the profile", "see the log; restart the "
          "container", action="restart-container", actor="tenant"),
)}
XID_APPLICATION = cause("xid-<N>", "an application Xid (the catalog's RESTART_APP: the program's own fault) "
                        "in the last 10 minutes", "restart the application", "warn", action="restart-app",
                        actor="tenant")
XID_OTHER = cause("xid-<N>", "an Xid whose catalog action is neither a reset nor a reboot, in the last 10 "
                  "minutes", "see the Xid catalog's action in the message", "warn", action="none",
                  actor="operator")
SLOWDOWN = cause("hw-slowdown-sustained", "HW slowdown or power brake in 0.5 or more readings a minute over "
                 "10 minutes", "check the power supply and cooling", "warn", action="service-hardware",
                 actor="operator")
LATCHED_CUDA = cause("cuda-fatal", "a probe met a fatal CUDA error and latched the container unhealthy "
                     "(the reason is the probe's)", "restart the container (reset the GPU if it persists)",
                     action="restart-container", actor="tenant")
LATCHED_XID = cause("xid-<N>", "a critical Xid (the catalog's reset or reboot), or an uncorrectable ECC "
                    "event (`ecc-double`), latched the container unhealthy", "restart the container (reset "
                    "the GPU if it persists)", action="reset-gpu", actor="operator")
CAUSES = (PENDING, STALE, *RUN_FAILED.values(), XID_APPLICATION, XID_OTHER, SLOWDOWN, LATCHED_CUDA,
          LATCHED_XID)
