"""What torch-cuda and the deep checks share: the ``HEALTHCHECK_TORCH_*`` settings, common causes, the
workers' protocol, the GPUs with room for a worker, the one-costly-check lock, cache and latch, and the
verdicts every one gives alike."""

from __future__ import annotations

import math
import os
import time

from probes import deadlines, untrusted
from probes.context import Context, logger
from probes.hardware.common import DRIVER_MISMATCH
from probes.record import Record
from probes.result import Result, Status, verdict
from probes.spec import CHOICE, INTEGER, NUMBER, TEXT, Declared, cause, setting

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import ModuleType
    from typing import Any, TypeGuard

    from probes import proc
    from probes.spec import Cause

LOCK = "torch-cuda.lock"  # one costly check at a time: torch-cuda, model, nccl and jupyter-kernel take it
MIN_FREE = "HEALTHCHECK_TORCH_MIN_FREE_MIB"
UNTIL_RESTART = "unhealthy until the container restarts"


class Torch(Declared):
    torch_device: str = setting("HEALTHCHECK_TORCH_DEVICE", CHOICE, "cuda", "`cuda` (every visible GPU) or "
                                "`cpu` (CPU-only images)", choices=("cuda", "cpu"))
    torch_python: str = setting("HEALTHCHECK_TORCH_PYTHON", TEXT, "python3", "the interpreter that owns "
                                "torch (the image's)", shown_default="`python3` on `PATH`")
    torch_ttl: float = setting("HEALTHCHECK_TORCH_TTL", NUMBER, 300.0, "seconds a passing torch-cuda result "
                               "is reused by readiness", low=0, high=86400, low_inclusive=True)
    torch_min_free_mib: int = setting(
        MIN_FREE, INTEGER, 1024, "free memory (MiB, from NVML) a GPU needs before torch-cuda, model or nccl "
        "start CUDA work on it; below it the GPU is not checked (a warning); `0` turns the check off", low=0,
        high=2**20, low_inclusive=True)


OWN_REMEDY = "the error's own remedy, in the message (see \"CUDA errors\")"
LOGGED = "details in the log"
SET_PYTHON = ("set `HEALTHCHECK_TORCH_PYTHON` to the image's Python that has torch "
              "(e.g. `/opt/conda/bin/python`)")


def fix(reason: str, what: str, remedy: str) -> Cause:
    """A cause the image's owner fixes, in the image or a setting."""
    return cause(reason, what, remedy, action="fix-config", actor="tenant")


INTERPRETER_NOT_FOUND = fix("interpreter-not-found", "the `HEALTHCHECK_TORCH_PYTHON` interpreter is not "
                            "found or cannot be run", SET_PYTHON)
BAD_OUTPUT = fix("bad-output", "worker output unreadable (no or several result lines, not strict JSON, a "
                 "number no float can hold such as 1e999, a field of the wrong type)", "the interpreter is "
                 "not a working Python with torch; check `HEALTHCHECK_TORCH_PYTHON`")
KILLED = fix("killed", "worker killed by a signal", "check the container's memory limit (SIGKILL: out of "
             "memory?), dmesg and the torch install (SIGSEGV, SIGBUS, SIGABRT: a crash in torch or the "
             "driver)")
WORKLOAD_MEMORY = cause("workload-memory", "NVML says a GPU has less free memory than the probe needs "
                        "(`HEALTHCHECK_TORCH_MIN_FREE_MIB`, plus the model's size for model, plus 256 MiB of "
                        "NCCL's buffers for nccl): not checked, nothing started there; the other GPUs are "
                        "checked", "none: the workload holds the memory; not a fault", "warn", action="none",
                        actor="tenant")
HELD_BACK = cause("checkpointed", "a CUDA process here is locked or checkpointed (the checkpoint probe, or "
                  "its marker from an earlier run): no GPU work is started", "none: it runs again once the "
                  "process is restored", "skip", action="none", actor="tenant")

# The causes of CUDA errors (cuda_errors.py maps each class of its table, and some rows, to one).
CUDA_FATAL = cause("cuda-fatal", "sticky CUDA error, one NVIDIA's runtime documentation says leaves the "
                   "process unusable (illegal address, launch failure or timeout, device-side assert, "
                   "misaligned address, ...), or an uncorrectable ECC or NVLink error; latches (see \"CUDA "
                   "errors\")", "restart the container; check dmesg for Xid errors (each error's own remedy "
                   "is in the message)", action="restart-container", actor="operator")
CUDA_ERROR = fix("cuda-error", "another CUDA error (no kernel image for this GPU, invalid device ordinal, "
                 "invalid configuration, a cuBLAS/cuDNN status, ...): fails, never latches", OWN_REMEDY)
OOM = cause("oom", "out of memory for the probe's own context, tensors or buffers (CUDA's, or cuBLAS's or "
            "cuDNN's `*_ALLOC_FAILED`)", "the workload is using the memory; not checked, not a fault", "warn",
            action="none", actor="tenant")
DEVICE_BUSY = cause("device-busy", "GPU held by the workload in EXCLUSIVE_PROCESS mode (\"busy or "
                    "unavailable\"); the message names the holding PID", "the workload holds the GPU, so the "
                    "probe cannot open a context there; not a fault", "warn", action="none", actor="tenant")
MPS_BUSY = cause("mps-busy", "GPU shared through MPS: the probe cannot open its own context; the message "
                 "names the MPS clients", "the GPU is shared through MPS and the probe cannot open its own "
                 "context there; not checked, not a fault", "warn", action="none", actor="tenant")
CUDA_UNAVAILABLE = fix("cuda-unavailable", "`torch.cuda.is_available()` false / no GPU visible",
                       "start the container with `--gpus all` (NVIDIA Container Toolkit) and check the host "
                       "driver with `nvidia-smi`")
DRIVER_TOO_OLD = cause("driver-too-old", "the driver's CUDA version (NVML `nvmlSystemGetCudaDriverVersion`, "
                       "or torch's own message) older than `torch.version.cuda`; the message gives both",
                       "install a newer NVIDIA driver on the host, or the CUDA forward-compatibility package "
                       "(`cuda-compat`) on data-center GPUs, or use an image built for an older CUDA",
                       action="fix-config", actor="operator")
FABRIC_MANAGER = cause("fabric-manager", "CUDA error 802 at start (system not yet initialized): NVIDIA "
                       "Fabric Manager is not running on an NVSwitch system", "start `nvidia-fabricmanager` "
                       "on the host (the driver's version) and wait for the fabric state Completed",
                       action="fix-config", actor="operator")
FORWARD_COMPAT = fix("forward-compat", "CUDA error 804 at start: the forward-compatibility package "
                     "(`cuda-compat`) on a GPU that does not support it", "remove `cuda-compat` from the "
                     "image's library path, or upgrade the host driver")
CUDA_UNKNOWN = cause("cuda-unknown", "CUDA's unknown error (999)", "check `nvidia-smi` and dmesg for Xid "
                     "errors; in a container after a host `systemctl daemon-reload`, recreate the container",
                     action="restart-container", actor="operator")
CUDA_INIT = cause("cuda-init", "CUDA cannot start for another reason (initialization error, a stub libcuda, "
                  "no vGPU license, MPS daemon unreachable, ...)", OWN_REMEDY, action="fix-config",
                  actor="operator")
CUDA_CAUSES = (CUDA_UNAVAILABLE, DRIVER_TOO_OLD, DEVICE_BUSY, MPS_BUSY, OOM, CUDA_FATAL, CUDA_ERROR,
               FABRIC_MANAGER, DRIVER_MISMATCH, FORWARD_COMPAT, CUDA_UNKNOWN, CUDA_INIT)


# The workers' protocol (worker_base.py writes it): one line PREFIX + JSON on stdout, PHASE + name on
# stderr. A report enters only through here, each field checked against a schema of kinds.

STR, INT, NUM, MEASURE, BOOL = "str", "int", "num", "measure", "bool"  # a schema: {"name": "kind" or "kind?"}
MAX_STR = 1000  # characters of any string field, before cleaning
MAX_ITEMS = 1024  # of a list: devices (GPUs), processes
# Host memory's words (and MemoryError as a whole word: torch's OutOfMemoryError is the GPU's).
MEMORY_WORDS = ("cannot allocate memory", "failed to map segment from shared object", "std::bad_alloc")
# What every worker run records besides its report, checked again before a cached run is reused.
WORKER_RUN = {"spawn_error": "str?", "returncode": "int?", "timed_out": "bool", "stuck": "bool",
              "held_by": "int?", "budget": "num", "phase": "str?", "memory": "bool", "problem": "str?",
              "finished": "num"}


class Bad(ValueError):
    """The worker's output breaks the protocol; the message says how (safe to show)."""


def finite(value: Any) -> TypeGuard[float]:
    """A JSON number that float() turns into a finite value (a 400-digit integer does not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def check(value: Any, kind: str, nullable: bool, where: str) -> None:
    if value is None:
        if nullable:
            return
        raise Bad(f"{where} is missing")
    if kind == MEASURE and value in ("nan", "inf", "-inf"):  # how a worker spells a non-finite one
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = {STR: isinstance(value, str) and len(value) <= MAX_STR, BOOL: isinstance(value, bool),
          INT: number and isinstance(value, int)}.get(kind, number)
    if not ok:
        raise Bad(f"{where} has the wrong type")
    if kind == INT and not -2**63 <= value < 2**63:  # counts, indices, byte sizes: int64 in torch and NVML
        raise Bad(f"{where} is out of range")
    if kind in (NUM, MEASURE) and not finite(value):
        raise Bad(f"{where} is not a finite number")


def fields(obj: Any, spec: Mapping[str, Any], where: str) -> None:
    """``obj`` has exactly ``spec``'s fields, each of its kind ("kind?": or null; a spec: null or an object
    of its fields; ``[spec]``: a list of at most MAX_ITEMS such objects)."""
    if not isinstance(obj, dict):
        raise Bad(f"{where} is not an object")
    if set(obj) != set(spec):
        raise Bad(f"{where} has unexpected or missing fields")
    for key, kind in spec.items():
        if isinstance(kind, list):
            if not isinstance(obj[key], list) or len(obj[key]) > MAX_ITEMS:
                raise Bad(f"{where}.{key} is not a list")
            for i, item in enumerate(obj[key]):
                fields(item, kind[0], f"{where}.{key}[{i}]")
        elif isinstance(kind, dict):
            if obj[key] is not None:
                fields(obj[key], kind, f"{where}.{key}")
        else:
            check(obj[key], kind.rstrip("?"), kind.endswith("?"), f"{where}.{key}")


def cleaned(value: Any, limit: int, limits: Mapping[str, int] | None = None, key: str = "") -> Any:
    """A validated report with every string cleaned to ``limit`` (``limits``: per field name)."""
    if isinstance(value, dict):
        return {k: cleaned(v, limit, limits, k) for k, v in value.items()}
    if isinstance(value, list):
        return [cleaned(v, limit, limits, key) for v in value]
    if isinstance(value, str):
        return untrusted.clean(value, (limits or {}).get(key, limit))
    return value


def result(stdout: bytes, prefix: str) -> Any:
    hits = [line for line in stdout.decode("utf-8", "replace").splitlines() if line.startswith(prefix)]
    if len(hits) != 1:
        raise Bad("more than one result line" if hits else "no result line")
    try:
        return untrusted.load_json(hits[0][len(prefix):])
    except ValueError as exc:
        raise Bad(f"the result line is not readable JSON: {untrusted.clean(exc, 80)}") from None


def arrived(stdout: bytes, prefix: str) -> bool:
    """Whether the output so far holds a whole result line, its line break included."""
    marker = prefix.encode()
    return marker in stdout and any(line.startswith(marker) and line.endswith((b"\n", b"\r"))
                                    for line in stdout.splitlines(keepends=True))


def out_of_memory(text: bytes | str) -> bool:
    import re

    low = (text.decode("utf-8", "replace") if isinstance(text, bytes) else text).lower()
    return any(word in low for word in MEMORY_WORDS) or re.search(r"\bmemoryerror\b", low) is not None


def last_phase(stderr: bytes, phase: str, names: str) -> str | None:
    """The last progress marker in ``stderr`` whose whole name matches the pattern ``names``."""
    import re

    said = [line[len(phase):].strip() for line in stderr.decode("utf-8", "replace").splitlines()
            if line.startswith(phase)]
    return next((name for name in reversed(said) if re.fullmatch(names, name)), None)


def parse(stdout: bytes, prefix: str, validate: Callable[[Any], dict[str, Any]]) -> tuple[Any, str | None]:
    try:
        return validate(result(stdout, prefix)), None
    except Bad as exc:
        return None, str(exc)


# Do no harm (docs/probes.md, "Do no harm"): before a CUDA worker starts, NVML says which GPUs have room
# for it; the worker sees only those, by UUID (``nvidia-smi --query-gpu=index,uuid,memory.free``).

class Gpu(Record):
    index: int  # NVML's index, as nvidia-smi shows it
    uuid: str
    free_mib: int | None  # None: NVML did not say
    total_mib: int | None


class Room(Record):
    need_mib: int
    allowed: tuple[Gpu, ...] = ()  # the GPUs the worker may use
    full: tuple[Gpu, ...] = ()  # not checked: the workload holds the memory
    unknown: str | None = None  # why NVML could not say, when it could not (then nothing is held back)

    def facts(self) -> dict[str, Any]:
        full = [{"index": g.index, "free_mib": g.free_mib, "total_mib": g.total_mib} for g in self.full]
        return {"need_mib": self.need_mib, "unknown": self.unknown, "full": full}


def survey(need_mib: int, env: Mapping[str, str]) -> Room:
    """Which of the GPUs the worker would see (``CUDA_VISIBLE_DEVICES`` in ``env``) have ``need_mib``
    MiB free; a lost GPU is left out (the nvml probe reports it)."""
    from probes.hardware import nvml, nvml_lib

    if need_mib <= 0:
        return Room(need_mib, unknown="off (HEALTHCHECK_TORCH_MIN_FREE_MIB=0)")
    try:
        nv = nvml_lib.init()
    except nvml_lib.NvmlUnavailable as exc:
        return Room(need_mib, unknown=f"NVML unavailable ({exc.reason})")
    gpus: list[Gpu] = []
    try:
        count, err = nvml_lib.call(nv.nvmlDeviceGetCount)
        if err is not None:
            return Room(need_mib, unknown=f"NVML error {err}")
        for index in range(min(count, MAX_ITEMS)):
            handle, err = nvml_lib.call(nv.nvmlDeviceGetHandleByIndex, index)
            mig, _ = nvml_lib.call(nv.nvmlDeviceGetMigMode, handle) if err is None else (None, None)
            if mig is not None and mig[0]:
                return Room(need_mib, unknown="MIG mode (a MIG device's own memory is not read)")
            uuid, err = nvml_lib.call(nv.nvmlDeviceGetUUID, handle) if err is None else (None, err)
            if err is None:
                mem, err = nvml_lib.call(nv.nvmlDeviceGetMemoryInfo, handle)
                free, total = (None, None) if err is not None else (int(mem.free) >> 20, int(mem.total) >> 20)
                gpus.append(Gpu(index, nvml_lib.text(uuid), free, total))
    finally:
        nvml_lib.shutdown()
    wanted = env.get("CUDA_VISIBLE_DEVICES")
    if wanted is not None:
        selected, _ = nvml.cuda_visible(wanted, [g.uuid for g in gpus])
        gpus = [g for u in selected for g in gpus if g.uuid == u]
    full = tuple(g for g in gpus if g.free_mib is not None and g.total_mib != 0 and g.free_mib < need_mib)
    silent = [str(g.index) for g in gpus if g.free_mib is None]
    zero = [str(g.index) for g in gpus if g.total_mib == 0]
    whys = ([f"NVML gives no free memory for GPU {', '.join(silent)}"] if silent else []) + (
        [f"NVML reports 0 MiB of memory for GPU {', '.join(zero)} (misreported)"] if zero else [])
    return Room(need_mib, tuple(g for g in gpus if g not in full), full, "; ".join(whys) or None)


def room_facts(value: Any) -> dict[str, Any] | None:
    """A room's facts from a worker run's data (a cache entry included) if they are well formed."""
    try:
        fields(value, {"need_mib": INT, "unknown": "str?", "full": [{"index": INT, "free_mib": INT,
                                                                     "total_mib": "int?"}]}, "room")
    except Bad:
        return None
    return cleaned(value, 120)


def not_checked(facts: dict[str, Any], what: str) -> str:
    full = facts["full"]
    shown = [f"GPU {g['index']} ({g['free_mib']} MiB free"
             + (f" of {g['total_mib']} MiB)" if g["total_mib"] is not None else ")") for g in full[:4]]
    more = f" and {len(full) - 4} more" if len(full) > 4 else ""
    return (f"not checked: the workload holds the memory on {', '.join(shown)}{more}; the probe needs "
            f"{facts['need_mib']} MiB ({what}), so nothing was started there")


def locked_run(ctx: Context, cache: str, key: dict[str, Any],
               reuse: Callable[[dict[str, Any] | None], dict[str, Any] | None],
               run: Callable[[], dict[str, Any]],
               judge: Callable[[dict[str, Any], Context], Result], *, early: bool = False,
               hold: Callable[[Context], str | None] | None = None,
               share: Callable[[dict[str, Any] | None], dict[str, Any] | None] | None = None,
               relatch: bool = False) -> dict[str, Any]:
    """A costly run, one at a time under the lock, then recorded; readiness reuses what ``reuse`` accepts
    of ``cache`` once the lock is held (``early``: before waiting too). ``hold``: why nothing may start
    now (checkpoint.hold); ``share``: any profile takes a run that finished while this one waited;
    ``relatch``: the latch is read again under the lock."""
    why = hold(ctx) if hold else None
    if why is not None:
        return {"kind": "checkpointed", "why": why}
    state = ctx.state
    if not state.enabled:  # nothing can latch: the judge says so if the run finds a fatal error
        data = run()
        data.setdefault("latch_lost", f"state dir off: {state.disabled_reason}")
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
        finished = entry.get("finished") if entry else None
        hit = share(entry) if share and finite(finished) and float(finished) >= started else None
        if hit is None and ctx.config.profile_rules.reuses_cache:
            hit = reuse(entry)
        return hit if hit is not None else record(ctx, cache, key, run(), judge)


def latched(latch: dict[str, Any]) -> dict[str, Any]:
    """What judge() reads of the latch (a sticky CUDA error, or an Xid): a run that starts nothing."""
    raw: Any = latch.get("time")
    since = float(raw) if finite(raw) else 0.0
    if not 0 < since <= time.time() + 86400:
        since = 0.0  # damaged: shown as an unknown time, never a crash
    return {"kind": "latched", "source": untrusted.clean(latch.get("source", "?"), 40),
            "why": untrusted.clean(latch.get("reason", "?")), "since": since,
            "age": round(max(time.time() - since, 0.0), 1) if since else None}


def record(ctx: Context, cache: str, key: dict[str, Any], data: dict[str, Any],
           judge: Callable[[dict[str, Any], Context], Result]) -> dict[str, Any]:
    """After a costly run, under the lock: a sticky CUDA error latches and the run is cached, unless its
    worker lingered (its entry goes: no older pass is served after it) or nothing started."""
    if data["kind"] == WORKLOAD_MEMORY.reason:
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


def fresh_pass(entry: dict[str, Any] | None, key: dict[str, Any],
               ttl: float) -> tuple[dict[str, Any], float, float] | None:
    """(data, finished, age) of a pass cached under ``key`` younger than ``ttl``, else None."""
    if not entry or entry.get("key") != key or entry.get("status") != Status.PASS.value:
        return None
    data, finished = entry.get("data"), entry.get("finished")
    if not isinstance(data, dict) or not finite(finished):
        return None
    age = time.time() - float(finished)
    return (data, float(finished), age) if 0 <= age < ttl else None


def cached(entry: dict[str, Any] | None, key: dict[str, Any], validate: Callable[[Any], dict[str, Any]],
           phases: str, extra: Mapping[str, str] | None = None,
           ttl: float | None = None) -> dict[str, Any] | None:
    """The worker run cached under ``key`` (with ``ttl``: a pass younger than that), checked again with
    ``extra``, the probe's own fields: a damaged entry is a miss, never a crash."""
    import re

    if ttl is not None and fresh_pass(entry, key, ttl) is None:
        return None
    data = entry.get("data") if entry and entry.get("key") == key else None
    if (not isinstance(data, dict) or data.get("kind") != "worker" or data.get("lingered", False) is not False
            or any(data[k] != v for k, v in key.items() if k in data)):  # its own copy of the key's fields
        return None
    schema = {**WORKER_RUN, **(extra or {})}
    try:
        fields({name: data.get(name) for name in schema}, schema, "cached")
        if data["phase"] is not None and not re.fullmatch(phases, data["phase"]):
            return None
        report = None if data.get("report") is None else validate(data["report"])
    except Bad:
        return None
    age = time.time() - float(data["finished"])
    return {"kind": "worker", "lingered": False, "report": report, "room": room_facts(data.get("room")),
            **cleaned({name: data[name] for name in schema}, untrusted.MAX_TEXT),
            "cache": {"how": "shared" if ttl is None else "ttl", "age": round(max(age, 0.0), 1)}}


def run_worker(ctx: Context, name: str, args: list[str], env: dict[str, str], worker: ModuleType,
               validate: Callable[[Any], dict[str, Any]], phases: str,
               need_mib: int) -> tuple[dict[str, Any], proc.Completed | None]:
    """``worker`` run by the image's Python under the deadline on the GPUs with ``need_mib`` MiB free
    (CUDA_VISIBLE_DEVICES narrowed to them): what judge() reads, and the process (None when none started)."""
    from probes import orphans, proc

    # What a killed suite left goes first; one that survives SIGKILL may hold the GPU: no second worker.
    space = None
    env = {**os.environ, "CUDA_MODULE_LOADING": "LAZY", **env}
    held = orphans.end()
    if held:
        logger().info("%s: processes of a killed run survive SIGKILL: %s", name, held)
    elif ctx.config.of(Torch).torch_device == "cuda":
        space = survey(need_mib, os.environ)
        if space.full and not space.allowed:
            return {"kind": WORKLOAD_MEMORY.reason, "room": space.facts(), "lingered": False,
                    "finished": time.time()}, None
        if space.full:  # else the caller's CUDA_VISIBLE_DEVICES stays as it is
            env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in space.allowed)
    deadline = ctx.deadline - deadlines.MARGIN
    budget = max(0.0, deadline - time.monotonic())
    argv = [ctx.config.of(Torch).torch_python, str(worker.__file__), *args]
    done = proc.Completed(tuple(argv), None, stuck=True, held_by=held[0]) if held else proc.run(
        argv, deadline=deadline, env=env, state=ctx.state, key=name,
        until=lambda out: arrived(out, worker.PREFIX), linger=deadlines.LINGER)
    report, problem = parse(done.stdout, worker.PREFIX, validate)
    if (report is None or report.get("error") or done.timed_out or done.lingered
            or any(isinstance(d, dict) and d.get("error") for d in report.get("devices", ()))):
        # The details stay in the log; messages carry only fixed phrases.
        logger().info("%s worker rc=%s timed_out=%s lingered=%s stderr tail: %s", name, done.returncode,
                      done.timed_out, done.lingered, untrusted.squeeze(done.stderr[-2000:], 600))
    return {"kind": "worker", "spawn_error": done.spawn_error, "returncode": done.returncode,
            "timed_out": done.timed_out, "lingered": done.lingered, "stuck": done.stuck,
            "held_by": done.held_by, "budget": round(budget, 2),
            "phase": last_phase(done.stderr, worker.PHASE, phases),
            "memory": out_of_memory(done.stderr), "report": report, "problem": problem,
            "finished": time.time(), "cache": None, "room": None if space is None else space.facts()}, done


def judged(name: str, data: dict[str, Any], ctx: Context,
           judge_run: Callable[[dict[str, Any], Context], Result], *, room: str, deadline: Cause,
           unit: str) -> Result:
    """A deep check's judge(): what every one says alike (held back, no lock in time, no GPU with room for
    ``room``), else ``judge_run``'s result with the GPUs left out, a lost latch and a reused result."""
    kind = data.get("kind")
    if kind == "checkpointed":
        return verdict(name, HELD_BACK, f"not started: {untrusted.clean(data['why'], 200)}", remedy=False,
                       unit=unit)
    if kind == "lock-timeout":
        return lock_timeout(name, data, deadline, unit=unit)
    if kind == WORKLOAD_MEMORY.reason:
        return verdict(name, WORKLOAD_MEMORY, not_checked(data["room"], room), remedy=False,
                       unit=unit, facts={"room": data["room"]})
    result = judge_run(data, ctx)
    facts = room_facts(data.get("room"))
    if facts is not None:
        result = result._replace(facts={**result.facts, "room": facts})
        if facts["full"]:
            message = f"{result.message}; {not_checked(facts, room)}"
            result = (verdict(name, WORKLOAD_MEMORY, message, remedy=False, observed=result.observed,
                              unit=result.unit, facts=result.facts) if result.status is Status.PASS
                      else result._replace(message=message))
    why = data.get("latch_lost")
    if result.facts.get("fatal") and why:
        # Later runs will not remember it: nothing may promise "unhealthy until the container restarts".
        said = f"the latch could not be kept ({untrusted.clean(why, 160)}), later runs will not remember it"
        message = (result.message.replace(UNTIL_RESTART, said) if UNTIL_RESTART in result.message
                   else f"{result.message}; {said}")
        result = result._replace(message=message, facts={**result.facts, "latch_kept": False})
    cache = data.get("cache") or {}
    if cache.get("how") in ("ttl", "shared"):
        how = (f"cached, {cache.get('age', 0):.0f}s old" if cache["how"] == "ttl"
               else f"shared with a concurrent run, {cache.get('age', 0):.1f}s old")
        result = result._replace(message=f"{result.message} ({how})", facts={**result.facts, "cache": cache})
    return result


def lock_timeout(name: str, data: dict[str, Any], cause: Cause | None = None, **kw: Any) -> Result:
    from probes import runner

    return verdict(name, cause or runner.DEADLINE, f"no result within {data['waited']:.1f}s: another "
                   "costly check (torch-cuda, nccl or model) still holds the lock", **kw)


def cannot_run(name: str, data: dict[str, Any], python: str, not_executable: Cause = INTERPRETER_NOT_FOUND,
               **kw: Any) -> Result | None:
    """The verdict on a worker whose ``python`` cannot be run, or that a limit kept from starting."""
    from probes import childio, runner

    spawn, rc, python = data.get("spawn_error"), data.get("returncode"), untrusted.clean(python, 80)
    if childio.limited(spawn):
        return verdict(name, runner.LIMIT, f"not checked: the worker {spawn}", remedy=False, **kw)
    # 127 is also the loader's status when a library cannot be mapped (RLIMIT_AS): its words tell.
    if spawn == "not found" or (data.get("report") is None and rc == 127 and not data.get("memory")):
        return verdict(name, INTERPRETER_NOT_FOUND, f"torch interpreter {python} not found", **kw)
    if spawn or (data.get("report") is None and rc == 126):
        return verdict(name, not_executable, f"torch interpreter {python} cannot be run "
                       f"({spawn or 'not executable'})", **kw)
    return None


def no_report(name: str, data: dict[str, Any], what: str, *, stuck: Cause, timed_out: Cause,
              excerpt: str = "", **kw: Any) -> Result:
    from probes import proc

    where = data.get("phase") or "start-up"
    if data.get("held_by") is not None:
        return verdict(name, stuck, f"an earlier {what} (pid {data['held_by']}) is still stuck in the GPU "
                       "driver (uninterruptible sleep); not starting another", **kw)
    if data.get("stuck"):
        return verdict(name, stuck, f"{what} stuck in {where} and survived SIGKILL (uninterruptible sleep), "
                       "the GPU driver is wedged", **kw)
    if data.get("timed_out"):
        return verdict(name, timed_out, f"{what} gave no result within {data.get('budget', 0):.1f}s "
                       f"(killed while in {where})", **kw)
    rc = data.get("returncode")
    if isinstance(rc, int) and rc < 0:
        return verdict(name, KILLED, f"{what} killed by {proc.signal_name(-rc)} in {where}", **kw)
    return verdict(name, BAD_OUTPUT, f"{what} gave an unreadable result "
                   f"({data.get('problem')}, exit status {rc}){excerpt}", **kw)
