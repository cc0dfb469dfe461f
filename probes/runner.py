"""Run the selected probes: layer order, dependencies, one deadline per probe and per run.

Each probe runs in a daemon thread watched by a supervisor thread. A probe whose
gather() has not returned by its deadline (a hanging NVML call, say) is abandoned
and recorded as failed, so the run always ends by its own deadline. Probes that do
not depend on each other run concurrently: a wedged GPU never delays the services.
"""

from __future__ import annotations

import _thread
import time

# Loaded here, not where it is needed: under an open-file limit a module can no longer be read
# then. Every run loads it anyway (probes.proc, for the final sweep).
from probes import childio
from probes.config import Config
from probes.context import Context, logger
from probes.deadlines import GRACE, RUN_MARGIN
from probes.record import Record
from probes.result import SEVERITY, Result, Status, verdict
from probes.spec import Spec, cause
from probes.state import State

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Callable

# What any probe can report, besides its own causes (the first cause table of docs/probes.md).
# A probe that hangs past its deadline with no deadline cause of its own: a hardware probe whose
# call is stuck in the driver, or a machine so starved that a probe's thread never ran.
DEADLINE = cause("deadline", "the probe gave no answer by its deadline "
                             "(its own, or the run's `HEALTHCHECK_TIMEOUT`)",
                 "the component it checks is hung or the machine overloaded; "
                 "if it lasts, the node's operator looks", action="retry", actor="operator")
# The failed probe named in the message carries its own remedy and actor; this one has nothing to do.
DEPENDENCY_FAILED = cause("dependency-failed", "a lower layer failed, so this probe did not run",
                          "fix the layer named in the message", "skip", action="none", actor="tenant")
# A fatal CUDA error or a critical Xid is the GPU's or the driver's: a new container clears the latch,
# but only the operator can mend a GPU that fails again.
LATCHED = cause("latched", "a CUDA-fatal error or a critical Xid latched the container unhealthy",
                "restart the container (a new PID 1 clears the latch)", action="restart-container",
                actor="operator")
# A bug in the suite: no restart of the container nor reset of the GPU mends it; whoever ships the
# image (the operator's side) reports it and updates the suite.
INTERNAL_ERROR = cause("internal-error", "the probe itself raised "
                                         "(a bug of the suite, not a fault of the container or the GPU); "
                                         "the detail is only in `HEALTHCHECK_LOG_FILE`",
                       "report it with the log line", action="none", actor="operator")
LIMIT = cause("limit", "not checked: a resource limit of the container "
                       "(processes or threads, open files, memory) "
                       "kept the suite from starting the probe's thread or process; "
                       "the probe's component is not at fault",
              "raise the limit the message names, or find what uses it up", "warn", action="fix-config",
              actor="tenant")
COMMON_CAUSES = (DEADLINE, DEPENDENCY_FAILED, LATCHED, INTERNAL_ERROR, LIMIT)
SIGNAL_POLL = 0.1  # the longest the main thread waits at once, so a signal's handler runs this soon


class _Done:
    """Set once, waited on with a timeout: the part of ``threading.Event`` the runner uses.

    The runner starts its threads with ``_thread``: ``threading`` (and the ``functools`` it
    imports) costs every run, liveness included, ~1.4 ms of start-up (make bench).
    """

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()

    def set(self) -> None:
        try:
            self._lock.release()  # a plain lock: any thread may release it
        except RuntimeError:
            pass  # already set

    def is_set(self) -> bool:
        return not self._lock.locked()

    def wait(self, timeout: float) -> bool:
        if self._lock.acquire(timeout=max(timeout, 0.0)):
            self._lock.release()
            return True
        return False


def _start(function: Callable[..., None], *args: object) -> _Done | None:
    """Run ``function(*args)`` in a new thread; the returned flag is set when it returns. None when
    no thread can be started (pthread_create said EAGAIN: the process limit, RLIMIT_NPROC or the
    cgroup's pids.max, which counts threads; or no memory for its stack)."""
    done = _Done()

    def body() -> None:
        try:
            function(*args)
        finally:
            done.set()

    try:
        _thread.start_new_thread(body, ())
    except RuntimeError:  # "can't start new thread"
        return None
    return done


def _no_thread(spec: Spec) -> Result:
    import errno

    # limit_words names the limit and how to raise it: the message needs no more.
    words = childio.limit_words(errno.EAGAIN)
    return verdict(spec.name, LIMIT, f"not checked: could not start a thread: {words}", remedy=False)


class Outcome(Record):
    __slots__ = ("profile", "results", "notes", "abandoned", "elapsed", "specs")

    profile: str
    results: tuple[Result, ...]
    notes: tuple[str, ...]
    abandoned: bool  # a probe thread is still stuck in a call: exit without joining it
    elapsed: float
    specs: tuple[Spec, ...]  # what ran (drop-ins included), for the reports

    def __init__(self, profile: str, results: tuple[Result, ...], notes: tuple[str, ...] = (),
                 abandoned: bool = False, elapsed: float = 0.0, specs: tuple[Spec, ...] = ()) -> None:
        self.profile = profile
        self.results = results
        self.notes = notes
        self.abandoned = abandoned
        self.elapsed = elapsed
        self.specs = specs

    @property
    def status(self) -> Status:
        worst = max((SEVERITY[r.status] for r in self.results), default=0)
        return {0: Status.PASS, 1: Status.WARN, 2: Status.FAIL}[worst]

    @property
    def first_problem(self) -> Result | None:
        for wanted in (Status.FAIL, Status.WARN):
            for r in self.results:
                if r.status is wanted:
                    return r
        return None


def run_deadline(timeout: float, start: float) -> float:
    """Leave a margin inside the run's budget for reporting."""
    return start + timeout - min(RUN_MARGIN, timeout / 2)


def _log_exception(message: str, *args: object) -> None:
    """The exception being handled, to the log, if the log can be had: under an open-file limit
    the logging module itself may not load, and that must not turn a result into a traceback."""
    try:
        logger().exception(message, *args)
    except Exception:  # noqa: S110 - best effort by design
        pass


def _deadline_result(spec: Spec, module: object, ctx: Context, budget: float) -> Result:
    hook: Callable[[Context], Result] | None = getattr(module, "on_deadline", None)
    if hook is not None:
        try:
            return hook(ctx)
        except Exception:  # the hook must not turn a deadline into a crash
            _log_exception("on_deadline of %s failed", spec.name)
    return verdict(spec.name, DEADLINE, f"no answer within {budget:.1f}s (deadline passed)")


def _raised(spec: Spec, exc: Exception) -> Result:
    """The result of a probe that raised: "not checked" when a resource limit is why (no descriptor
    left to import a module or open a file: EMFILE), else an internal error. Exception text may
    hold paths, tokens or driver noise: it goes to the log only, when the log can be had at all."""
    import errno  # built in: importing it needs no file

    _log_exception("probe %s raised", spec.name)
    # Not EAGAIN: a non-blocking socket's BlockingIOError is a probe's bug, not the process limit
    # (which a child's start, in probes.proc, and a thread's, here, answer themselves).
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
        words = childio.limit_words(exc.errno)
        return verdict(spec.name, LIMIT, f"not checked: the {spec.name} probe could not go on: {words}",
                       remedy=False)
    return verdict(spec.name, INTERNAL_ERROR, f"internal error in the {spec.name} probe "
                   f"({type(exc).__name__}); details in the log")


def _execute(spec: Spec, ctx: Context, budget: float) -> tuple[Result, bool]:
    """Run one probe under its deadline; returns (result, abandoned)."""
    box: list[Result] = []

    def work() -> None:
        try:
            module = spec.load()
            data = module.gather(ctx)
            box.append(module.judge(data, ctx))
        except Exception as exc:
            box.append(_raised(spec, exc))

    finished = _start(work)
    if finished is None:
        # Not run in this thread instead: nothing would then bound it by its deadline (an NVML call
        # stuck in the driver would hold the whole run), and the run promises an answer by then.
        return _no_thread(spec), False
    finished.wait(max(0.0, ctx.deadline - time.monotonic()) + GRACE)
    if box:
        return box[0], False
    try:
        module = spec.load()
    except Exception:
        module = None
    return _deadline_result(spec, module, ctx, budget), not finished.is_set()


def run(config: Config, state: State, *, start: float | None = None,
        specs: Sequence[Spec] | None = None) -> Outcome:
    """Run ``specs`` (default: what the configuration selects) and collect their results."""
    start = time.monotonic() if start is None else start
    wall = time.time()
    end = run_deadline(config.timeout, start)
    specs = config.selected() if specs is None else list(specs)
    results: dict[str, Result] = {}
    done = {s.name: _Done() for s in specs}
    abandoned = _Done()
    lock = _thread.allocate_lock()
    # A CUDA-fatal latch (or a critical Xid) holds until the container restarts: the
    # hardware layer is not touched, and torch-cuda answers from the latch at once.
    latch = state.latch() if any(s.layer == "hardware" for s in specs) else None
    torch_selected = any(s.name == "torch-cuda" for s in specs)
    by_name = {s.name: s for s in specs}

    def supervise(spec: Spec) -> None:
        try:
            # Under a latch nothing waits: the hardware layer is not run at all.
            needs = [] if latch is not None else [
                n for n in spec.requirements(config) if n in by_name]
            for name in needs:
                done[name].wait(max(0.0, end - time.monotonic()) + 2 * GRACE)
            with lock:
                broken = [results.get(n) for n in needs]
            bad = [r for r in broken if r is None or not r.ok]
            if latch is not None and spec.layer == "hardware":
                why = (f"latched unhealthy by {latch.get('source', '?')}: {latch.get('reason', '?')}; "
                       "the GPU is not touched until the container restarts")
                result = verdict(spec.name, LATCHED, why, remedy=False)  # it says when the latch clears
                if torch_selected:  # torch-cuda reports the latch; the hardware probes stand aside
                    result = result._replace(status=Status.SKIP)
            elif bad:
                first = bad[0]
                why = (f"{first.name}: {first.message}" if first is not None
                       else f"{needs[0]} gave no result")
                layer = by_name[needs[0]].layer
                result = verdict(spec.name, DEPENDENCY_FAILED, f"skipped: the {layer} layer failed ({why})",
                                 remedy=False)
            else:
                t0 = time.monotonic()
                deadline = min(t0 + spec.timeout, end)
                with lock:
                    snapshot = dict(results)
                ctx = Context(config, deadline, snapshot, state, wall, spec)
                result, stuck = _execute(spec, ctx, deadline - t0)
                if stuck:
                    abandoned.set()
                result = result._replace(elapsed=round(time.monotonic() - t0, 4))
            with lock:
                results[spec.name] = result._replace(time=time.time())
        finally:
            done[spec.name].set()

    for s in specs:
        # The modules to run are imported here, one after another, before any thread starts:
        # imported by the probes' threads at once they wait on each other's import locks and
        # trade the GIL (a cached readiness run paid ~3 ms more, make bench). A module that
        # cannot be imported (no descriptor left) raises again in its probe's thread: reported.
        try:
            s.load()
        except Exception:  # noqa: S110 - reported by the probe's own run
            pass
    for s in specs:
        # supervise sets done[s.name] when it ends. Without a thread for it (the process limit), it
        # runs here: it only waits, bounded by the run's deadline, for the probes it needs, and its
        # probe runs under _execute, bounded by a thread of its own or "not checked" at once. The
        # probes after it start later, still within the run's deadline.
        if _start(supervise, s) is None:
            supervise(s)
    for s in specs:
        until = time.monotonic() + max(0.0, end - time.monotonic()) + 3 * GRACE
        # In slices: a signal that lands on another thread (a probe's child TERMs the suite)
        # does not wake the main thread's wait, and only the main thread runs the handler.
        while not done[s.name].wait(min(SIGNAL_POLL, until - time.monotonic())) and time.monotonic() < until:
            pass
    ordered = []
    for s in specs:
        r = results.get(s.name)
        if r is None:  # its supervisor is itself stuck: cannot happen unless the machine is starved
            abandoned.set()
            r = verdict(s.name, DEADLINE, "no answer before the run's deadline", time=time.time())
        ordered.append(r)
    notes = []
    if not state.enabled and torch_selected:
        notes.append(f"caching off: {state.disabled_reason}")
    return Outcome(config.profile, tuple(ordered), tuple(notes), abandoned.is_set(),
                   round(time.monotonic() - start, 4), tuple(specs))
