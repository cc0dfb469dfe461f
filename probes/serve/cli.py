"""`healthcheck serve`: the command line, logging, start-up and a clean stop (docs/serve.md).

A stop ends every descendant (serve is the child subreaper) before the exit status 0.
"""

from __future__ import annotations

import argparse
import errno
import logging
import logging.handlers
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

from probes.config import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any, NoReturn

    from probes.serve.settings import Settings

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 3
log = logging.getLogger("healthcheck.serve")
STOP_GRACE = 1.0  # seconds a monitor run gets after SIGTERM before SIGKILL
# bind() errors that blame the address (not on this machine, or its family not supported).
HOST_ERRNOS = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"serve: {message} (see healthcheck serve --help)")


def parser() -> argparse.ArgumentParser:
    from probes.serve import settings as st

    p = _Parser(
        prog="healthcheck serve",
        description="HTTP health endpoints (/livez /readyz /startupz, application/health+json, 200 or 503) "
                    "and Prometheus /metrics, answered from results that a background monitor refreshes.",
        epilog="Environment: HEALTHCHECK_SERVE_HOST, HEALTHCHECK_SERVE_PORT, HEALTHCHECK_SERVE_INTERVAL, "
               "HEALTHCHECK_SERVE_SLACK, HEALTHCHECK_SERVE_READINESS_GATING, HEALTHCHECK_SERVE_DEEP, "
               "HEALTHCHECK_SERVE_XID_WATCH, HEALTHCHECK_XID_CRITICAL, HEALTHCHECK_XID_APPLICATION, "
               "HEALTHCHECK_XID_IGNORE, HEALTHCHECK_SERVE_SLOWDOWN_SAMPLE, "
               "HEALTHCHECK_SERVE_PYTHON and the probes' own settings (see docs/serve.md).")
    p.add_argument("--host", help=f"address to bind: {st.HOST_FORMS} (default {st.DEFAULT_HOST}: "
                                  "loopback only)")
    p.add_argument("--port", help=f"TCP port (default {st.DEFAULT_PORT}; 0: a free one, logged)")
    p.add_argument("--interval", metavar="SECONDS|PROFILE=SECONDS,...",
                   help=f"pause between runs of each profile, at least {st.MIN_INTERVAL:g} s "
                        "(default startup=5,readiness=15,liveness=10)")
    return p


def setup_logging(log_file: str | None) -> IO[Any] | None:
    """Log to HEALTHCHECK_LOG_FILE when set and usable, else stderr; returns the stream the
    watcher child should use for its stderr (None: inherit ours).

    A log file that cannot be used (a FIFO, a directory, a full device, a link) never stops
    serve or blocks it: one warning line on stderr, and the log goes to stderr instead.
    """
    from probes import logfile

    logger = logging.getLogger("healthcheck")
    logger.setLevel(logging.DEBUG if os.environ.get("HEALTHCHECK_SERVE_DEBUG") else logging.INFO)
    fmt = "%(asctime)s %(process)d %(levelname)s %(name)s %(message)s"
    if log_file:
        def warn(why: str) -> None:
            _stderr_line(f"healthcheck serve: writing the log file failed ({why}); later log lines are lost")

        handler, why = logfile.attach(logger, log_file, fmt, on_error=warn)
        if handler is not None:
            try:
                return logfile.open_append(log_file)
            except OSError:
                return None
        _stderr_line(f"healthcheck serve: {why}: logging to stderr instead")
    stderr_handler = logging.StreamHandler(sys.stderr)
    stderr_handler.setFormatter(logging.Formatter(fmt))
    logger.addHandler(stderr_handler)
    return None


def _stderr_line(line: str) -> None:
    from probes.untrusted import clean

    try:
        os.write(2, (clean(line, 400) + "\n").encode("utf-8", "backslashreplace"))
    except OSError:
        pass


def _listen(server_class: Any, settings: Settings, monitor: Any) -> Any:
    """The bound server, or None when the port cannot be had (said on stderr: exit 1). An
    address that cannot be bound is the host setting's fault: ConfigError (exit 3)."""
    from probes.serve import settings as st

    try:
        return server_class((settings.host, settings.port), monitor, gating=settings.readiness_gating)
    except OSError as exc:
        if exc.errno in HOST_ERRNOS:
            raise ConfigError(f"{settings.host_from}={settings.host} cannot be bound here "
                              f"({os.strerror(exc.errno)}) (accepted: {st.HOST_FORMS})") from None
        why = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else "cannot bind"
        _stderr_line(f"healthcheck serve: cannot listen on {settings.host}:{settings.port} ({why}): "
                     "choose another --port or HEALTHCHECK_SERVE_PORT")
        return None


def serve(argv: Sequence[str]) -> int:
    from probes.serve import settings as st

    args = parser().parse_args(list(argv))
    settings = st.load(host=args.host, port=args.port, interval=args.interval)
    child_stderr = setup_logging(settings.log_file)
    from probes import proc

    # Whatever a monitor run or the watcher leaves behind is re-parented to us, not to
    # PID 1, so that the runs' sweeps and the final one here can end it.
    if not proc.subreaper():
        log.warning("cannot become the child subreaper: a process that a probe leaves behind "
                    "may outlive its run")

    try:
        from probes.serve.httpd import HealthServer
    except ModuleNotFoundError as exc:  # the serve extra is not installed
        if exc.name != "prometheus_client":
            raise
        raise ConfigError("serve needs prometheus-client "
                          "(accepted: pip install 'gpu-healthcheck[serve]')") from None
    from probes.serve.monitor import Monitor
    from probes.serve.xid import Watcher
    from probes.state import State

    state = State.open(settings.state_dir)
    if not state.enabled:
        log.warning("state dir not usable (%s): the latch is kept in memory only", state.disabled_reason)
    monitor = Monitor(settings, state)
    server = _listen(HealthServer, settings, monitor)
    if server is None:
        return EXIT_FAIL
    host, port = server.server_address[:2]
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    watcher = Watcher(settings, monitor, stderr=child_stderr)
    http_thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                   name="http", daemon=True)
    http_thread.start()
    monitor.start()
    watcher.start()
    log.info("serving on http://%s:%d (intervals %s; readiness gating %s; deep probe %s; xid watch %s)",
             host, port, ",".join(f"{k}={v:g}" for k, v in settings.intervals.items()),
             "on" if settings.readiness_gating else "off", "on" if settings.deep else "off",
             "on" if settings.xid_watch else "off")
    while not stop.wait(0.5):
        pass
    log.info("stopping")
    t0 = time.monotonic()
    monitor.stop.set()
    watcher.terminate()
    server.shutdown()
    server.server_close()
    # SIGTERM, then SIGKILL, every descendant: the runs, their workers, the watcher, their orphans.
    proc.end_descendants(STOP_GRACE)
    monitor.join(max(0.5, 3.0 - (time.monotonic() - t0)))
    proc.end_descendants(0.2)  # a run that started while we were stopping
    log.info("stopped in %.2f s", time.monotonic() - t0)
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    try:
        return serve(argv)
    except ConfigError as exc:
        msg = str(exc)
        _stderr_line(msg if msg.startswith("healthcheck") else f"healthcheck serve: {msg}")
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) and exc.code in (0, 1, 3) else EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_OK
    except Exception as exc:
        logging.getLogger("healthcheck").exception("serve: internal error")
        _stderr_line(f"healthcheck serve: internal error ({type(exc).__name__}); details in the log")
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
