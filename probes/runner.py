"""Run the selected probes, each in a daemon thread of its own once the probes it requires have
answered; one that overruns its deadline is abandoned and reported as the deadline, so the run ends
by its own (docs/architecture.md, "A check")."""

from __future__ import annotations

import errno  # built in: importing it needs no file, even at the open-file limit
import threading
import time

# Loaded here, not where it is needed: under an open-file limit a module can no longer be read then.
from probes import childio
from probes.config import Config
from probes.context import Context, log_exception
from probes.deadlines import GRACE, RUN_MARGIN
from probes.record import Record
from probes.result import SEVERITY, Result, Status, verdict
from probes.spec import Spec, cause
from probes.state import State

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Callable

# What any probe can report besides its own causes.
DEADLINE = cause("deadline", "the probe gave no answer by its deadline (its own, or the run's "
                 "`HEALTHCHECK_TIMEOUT`)", "the component it checks is hung or the machine overloaded; "
                 "if it lasts, the node's operator looks", action="retry", actor="operator")
# The failed probe named in the message carries its own remedy and actor; this one has nothing to do.
DEPENDENCY_FAILED = cause("dependency-failed", "a lower layer failed, so this probe did not run",
                          "fix the layer named in the message", "skip", action="none", actor="tenant")
# A fatal CUDA error or a critical Xid is the GPU's or the driver's: a new container clears the latch,
# but only the operator can mend a GPU that fails again.
LATCHED = cause("latched", "a CUDA-fatal error or a critical Xid latched the container unhealthy",
                "restart the container (a new PID 1 clears the latch)", action="restart-container",
                actor="operator")
# A bug in the suite: whoever ships the image (the operator's side) reports it and updates the suite.
INTERNAL_ERROR = cause("internal-error", "the probe itself raised (a bug of the suite, not a fault of the "
                       "container or the GPU); the detail is only in `HEALTHCHECK_LOG_FILE`",
                       "report it with the log line", action="none", actor="operator")
LIMIT = cause("limit", "not checked: a resource limit of the container (processes or threads, open files, "
              "memory) kept the suite from starting the probe's thread or process; the probe's component "
              "is not at fault", "raise the limit the message names, or find what uses it up", "warn",
              action="fix-config", actor="tenant")
COMMON_CAUSES = (DEADLINE, DEPENDENCY_FAILED, LATCHED, INTERNAL_ERROR, LIMIT)
SIGNAL_POLL = 0.1  # the longest the main thread waits at once, so a signal's handler runs this soon


class Outcome(Record):
    profile: str
    results: tuple[Result, ...]
    notes: tuple[str, ...] = ()
    abandoned: bool = False  # a probe thread is still stuck in a call: exit without joining it
    specs: tuple[Spec, ...] = ()  # what ran (drop-ins included), for the reports

    @property
    def status(self) -> Status:
        worst = max((SEVERITY[r.status] for r in self.results), default=0)
        return (Status.PASS, Status.WARN, Status.FAIL)[worst]

    @property
    def first_problem(self) -> Result | None:
        problems = (r for wanted in (Status.FAIL, Status.WARN) for r in self.results if r.status is wanted)
        return next(problems, None)


def run_deadline(timeout: float, start: float) -> float:
    """When the probes are given up: a margin inside the run's budget is kept for the report."""
    return start + timeout - min(RUN_MARGIN, timeout / 2)


def _raised(spec: Spec, exc: Exception) -> Result:
    """"Not checked" when a resource limit is why, else an internal error; its text goes to the log only."""
    log_exception("probe %s raised", spec.name)
    # Not EAGAIN: a non-blocking socket's BlockingIOError is a probe's bug, not the process limit.
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
        words = childio.limit_words(exc.errno)
        return verdict(spec.name, LIMIT, f"not checked: the {spec.name} probe could not go on: {words}",
                       remedy=False)
    return verdict(spec.name, INTERNAL_ERROR, f"internal error in the {spec.name} probe "
                   f"({type(exc).__name__}); details in the log")


def _deadline(spec: Spec, ctx: Context, budget: float) -> Result:
    try:
        hook: Callable[[Context], Result] | None = getattr(spec.load(), "on_deadline", None)
        if hook is not None:
            return hook(ctx)
    except Exception:  # the hook must not turn a deadline into a crash
        log_exception("on_deadline of %s failed", spec.name)
    return verdict(spec.name, DEADLINE, f"no answer within {budget:.1f}s (deadline passed)")


def _work(spec: Spec, ctx: Context, box: list[tuple[Result, float]], answered: threading.Event) -> None:
    try:
        module = spec.load()
        result = module.judge(module.gather(ctx), ctx)
    except Exception as exc:
        result = _raised(spec, exc)
    box.append((result, time.monotonic()))
    answered.set()


def run(config: Config, state: State, *, specs: Sequence[Spec] | None = None) -> Outcome:
    end = run_deadline(config.timeout, time.monotonic())
    specs = config.selected() if specs is None else list(specs)
    by_name = {s.name: s for s in specs}
    # Under a latch the hardware layer is not touched, and torch-cuda answers from the latch at once.
    latch = state.latch() if any(s.layer == "hardware" for s in specs) else None
    torch_selected = "torch-cuda" in by_name
    needs = {s.name: [] if latch is not None else [n for n in s.requirements(config) if n in by_name]
             for s in specs}
    results: dict[str, Result] = {}
    running: dict[str, tuple[threading.Thread, Context, float, list[tuple[Result, float]]]] = {}
    answered = threading.Event()
    abandoned = False

    def begin(spec: Spec) -> Result | None:
        """Start ``spec``'s thread; else the result of a hardware probe under a latch, of one whose
        requirement failed, or of one whose thread cannot start."""
        if latch is not None and spec.layer == "hardware":
            why = (f"latched unhealthy by {latch.get('source', '?')}: {latch.get('reason', '?')}; "
                   "the GPU is not touched until the container restarts")
            result = verdict(spec.name, LATCHED, why, remedy=False)  # it says when the latch clears
            # torch-cuda reports the latch; the hardware probes stand aside
            return result._replace(status=Status.SKIP) if torch_selected else result
        bad = [results[n] for n in needs[spec.name] if not results[n].ok]
        if bad:
            return verdict(spec.name, DEPENDENCY_FAILED, f"skipped: the {by_name[bad[0].name].layer} layer "
                           f"failed ({bad[0].name}: {bad[0].message})", remedy=False)
        t0 = time.monotonic()
        ctx = Context(config, min(t0 + spec.timeout, end), dict(results), state, spec)
        box: list[tuple[Result, float]] = []
        thread = threading.Thread(target=_work, args=(spec, ctx, box, answered), daemon=True)
        try:
            thread.start()
        except RuntimeError:  # the process limit (RLIMIT_NPROC, or pids.max: threads count), no memory
            # not run here instead: nothing would bound it by its deadline
            words = childio.limit_words(errno.EAGAIN)
            return verdict(spec.name, LIMIT, f"not checked: could not start a thread: {words}", remedy=False)
        running[spec.name] = (thread, ctx, t0, box)
        return None

    for s in specs:
        # Imported one after another before any thread starts: at once, the probes' threads would
        # wait on each other's import locks. One that cannot be imported raises again in its thread.
        try:
            s.load()
        except Exception:  # noqa: S110 - reported by the probe's own run
            pass
    waiting = list(specs)
    while waiting or running:
        answered.clear()
        now = time.monotonic()
        for name, (thread, ctx, t0, box) in list(running.items()):
            if box:
                result, done = box[0]
                results[name] = result._replace(elapsed=round(done - t0, 4), time=time.time())
            elif now >= ctx.deadline + GRACE:
                abandoned |= thread.is_alive()
                result = _deadline(by_name[name], ctx, ctx.deadline - t0)
                results[name] = result._replace(elapsed=round(now - t0, 4), time=time.time())
            else:
                continue
            del running[name]
        ready = [s for s in waiting if all(n in results for n in needs[s.name])]
        for s in ready:
            waiting.remove(s)
            given = begin(s)
            if given is not None:
                results[s.name] = given._replace(time=time.time())
        if ready and not running:
            continue  # a probe that requires one just skipped may start now
        if not running or now >= end + 3 * GRACE:  # a circle of requirements; a starved machine
            break
        # In slices: a signal that lands on another thread (a probe's child TERMs the suite) does
        # not wake the main thread's wait, and only the main thread runs the handler.
        soonest = min(ctx.deadline + GRACE for _, ctx, _, _ in running.values())
        answered.wait(max(0.0, min(SIGNAL_POLL, soonest - now)))
    abandoned |= bool(running)
    ordered = tuple(results.get(s.name) or verdict(s.name, DEADLINE, "no answer before the run's deadline",
                                                   time=time.time()) for s in specs)
    notes = (f"caching off: {state.disabled_reason}",) if not state.enabled and torch_selected else ()
    return Outcome(config.profile, ordered, notes, abandoned, tuple(specs))
