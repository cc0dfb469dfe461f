"""The command line: `healthcheck [--profile P] [--json] [--only N] [--skip N] [-v]` and `healthcheck serve`.
Exit status: 0 healthy, 1 unhealthy, 3 usage or configuration error; never 2 (Docker's) nor a traceback."""

from __future__ import annotations

import os
import signal
import sys

from probes import __version__, registry
from probes.config import DEFAULT_PROFILE, GLOBAL_SETTINGS, ConfigError, load, shown
from probes.deadlines import WRITE_WAIT, hard_stop
from probes.spec import ALL_PROFILES
from probes.untrusted import clean

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE = 0, 1, 3
# Under the front door (./healthcheck) the run says its hard deadline on the descriptor the door
# gives it, and exits with DOOR_EXIT + its exit status (+ 15: it got SIGTERM): a status no other
# program gives, so that no interpreter but the suite's, and nothing its children write, can pass a run.
DOOR_EXIT = 200
_door: int | None = None

# (names, the value's name or "" for a switch, help); the last name is config.load's keyword.
FLAGS = (
    (("--profile",), "PROFILE", ", ".join(f"{p} (default)" if p == DEFAULT_PROFILE else p
                                          for p in ALL_PROFILES)),
    (("--json",), "", "print application/health+json"),
    (("--only",), "NAMES", "run only these probes or drop-in checks (comma-separated)"),
    (("--skip",), "NAMES", "do not run these probes or drop-in checks"),
    (("-v", "--verbose"), "", "show observed values"),
    (("-h", "--help"), "", "show this help and exit"),
    (("--version",), "", "show the version and exit"),
)
_FLAG = {name: (names[-1][2:], bool(value)) for names, value, _ in FLAGS for name in names}


def help_text() -> str:
    import textwrap

    flags = [(", ".join(names) + (f" {value}" if value else ""), about) for names, value, about in FLAGS]
    width = max(len(flag) for flag, _ in flags)
    settings = ", ".join(s.env for s in (*GLOBAL_SETTINGS, *registry.SETTINGS))
    paragraphs = [
        "", "Prove that this GPU container can do its job: hardware (nvidia-smi, NVML), framework "
        "(a verified PyTorch op on every GPU) and services (Jupyter, sshd).", "", "options:",
        *(f"  {flag:<{width}}  {about}" for flag, about in flags), "", "probes (layer, toggle):",
        *(f"  {s.name} ({s.layer}, {s.toggle}): {s.about}" for s in registry.PROBES), "",
        "Drop-in checks: every executable in HEALTHCHECK_CHECKS_DIR (default /etc/healthcheck.d), toggled "
        "by ENABLE_<NAME>_CHECK.", f"Settings: {settings} (see docs/probes.md).",
        "Exit status: 0 healthy, 1 unhealthy, 3 usage or configuration error."]
    usage = " ".join(f"[{names[0]}{' ' + value if value else ''}]" for names, value, _ in FLAGS)
    lines = (textwrap.fill(p, 100, subsequent_indent="    " if p[:1] == " " else "", break_on_hyphens=False)
             for p in paragraphs)
    return "\n".join([f"usage: healthcheck {usage}", "       healthcheck serve [--host HOST] [--port PORT]",
                      *lines])


def parse_flags(argv: Sequence[str]) -> dict[str, Any] | str:
    """The flags as keyword arguments for config.load(), or the text --help or --version prints;
    ConfigError on anything else."""
    opts: dict[str, Any] = {dest: None if value else False for dest, value in _FLAG.values()}
    unknown = []
    args = iter(argv)
    for arg in args:
        name, eq, value = arg.partition("=")
        dest, takes_value = _FLAG.get(name, ("", False))
        if takes_value:
            opts[dest] = value if eq else next(args, None)
            if opts[dest] is None:
                raise ConfigError(f"argument {name}: expected one value (see healthcheck --help)")
        elif dest and not eq:
            opts[dest] = True
        else:
            unknown.append(shown(arg))
    if unknown:
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        raise ConfigError(f"unrecognized arguments: {' '.join(unknown[:3])}{more} (see healthcheck --help)")
    if opts.pop("help"):
        return help_text()
    return f"healthcheck {__version__}" if opts.pop("version") else opts


def check(argv: Sequence[str]) -> tuple[int, str, bool]:
    """(exit status, output, abandoned)."""
    flags = parse_flags(argv)
    if isinstance(flags, str):
        return EXIT_OK, flags, False
    cfg = load(**flags)
    if _door is not None:  # tell the front door this run's hard deadline, before any child starts
        try:
            with open(_door, "wb", buffering=0) as door:
                door.write(b"%d\n" % hard_stop(cfg.timeout))
        except OSError:
            pass
    # A peer slow to answer (sshd re-executes itself for each connection) works while the suite imports.
    for port in [cfg.values[e.dials] for e in registry.ENTRIES if e.dials in cfg.values and cfg.enabled(e)]:
        from probes.services import net
        net.dial(cfg.host, port)
    from probes import report, runner
    from probes.context import logger
    from probes.state import State

    handler, log_problem = None, None
    if cfg.log_file:
        from probes import logfile

        handler, log_problem = logfile.attach(logger(), cfg.log_file, "%(asctime)s %(process)d %(levelname)s "
                                              "%(message)s")
        if handler is not None:
            logger().setLevel("INFO")
    state = State.open(cfg.state_dir)
    outcome = runner.run(cfg, state)
    code = EXIT_UNHEALTHY if outcome.status.value == "fail" else EXIT_OK
    if handler is not None:  # the run log: one line per run
        logger().info("%s exit=%d %s", cfg.profile, code, " ".join(
            f"{r.name}={r.status.value}{'(' + r.reason + ')' if r.reason else ''}" for r in outcome.results))
        if handler.failure:  # writing failed during this run
            log_problem = f"log file {cfg.log_file} not written ({handler.failure})"
    if log_problem:  # never a traceback, never another verdict: one note in the report
        outcome = outcome._replace(notes=(*outcome.notes, log_problem))
    all_off = cfg.toggles and not any(cfg.toggles.values()) and not cfg.only
    disabled = f"all checks disabled ({', '.join(cfg.toggles)} are off)" if all_off else ""
    out = report.json_text(outcome, disabled=disabled) if cfg.json else report.text(
        outcome, verbose=cfg.verbose, disabled=disabled)
    if cfg.profile_rules.tells:
        from probes import notice

        notice.tell(cfg, state, outcome)
    return code, out, outcome.abandoned


def main(argv: Sequence[str]) -> int:
    for fd in (0, 1, 2):  # a closed one would be the first file opened (a lock, the log): the report in it
        try:
            os.fstat(fd)
        except OSError:
            try:
                os.open(os.devnull, os.O_RDWR)  # takes the lowest free fd: this one
            except OSError:
                pass
    abandoned = False
    try:
        if argv and argv[0] == "serve":
            from probes.serve import cli as serve_cli  # type: ignore[attr-defined,unused-ignore]

            return serve_cli.main(argv[1:])
        _end_on_sigterm()
        code, out, abandoned = check(argv)
        _write(out)
    except ConfigError as exc:
        _write(clean(f"healthcheck: {exc}", 400), fd=2)
        code = EXIT_USAGE
    except KeyboardInterrupt:  # SIGINT: from a terminal, or from a probe that signals its parent
        _write("unhealthy: healthcheck: interrupted (SIGINT) before a verdict")
        code = EXIT_UNHEALTHY
    except Exception as exc:
        from probes.context import log_exception  # through the suite's logger: a bare one prints tracebacks
        log_exception("internal error")
        _write(f"unhealthy: healthcheck: internal error ({type(exc).__name__}); details in the log")
        code = EXIT_UNHEALTHY
    _end_descendants()
    if abandoned:  # a probe thread is stuck in a driver call: interpreter shutdown would wait on it
        exit_now(code)
    return code


def entry(door: int | None = None) -> None:
    """A check runs without the cyclic garbage collector: its hard deadline ends it anyway."""
    global _door
    # A non-interactive shell starts an asynchronous command with SIGINT ignored, and the
    # interpreter keeps it so: a SIGINT is an interruption, exit 1, however the run started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import gc

    argv = sys.argv[1:]
    if argv[:1] == ["serve"]:
        gc.enable()  # the front door turns it off before any import; a long-lived server collects
        sys.exit(main(argv))
    _door = door
    gc.disable()
    exit_now(main(argv))


def exit_now(code: int) -> None:
    """Exit without interpreter finalization, output flushed first (the run log's handler flushes
    each line as it writes it)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: S110 - best effort
            pass
    os._exit(code if _door is None else DOOR_EXIT + code)


def _end_descendants() -> None:
    """Nothing a probe started outlives the run; a Jupyter kernel is removed through its server first."""
    for name, end in (("probes.services.kernel_run", "end_all"), ("probes.proc", "end_descendants")):
        module = sys.modules.get(name)  # not imported: nothing was started through it
        if module is not None:
            try:
                getattr(module, end)()
            except Exception:  # noqa: S110 - the verdict is already out; the sweep is best effort here
                pass


def _end_on_sigterm() -> None:
    """The front door's hard stop (or `docker stop`): end what the run started, then exit unhealthy."""

    def on_term(signum: int, frame: object) -> None:
        if _door is None:  # else the front door says what it was: its own hard stop, or not
            _write("unhealthy: healthcheck: got SIGTERM before a verdict (a probe or drop-in that signals "
                   "its parent, or another process)")
        _end_descendants()
        os._exit(EXIT_UNHEALTHY if _door is None else DOOR_EXIT + 15)

    signal.signal(signal.SIGTERM, on_term)


def _write(out: str, fd: int = 1) -> None:
    """Unbuffered (nothing is left for Python to flush, and complain about, at exit), and at most
    WRITE_WAIT for room: a closed, broken or full fd costs the text, not the exit status."""
    import select
    import time

    try:
        sys.stdout.flush()
    except Exception:  # noqa: S110 - best effort
        pass
    data = (out + "\n").encode("utf-8", "backslashreplace")
    end = time.monotonic() + WRITE_WAIT
    while data:
        try:
            if not select.select([], [fd], [], max(0.0, end - time.monotonic()))[1]:
                return
            # Up to PIPE_BUF bytes fit in a pipe that select calls writable: no write blocks.
            data = data[os.write(fd, data[:select.PIPE_BUF]):]
        except OSError:
            return
