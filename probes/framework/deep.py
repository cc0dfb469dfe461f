"""What torch-cuda, model and nccl share: the one-costly-check lock, the cache of a passing run, the
latch of a sticky CUDA error, the worker's start on the GPUs with room (free_memory.py), and the
verdicts they share. Imported when a framework probe runs; what a run needs (process control, the
NVML survey, the CUDA error table) is imported in the functions that use it.
"""

from __future__ import annotations

import os
import time

from probes import deadlines, untrusted
from probes import framework as fw
from probes.context import Context, logger
from probes.framework import Torch, protocol
from probes.result import Result, Status, verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from probes import proc
    from probes.framework import free_memory
    from probes.spec import Cause

LOCK = "torch-cuda.lock"  # one costly check at a time: torch-cuda, model and nccl take it


def state_off(why: str | None) -> str:
    """What a run without a state dir says of it (a fatal error cannot latch there)."""
    return f"state dir off: {why}"


def start(ctx: Context, need_mib: int,
          extra: dict[str, str]) -> tuple[free_memory.Room | None, dict[str, str]]:
    """(the room survey, or None on the CPU; the worker's environment): CUDA_MODULE_LOADING=LAZY
    (a smaller context), and CUDA_VISIBLE_DEVICES narrowed to the GPUs with room when some have
    none."""
    from probes.framework import free_memory

    env = {**os.environ, "CUDA_MODULE_LOADING": "LAZY", **extra}
    if ctx.config.of(Torch).torch_device != "cuda":
        return None, env
    space = free_memory.survey(need_mib, os.environ)
    if space.visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = space.visible
    return space, env


def no_room(space: free_memory.Room) -> dict[str, Any]:
    """A run that started nothing: no GPU had room."""
    from probes.framework import free_memory

    return {"kind": free_memory.REASON, "room": space.facts(), "lingered": False, "finished": time.time()}


def not_checked(name: str, data: dict[str, Any], what: str, **kw: Any) -> Result:
    """judge() of a run that started nothing because the workload holds every GPU's memory."""
    from probes.framework import free_memory

    facts = {**kw.pop("facts", {}), "room": data["room"]}
    return verdict(name, fw.WORKLOAD_MEMORY, free_memory.not_checked(data["room"], what), remedy=False,
                   facts=facts, **kw)


def with_room(result: Result, data: dict[str, Any], what: str) -> Result:
    """``result`` noting the GPUs left out for want of room: a pass becomes a warning."""
    from probes.framework import free_memory

    facts = free_memory.read(data.get("room"))
    if facts is None:
        return result
    merged = {**result.facts, "room": facts}
    if not facts["full"]:
        return result._replace(facts=merged)
    note = "; " + free_memory.not_checked(facts, what)
    if result.status is Status.PASS:
        return verdict(result.name, fw.WORKLOAD_MEMORY, result.message + note, remedy=False,
                       observed=result.observed, unit=result.unit, facts=merged)
    return result._replace(message=result.message + note, facts=merged)


def cuda_failure(name: str, code: Any, message: str, where: str, **kw: Any) -> Result | None:
    """model's and nccl's verdict on a CUDA error (cuda_errors.py), or None when it is none we can
    name: sticky latches (``fatal`` in the facts), could-not-check warns, anything else fails as
    ``cuda-error``. torch-cuda judges the same table with more to say (the holder of a busy GPU,
    the driver's version, an error at start by its own reason)."""
    from probes.framework import cuda_errors

    found = cuda_errors.identify(code, message)
    if found is None:
        return None
    error = found.error
    facts = {**kw.pop("facts", {}), "cuda_error": {"code": error.code, "name": error.name,
                                                    "category": error.category, "how": found.how}}
    if error.category == cuda_errors.STICKY:
        return error.verdict(name, f"fatal CUDA error on {where} ({error.label}): sticky, {UNTIL_RESTART}",
                             facts={**facts, "fatal": True}, **kw)
    if error.category == cuda_errors.NOT_CHECKED:
        busy = fw.OOM if error.cause is fw.OOM else fw.DEVICE_BUSY
        return verdict(name, busy, f"{where}: {error.label}", facts=facts, **kw)
    return error.verdict(name, f"CUDA error on {where} ({error.label})", cause=fw.CUDA_ERROR, facts=facts,
                         **kw)


def locked_run(ctx: Context, cache: str, key: dict[str, Any],
               reuse: Callable[[dict[str, Any] | None], dict[str, Any] | None],
               run: Callable[[], dict[str, Any]],
               judge: Callable[[dict[str, Any], Context], Result], *, early: bool = False,
               share: Callable[[dict[str, Any] | None], dict[str, Any] | None] | None = None,
               relatch: bool = False) -> dict[str, Any]:
    """A deep check's costly run: one costly check at a time under this probe's lock; readiness
    reuses what ``reuse`` accepts from ``cache`` (read again once the lock is held, a run we
    waited for may have written it); a run's result is cached, except one whose worker lingered
    (its cache entry is removed) or that started no worker (no GPU had room). A sticky CUDA
    error latches the container. Without a state dir it simply runs.

    torch-cuda, which every profile runs, asks for more: ``early`` answers readiness from the
    cache before waiting for the lock, ``share`` hands every profile what it accepts of a run
    that finished while this one waited (startup included), ``relatch`` reads the latch again
    once the lock is held (the run waited for may have latched)."""
    state = ctx.state
    if not state.enabled:  # nothing can latch: the judge says so if the run finds a fatal error
        data = run()
        data.setdefault("latch_lost", state_off(state.disabled_reason))
        data["cache"] = {"how": "off", "why": state.disabled_reason}
        return data
    started = time.time()
    if early and ctx.config.profile_rules.reuses_cache:
        hit = reuse(state.read_json(cache))
        if hit is not None:
            return hit
    waited_from = time.monotonic()
    lock = state.lock(LOCK, ctx.deadline - deadlines.MARGIN)
    if lock.unusable:  # nobody holds it (a disk too full for the lock file): run as without a state dir
        logger().warning("%s runs without the one-check-at-a-time lock: %s", cache, lock.unusable)
        return record(ctx, cache, key, run(), judge)
    with lock as held:
        if not held:
            return {"kind": "lock-timeout", "waited": round(time.monotonic() - waited_from, 2)}
        latch = state.latch() if relatch else None
        if latch is not None:
            return latched(latch)
        entry = state.read_json(cache)
        shared = share(entry) if share is not None and _finished_since(entry, started) else None
        if shared is not None:
            return shared
        if ctx.config.profile_rules.reuses_cache:
            hit = reuse(entry)
            if hit is not None:
                return hit
        return record(ctx, cache, key, run(), judge)


def _finished_since(entry: dict[str, Any] | None, started: float) -> bool:
    """Whether a cache entry is of a run that finished after ``started`` (a damaged one is not)."""
    if entry is None:
        return False
    try:
        return float(entry.get("finished", 0.0)) >= started
    except (TypeError, ValueError):
        return False


def latched(latch: dict[str, Any]) -> dict[str, Any]:
    """What judge() reads of the latch (a sticky CUDA error, or an Xid): a run that starts nothing."""
    raw: Any = latch.get("time")
    since = float(raw) if protocol.finite(raw) else 0.0
    if not 0 < since <= time.time() + 86400:
        since = 0.0  # damaged: shown as an unknown time, never a crash
    return {"kind": "latched", "source": untrusted.clean(latch.get("source", "?"), 40),
            "why": untrusted.clean(latch.get("reason", "?")), "since": since,
            "age": round(max(time.time() - since, 0.0), 1) if since else None}


def record(ctx: Context, cache: str, key: dict[str, Any], data: dict[str, Any],
           judge: Callable[[dict[str, Any], Context], Result]) -> dict[str, Any]:
    """After a costly run, under the lock: a sticky CUDA error latches the container and the run is
    cached for later runs to reuse or share; a run whose worker lingered is not trusted (nothing is
    cached or shared, and an older pass must not be served after it), and one that started nothing
    (no GPU had room) has nothing to cache."""
    from probes.framework import free_memory

    if data["kind"] == free_memory.REASON:
        return data
    if data["lingered"]:
        ctx.state.remove(cache)
        return data
    result = judge(data, ctx)
    if result.facts.get("fatal") and not ctx.state.set_latch(result.name, result.message, result.reason):
        data["latch_lost"] = untrusted.clean(ctx.state.problem or "?", 120)
        logger().error("%s: fatal CUDA error NOT latched, the state dir could not keep it (%s): later runs "
                       "will not see it; restart the container", result.name, data["latch_lost"])
    ctx.state.write_json(cache, {"key": key, "finished": data["finished"], "status": result.status.value,
                                 "data": data})
    return data


def deep_worker(ctx: Context, name: str, argv: list[str], env: dict[str, str],
                parse: Callable[[bytes], tuple[dict[str, Any] | None, str | None]],
                phase: Callable[[bytes], str | None], arrived: Callable[[bytes], bool],
                need_mib: int) -> tuple[dict[str, Any], proc.Completed | None]:
    """A deep check's worker run under the probe's deadline, on the GPUs with
    ``need_mib`` MiB free (see :func:`start`): what its judge() reads of the run (``locked_run``'s
    ``run``), and the process, for what else it reads there (None when none was started)."""
    from probes import orphans, proc

    # What a killed suite left (a worker behind a wrapper, its grandchildren) goes before the GPUs'
    # memory is surveyed; one that survives SIGKILL may hold the GPU: no second worker beside it.
    space = None
    held = orphans.end()
    if held:
        logger().info("%s: processes of a killed run survive SIGKILL: %s", name, held)
    else:
        space, env = start(ctx, need_mib, env)
        if space is not None and space.none_left:
            return no_room(space), None
    deadline = ctx.deadline - deadlines.MARGIN
    budget = max(0.0, deadline - time.monotonic())
    done = proc.Completed(tuple(argv), None, stuck=True, held_by=held[0]) if held else proc.run(
        argv, deadline=deadline, env=env, state=ctx.state, key=name, until=arrived, linger=deadlines.LINGER)
    report, problem = parse(done.stdout)
    if (report is None or report.get("error") or done.timed_out or done.lingered
            or any(isinstance(d, dict) and d.get("error") for d in report.get("devices", ()))):
        # The details stay in the log; messages carry only fixed phrases.
        logger().info("%s worker rc=%s timed_out=%s lingered=%s stderr tail: %s", name, done.returncode,
                      done.timed_out, done.lingered, untrusted.squeeze(done.stderr[-2000:], 600))
    return {"kind": "worker", "spawn_error": done.spawn_error, "returncode": done.returncode,
            "timed_out": done.timed_out, "lingered": done.lingered, "stuck": done.stuck,
            "held_by": done.held_by, "budget": round(budget, 2), "phase": phase(done.stderr),
            "memory": protocol.out_of_memory(done.stderr),
            "report": report, "problem": problem, "finished": time.time(), "cache": None,
            "room": None if space is None else space.facts()}, done


def fresh_pass(entry: dict[str, Any] | None, key: dict[str, Any],
               ttl: float) -> tuple[dict[str, Any], float, float] | None:
    """(data, finished, age) of a cache entry for the same ``key`` that passed and is younger than
    ``ttl`` (the clock going backwards makes it stale); None for anything else."""
    if not entry or entry.get("key") != key or entry.get("status") != Status.PASS.value:
        return None
    data, finished = entry.get("data"), entry.get("finished")
    if not isinstance(data, dict) or not isinstance(finished, (int, float)) or isinstance(finished, bool):
        return None
    age = time.time() - float(finished)
    return (data, float(finished), age) if 0 <= age < ttl else None


def deep_cached(entry: dict[str, Any] | None, key: dict[str, Any], ttl: float,
                validate: Callable[[Any], dict[str, Any]]) -> dict[str, Any] | None:
    """A deep check's cached passing run (see fresh_pass), its report validated again."""
    if (fresh := fresh_pass(entry, key, ttl)) is None:
        return None
    data, finished, age = fresh
    try:
        report = validate(data.get("report"))
    except protocol.Bad:
        return None
    if report["error"] is not None:
        return None
    return {"kind": "worker", "spawn_error": None, "returncode": 0, "timed_out": False, "lingered": False,
            "stuck": False, "held_by": None, "budget": 0.0, "phase": None, "report": report, "problem": None,
            "finished": finished, "cache": {"how": "ttl", "age": round(age, 1)}}


UNTIL_RESTART = "unhealthy until the container restarts"


def unkept(result: Result, data: dict[str, Any]) -> Result:
    """``result`` saying so when its fatal error could not be latched (the state dir is off, or
    too full for even an empty file): later runs will not remember it, so nothing may promise
    "unhealthy until the container restarts"."""
    why = data.get("latch_lost")
    if not result.facts.get("fatal") or not why:
        return result
    said = f"the latch could not be kept ({untrusted.clean(why, 160)}), later runs will not remember it"
    message = (result.message.replace(UNTIL_RESTART, said) if UNTIL_RESTART in result.message
               else f"{result.message}; {said}")
    return result._replace(message=message, facts={**result.facts, "latch_kept": False})


def lock_timeout(name: str, data: dict[str, Any], cause: Cause | None = None, **kw: Any) -> Result:
    """judge() of a deep check whose locked_run did not get the lock in time: its own ``cause``
    for a deadline (by default the one every probe can report)."""
    from probes import runner

    return verdict(name, cause or runner.DEADLINE, f"no result within {data['waited']:.1f}s: another "
                   "costly check (torch-cuda, nccl or model) still holds the lock", **kw)


def limited(name: str, data: dict[str, Any], **kw: Any) -> Result | None:
    """judge() of a deep check whose worker a resource limit kept from starting (the interpreter is
    not at fault: not checked); None otherwise."""
    from probes import childio, runner

    if childio.limited(data.get("spawn_error")):
        return verdict(name, runner.LIMIT, f"not checked: the worker {data['spawn_error']}", remedy=False,
                       **kw)
    return None


def cannot_run(name: str, data: dict[str, Any], ctx: Context, **kw: Any) -> Result | None:
    """judge() of a deep check whose worker's interpreter cannot be run; None if it could."""
    if (limit := limited(name, data, **kw)) is not None:
        return limit
    if data.get("spawn_error") or (data.get("report") is None and data.get("returncode") in (126, 127)):
        python = untrusted.clean(ctx.config.of(Torch).torch_python, 80)
        return verdict(name, fw.INTERPRETER_NOT_FOUND, f"torch interpreter {python} cannot be run", **kw)
    return None


