"""`healthcheck serve`: settings, logging, start-up, and a stop that ends every descendant (docs/serve.md)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from probes import config as cfg
from probes import logfile, proc
from probes.config import ConfigError
from probes.deadlines import SERVE_RUN_GRACE
from probes.runner import SIGNAL_POLL
from probes.serve import DEFAULT_INTERVALS, HOST_FORMS, MIN_SAMPLE, PROFILES, ServeSettings
from probes.serve.monitor import Monitor
from probes.state import State
from probes.untrusted import clean

log = logging.getLogger("healthcheck.serve")
FLAGS = {"host": "--host", "port": "--port", "intervals": "--interval"}  # a setting's field: its flag
ROWS = {row.field: row for row in ServeSettings.SETTINGS}
XID_LISTS = ("xid_critical", "xid_application", "xid_ignore")


def load(environ: Mapping[str, str] | None = None, **flags: str | None
         ) -> tuple[ServeSettings, dict[str, cfg.Config]]:
    """serve's settings (flags by field; intervals merge profile by profile) and the probes'
    configuration of each profile, all validated now: a typo fails at start, not in every run."""
    env = os.environ if environ is None else environ
    configs = {p: cfg.load(env, profile=p) for p in PROFILES}
    values: dict[str, Any] = {}
    for row in ServeSettings.SETTINGS:
        raw, flag = env.get(row.env), flags.get(row.field)
        values[row.field] = cfg.parse_setting(row, raw) if raw else row.default
        if flag is not None:
            given = cfg.parse_setting(row._replace(env=FLAGS[row.field]), flag)
            values[row.field] = {**values[row.field], **given} if row.field == "intervals" else given
    values["intervals"] = {**DEFAULT_INTERVALS, **values["intervals"]}
    if 0 < values["slowdown_sample"] < MIN_SAMPLE:
        name = ROWS["slowdown_sample"].env
        raise ConfigError(f"{name}={cfg.shown(env[name])} is too short (accepted: 0 for off, or seconds from "
                          f"{MIN_SAMPLE:g} to 3600)")
    for i, one in enumerate(XID_LISTS):
        for other in XID_LISTS[i + 1:]:
            both = values[one] & values[other]
            # A default list may hold an ignored Xid; a list given explicitly may not.
            if both and (other != "xid_ignore" or env.get(ROWS[one].env)):
                raise ConfigError(f"Xid {min(both)} is in both {ROWS[one].env} and {ROWS[other].env} "
                                  "(accepted: each Xid in one list at most)")
    for name in XID_LISTS[:2]:
        values[name] -= values["xid_ignore"]  # HEALTHCHECK_XID_IGNORE=79 stops 79 from latching
    if values["xid_watch"] is None:  # whenever the GPU checks are on
        values["xid_watch"] = configs["readiness"].toggles.get("ENABLE_GPU_CHECK", True)
    return ServeSettings.read(values), configs


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"serve: {message} (see healthcheck serve --help)")


def parser() -> argparse.ArgumentParser:
    names = ", ".join(r.env for r in ROWS.values())
    p = _Parser(prog="healthcheck serve", description="HTTP health endpoints (/livez /readyz /startupz, "
                "application/health+json, 200 or 503) and Prometheus /metrics, answered from results that a "
                "background monitor refreshes.",
                epilog=f"Environment: {names} and the probes' own settings (see docs/serve.md).")
    for field, flag in FLAGS.items():
        row = ROWS[field]
        shown = (row.shown_default or str(row.default)).replace("`", "")
        p.add_argument(flag, dest=field, help=f"{row.meaning.replace('`', '')} (default {shown}; {row.env})")
    return p


def setup_logging(log_file: str | None) -> None:  # HEALTHCHECK_LOG_FILE when usable, else stderr
    logger = logging.getLogger("healthcheck")
    logger.setLevel(logging.INFO)
    fmt = "%(asctime)s %(process)d %(levelname)s %(name)s %(message)s"
    if log_file:
        handler, why = logfile.attach(logger, log_file, fmt, on_error=lambda why: _stderr_line(
            f"healthcheck serve: writing the log file failed ({why}); later log lines are lost"))
        if handler is not None:
            return
        _stderr_line(f"healthcheck serve: {why}: logging to stderr instead")
    logging.basicConfig(format=fmt, stream=sys.stderr)


def _stderr_line(line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, (clean(line, 400) + "\n").encode("utf-8", "backslashreplace"))


def serve(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    settings, configs = load(**{field: getattr(args, field) for field in FLAGS})
    setup_logging(configs["readiness"].log_file)
    # Orphans of a run or of the watcher come to us, not to PID 1, so that our sweeps can end them.
    if not proc.subreaper():
        log.warning("cannot become the child subreaper: what a probe leaves behind may outlive its run")
    try:
        from probes.serve.httpd import HealthServer
    except ModuleNotFoundError as exc:  # the serve extra is not installed
        if exc.name != "prometheus_client":
            raise
        raise ConfigError("serve needs prometheus-client (accepted: pip install 'gpu-healthcheck[serve]')"
                          ) from None
    state = State.open(configs["readiness"].state_dir)
    if not state.enabled:
        log.warning("state dir not usable (%s): the latch is kept in memory only", state.disabled_reason)
    monitor = Monitor(settings, {p: c.timeout + SERVE_RUN_GRACE for p, c in configs.items()}, state)
    try:
        server = HealthServer((settings.host, settings.port), monitor, gating=settings.gating)
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else "cannot bind"
        if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):  # not an address of this machine
            name = "--host" if args.host is not None else ROWS["host"].env
            raise ConfigError(f"{name}={settings.host} cannot be bound here ({why}) (accepted: {HOST_FORMS})"
                              ) from None
        _stderr_line(f"healthcheck serve: cannot listen on {settings.host}:{settings.port} ({why}): "
                     "choose another --port or HEALTHCHECK_SERVE_PORT")
        return 1
    # The handler takes no lock: it runs in the main thread between any two bytecodes, and an Event's
    # set() could find that thread inside the same Event's wait, holding its lock.
    stopped: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, _: stopped.append(signum))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    monitor.start()
    log.info("serving on http://%s:%d (intervals %s; readiness gating %s; deep probe %s; xid watch %s)",
             *server.server_address[:2], ",".join(f"{k}={v:g}" for k, v in settings.intervals.items()),
             *("on" if on else "off" for on in (settings.gating, settings.deep, settings.xid_watch)))
    while not stopped:  # in slices: a signal that another thread takes wakes no sleep
        time.sleep(SIGNAL_POLL)
    log.info("stopping")
    t0 = time.monotonic()
    server.shutdown()
    server.server_close()
    monitor.terminate()
    log.info("stopped in %.2f s", time.monotonic() - t0)
    return 0


def main(argv: Sequence[str]) -> int:
    try:
        return serve(argv)
    except ConfigError as exc:
        _stderr_line(str(exc) if str(exc).startswith("healthcheck") else f"healthcheck serve: {exc}")
        return 3
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) and exc.code in (0, 1, 3) else 3
    except KeyboardInterrupt:
        return 0
    except Exception as exc:
        logging.getLogger("healthcheck").exception("serve: internal error")
        _stderr_line(f"healthcheck serve: internal error ({type(exc).__name__}); details in the log")
        return 1
