"""torch-cuda: the image's own Python can import torch and run a real, verified op on each GPU.

A worker (``torch_worker.py``) runs in ``HEALTHCHECK_TORCH_PYTHON``; only its result line is
trusted, once torch_report.py has checked it, and a CUDA error is judged by its table
(cuda_errors.py); the lock, cache and latch are deep.py's. Behaviour: docs/probes.md ("How the
probes decide", "CUDA errors").

Command-line equivalent::

    CUDA_MODULE_LOADING=LAZY python3 probes/framework/torch_worker.py --device cuda
"""

from __future__ import annotations

import math
import os
import time

from probes import deadlines, untrusted
from probes import framework as fw
from probes.context import Context
from probes.framework import deep, protocol
from probes.framework.deep import fresh_pass
from probes.framework.protocol import BOOL, INT, NUM, STR
from probes.framework.torch_report import PHASES, identify, last_phase, memory_limit, parse_output, validate
from probes.result import SEVERITY, Result, passed, verdict
from probes.state import life_identity

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from probes.config import Config

UNIT = "devices"

SPEC = fw.TORCH_SPEC


def requirements(config: Config) -> tuple[str, ...]:
    """The hardware layer is a prerequisite only for the GPU: a CPU-only image has none. On the
    GPU, a CUDA-checkpointed process (the checkpoint probe, when it runs) holds the op back."""
    return (*SPEC.requires, "checkpoint") if config.of(fw.Torch).torch_device == "cuda" else ()

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_worker.py")
CACHE = "torch-cuda.json"
SIZE = 1024  # 2 GFLOP: enough blocks to occupy a GPU, ~50 ms for the float64 CPU reference
# float32 vs float64 at this size differs by ~4e-7 of the largest value; TF32 would
# give ~1e-3 and a flipped exponent or high mantissa bit far more.
TOLERANCE = 1e-4
_FOUND_VERSION = r"found version (\d+)"  # in CUDA's "driver too old" message
_CUDA_VERSION = r"(\d{1,3})\.(\d{1,3})"


# ---------------------------------------------------------------------------
# gather: the only part that runs processes or touches the state dir
# ---------------------------------------------------------------------------

def expected_count(ctx: Context) -> int | None:
    """NVML's device count when the hardware layer ran and passed, for device cuda."""
    if ctx.config.of(fw.Torch).torch_device != "cuda":
        return None
    from probes import hardware

    seen = hardware.seen(ctx.results)
    return seen.count if seen is not None and seen.ok else None


def _argv(ctx: Context, expect: int | None) -> list[str]:
    own = ctx.config.of(fw.Torch)
    argv = [own.torch_python, WORKER, "--device", own.torch_device, "--size", str(SIZE)]
    if expect is not None:
        argv += ["--expect-count", str(expect)]
    return argv


def result_arrived(stdout: bytes) -> bool:
    from probes.framework import torch_worker

    return protocol.arrived(stdout, torch_worker.PREFIX)


def run_worker(ctx: Context, expect: int | None) -> dict[str, Any]:
    from probes.framework import torch_worker

    own = ctx.config.of(fw.Torch)
    device = own.torch_device
    data, done = deep.deep_worker(ctx, SPEC.name, _argv(ctx, expect), {},
                                  lambda out: parse_output(out, device, SIZE), last_phase, result_arrived,
                                  own.torch_min_free_mib)
    if done is None:
        return data
    shown = done.stdout
    if not shown.strip():  # nothing on stdout: the last line of stderr that is not a progress marker
        phase = torch_worker.PHASE.encode()
        lines = [ln for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith(phase)]
        shown = lines[-1] if lines else b""
    excerpt = untrusted.squeeze(shown, 80) if data["report"] is None else None
    return {**data, "python": own.torch_python, "device": device, "expect": expect,
            "elapsed": round(done.elapsed, 3), "excerpt": excerpt}


def _key(ctx: Context, expect: int | None) -> dict[str, Any]:
    own = ctx.config.of(fw.Torch)
    return {"python": own.torch_python, "device": own.torch_device, "size": SIZE,
            "expect": expect, "identity": life_identity()}


# What judge() reads of a cached worker run, checked before reuse.
_DATA = {"spawn_error": (STR, True), "returncode": (INT, True), "timed_out": (BOOL, False),
         "stuck": (BOOL, False), "held_by": (INT, True), "budget": (NUM, False), "elapsed": (NUM, False),
         "phase": (STR, True), "problem": (STR, True), "excerpt": (STR, True), "finished": (NUM, False)}


def _reuse(entry: dict[str, Any] | None, key: dict[str, Any], how: str) -> dict[str, Any] | None:
    """The cached worker run, checked and cleaned, or None: a damaged entry is a miss, never a crash."""
    import re

    from probes.framework import free_memory

    if not entry or entry.get("key") != key or not isinstance(entry.get("data"), dict):
        return None
    data = entry["data"]
    if (data.get("kind") != "worker" or data.get("lingered", False) is not False
            or [data.get(k) for k in ("python", "device", "expect")]
            != [key["python"], key["device"], key["expect"]]):
        return None
    try:
        for name, (kind, nullable) in _DATA.items():
            protocol.check(data.get(name), kind, nullable, name)
        if data["phase"] is not None and not re.fullmatch(PHASES, data["phase"]):
            return None
        report = None if data.get("report") is None else validate(data["report"], key["device"], key["size"])
    except protocol.Bad:
        return None
    age = time.time() - float(data["finished"])
    out: dict[str, Any] = {"kind": "worker", "python": key["python"], "device": key["device"],
                           "expect": key["expect"], "lingered": False, "report": report,
                           **{name: untrusted.clean(data[name]) if kind == STR and data[name] is not None
                              else data[name] for name, (kind, _) in _DATA.items()}}
    out["cache"] = {"how": how, "age": round(max(age, 0.0), 1)}
    out["room"] = free_memory.read(data.get("room"))
    return out


def _cached_pass(entry: dict[str, Any] | None, key: dict[str, Any], ttl: float) -> dict[str, Any] | None:
    """A passing result younger than the TTL (see fresh_pass), checked by _reuse."""
    return _reuse(entry, key, "ttl") if fresh_pass(entry, key, ttl) is not None else None


def gather(ctx: Context) -> dict[str, Any]:
    state = ctx.state
    latch = state.latch()
    if latch is not None:
        return deep.latched(latch)
    if not ctx.config.profile_rules.spawns_worker:
        return {"kind": "no-latch", "state_off": state.disabled_reason}
    if ctx.config.of(fw.Torch).torch_device == "cuda":
        from probes.framework import checkpoint

        why = checkpoint.hold(ctx)  # an earlier run saw a checkpointed process that still exists
        if why is not None:
            return {"kind": "checkpointed", "why": why}

    expect = expected_count(ctx)
    key = _key(ctx, expect)
    ttl = ctx.config.of(fw.Torch).torch_ttl
    return deep.locked_run(ctx, CACHE, key, lambda entry: _cached_pass(entry, key, ttl),
                           lambda: run_worker(ctx, expect), judge, early=True,
                           share=lambda entry: _reuse(entry, key, "shared"), relatch=True)


def on_deadline(ctx: Context) -> Result:
    return verdict(SPEC.name, fw.TORCH_DEADLINE, "no result within the deadline from the torch worker",
                   unit=UNIT)


# ---------------------------------------------------------------------------
# judge: pure
# ---------------------------------------------------------------------------

def _norm_uuid(uuid: Any) -> str:
    text = str(uuid or "").lower()
    return text[4:] if text.startswith("gpu-") else text


def _holder(ctx: Context, report: dict[str, Any], index: int, uuid: str | None) -> str:
    """Who holds a busy device, from the nvml probe's facts, as a short phrase."""
    from probes import hardware

    seen = hardware.seen(ctx.results)
    gpus = seen.gpus if seen is not None else ()
    gpu = None
    if uuid:
        gpu = next((g for g in gpus if _norm_uuid(g.uuid) == _norm_uuid(uuid)), None)
    if gpu is None and report.get("visible_devices") is None:
        gpu = next((g for g in gpus if g.index == index), None)
    if gpu is None:
        return ""
    parts = []
    if gpu.compute_mode not in ("DEFAULT", "N/A"):
        parts.append(f"{untrusted.clean(gpu.compute_mode, 40)} compute mode")
    if gpu.processes:
        # Process names come from NVML (any user's command line): cleaned, short.
        who = ", ".join(f"{'MPS client ' if mps else ''}pid {pid} ({untrusted.clean(name, 40)})"
                        for pid, name, mps in gpu.processes[:3])
        parts.append(f"held by {who}")
    return f" ({'; '.join(parts)})" if parts else ""


def _suffix(data: dict[str, Any]) -> str:
    cache = data.get("cache") or {}
    if cache.get("how") == "ttl":
        return f" (cached, {cache.get('age', 0):.0f}s old)"
    if cache.get("how") == "shared":
        return f" (shared with a concurrent run, {cache.get('age', 0):.1f}s old)"
    return ""


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f}"


def judge(data: dict[str, Any], ctx: Context) -> Result:
    kind = data.get("kind")
    if kind == "latched":
        when = (f"since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(data['since']))} "
                f"({data['age']:.0f}s ago, " if data["since"] else "(since an unknown time, ")
        return verdict(SPEC.name, fw.TORCH_LATCHED,
                       f"latched unhealthy {when}by {data['source']}): {data['why']}",
                       unit=UNIT, facts={"latched": True, "since": data["since"], "source": data["source"]})
    if kind == "checkpointed":
        return verdict(SPEC.name, fw.HELD_BACK, f"not started: {untrusted.clean(data['why'], 200)}",
                       remedy=False, unit=UNIT)
    if kind == "no-latch":
        off = data.get("state_off")
        note = f" ({deep.state_off(off)}; a fatal error cannot latch)" if off else ""
        return passed(SPEC.name, f"no CUDA-fatal latch{note}", unit=UNIT, facts={"latched": False})
    if kind == "lock-timeout":
        return deep.lock_timeout(SPEC.name, data, fw.TORCH_DEADLINE, unit=UNIT)
    from probes.framework import free_memory  # not before: liveness answers above without it

    if kind == free_memory.REASON:
        return deep.not_checked(SPEC.name, data, fw.MIN_FREE, unit=UNIT)
    result = deep.unkept(deep.with_room(_judge_worker(data, ctx), data, fw.MIN_FREE), data)
    suffix = _suffix(data)
    if suffix:
        result = result._replace(message=result.message + suffix,
                                 facts={**result.facts, "cache": data.get("cache")})
    return result


def _judge_worker(data: dict[str, Any], ctx: Context) -> Result:
    from probes import proc

    python = untrusted.clean(data.get("python", "?"), 80)
    facts: dict[str, Any] = {"python": data.get("python"), "device": data.get("device"),
                             "cache": data.get("cache")}
    kw: dict[str, Any] = {"unit": UNIT, "facts": facts}
    report = data.get("report")
    if (limit := deep.limited(SPEC.name, data, **kw)) is not None:
        return limit
    # 127 is also the dynamic loader's status when a library cannot be mapped (RLIMIT_AS): its
    # words on stderr tell that from a missing interpreter.
    if data.get("spawn_error") == "not found" or (report is None and data.get("returncode") == 127
                                                  and not data.get("memory")):
        return verdict(SPEC.name, fw.INTERPRETER_NOT_FOUND, f"torch interpreter {python} not found", **kw)
    if data.get("spawn_error") or (report is None and data.get("returncode") == 126):
        why = data.get("spawn_error") or "not executable"
        return verdict(SPEC.name, fw.TORCH_NOT_EXECUTABLE,
                       f"torch interpreter {python} cannot be run ({why})", **kw)
    if data.get("lingered") and not data.get("stuck"):
        return verdict(SPEC.name, fw.TORCH_LINGERED, "torch worker printed its result but did not exit "
                       f"within {deadlines.LINGER:.1f} s: its result is not used; "
                       "something keeps running after the worker "
                       "(a wrapper script as HEALTHCHECK_TORCH_PYTHON, "
                       "or a hang in torch or the driver at exit)", **kw)
    if report is not None and not data.get("lingered"):
        return _judge_report(report, data, ctx, python, kw)
    where = data.get("phase") or "start-up"
    if data.get("held_by") is not None:
        return verdict(SPEC.name, fw.TORCH_STUCK, f"an earlier torch worker (pid {data['held_by']}) is still "
                       "stuck in the GPU driver (uninterruptible sleep); not starting another", **kw)
    if data.get("stuck"):
        return verdict(SPEC.name, fw.TORCH_STUCK, f"torch worker stuck in {where} and survived SIGKILL "
                       "(uninterruptible sleep), the GPU driver is wedged", **kw)
    if data.get("timed_out"):
        return verdict(SPEC.name, fw.TORCH_DEADLINE, "torch worker gave no result within "
                       f"{data.get('budget', 0):.1f}s (killed while in {where})", **kw)
    if (memory := memory_limit(None, data)) is not None:
        return verdict(SPEC.name, fw.TORCH_MEMORY_LIMIT, f"torch worker in {python}: {memory}", remedy=False,
                       **kw)
    rc = data.get("returncode")
    if isinstance(rc, int) and rc < 0:
        return verdict(SPEC.name, fw.KILLED, f"torch worker killed by {proc.signal_name(-rc)} in {where}",
                       **kw)
    return verdict(SPEC.name, fw.BAD_OUTPUT, "torch worker gave an unreadable result "
                   f"({data.get('problem')}, exit status {rc}): '{data.get('excerpt') or ''}'", **kw)


def _judge_report(report: dict[str, Any], data: dict[str, Any], ctx: Context, python: str,
                  kw: dict[str, Any]) -> Result:
    from probes.framework import free_memory

    facts = kw["facts"]
    facts.update({"torch": report["torch"], "cuda": report["cuda"], "count": report["count"]})
    err = report["error"]
    cuda = report["device"] == "cuda"
    if (memory := memory_limit(report, data)) is not None:
        return verdict(SPEC.name, fw.TORCH_MEMORY_LIMIT, f"torch worker in {python}: {memory}", remedy=False,
                       **kw)
    if err is not None and err["phase"] == "import":
        if err["module"] == "torch":
            return verdict(SPEC.name, fw.TORCH_MISSING, f"torch is not installed for {python}", **kw)
        what = (f"module {err['module']!r} is missing" if err["module"]
                else f"{err['type']}; details in the log")
        return verdict(SPEC.name, fw.TORCH_IMPORT_FAILED, f"import torch failed in {python} ({what})", **kw)
    if cuda and report["available"] is False and report["cuda_built"] is False:
        return verdict(SPEC.name, fw.TORCH_CPU_ONLY, f"CUDA not available: torch {report['torch'] or '?'} "
                       f"in {python} is a CPU-only build", **kw)
    if cuda and report["available"] is False and _driver_older(report, ctx):
        return _too_old(report, _driver_cuda(ctx), kw)
    if err is not None and err["phase"] == "init":
        return _device_error(err, report, ctx, kw, None) or verdict(
            SPEC.name, fw.CUDA_UNAVAILABLE, "CUDA not available (torch.cuda.is_available() is False)", **kw)
    if err is not None:
        return verdict(SPEC.name, fw.TORCH_ERROR,
                       f"the torch worker failed in {err['phase']} ({err['type']})", **kw)
    count = report["count"] or 0
    if cuda and count == 0:
        return verdict(SPEC.name, fw.CUDA_UNAVAILABLE, "CUDA not available: torch sees no GPU", **kw)
    notes = []
    expect = data.get("expect")
    held = free_memory.read(data.get("room"))
    if expect is not None and held is not None:
        expect -= len(held["full"])  # those were kept from the worker (CUDA_VISIBLE_DEVICES)
    if cuda and expect is not None and count != expect:
        if report["visible_devices"] is None or count > expect:
            return verdict(SPEC.name, fw.TORCH_COUNT_MISMATCH,
                           f"torch sees {count} GPU(s) but NVML sees {expect}",
                           observed=count, **kw)
        notes.append(f"{count} of {expect} GPUs visible through CUDA_VISIBLE_DEVICES")

    return _judge_devices(report, ctx, kw, notes)


def _device_error(err: dict[str, Any], report: dict[str, Any], ctx: Context, kw: dict[str, Any],
                  entry: dict[str, Any] | None) -> Result | None:
    """The result for one identified CUDA error, or None when it is not one we can name."""
    import re

    from probes.framework import cuda_errors

    found = identify(err)
    if found is None:
        return None
    error = found.error
    where = "the GPU(s)" if entry is None else f"cuda:{entry['index']}"
    kw["facts"]["cuda_error"] = {"code": error.code, "name": error.name, "category": error.category,
                                 "how": found.how}
    if error.category == cuda_errors.NOT_CHECKED:
        index = entry["index"] if entry is not None else 0
        holder = _holder(ctx, report, index, entry["uuid"] if entry else None)
        if error.cause is fw.MPS_BUSY or (error.cause is fw.DEVICE_BUSY and "MPS client" in holder):
            return verdict(SPEC.name, fw.MPS_BUSY, f"{where} busy{holder}", **kw)
        if error.cause is fw.DEVICE_BUSY:
            return verdict(SPEC.name, fw.DEVICE_BUSY, f"{where} busy{holder}", **kw)
        return verdict(SPEC.name, fw.OOM, f"{where} out of memory for the probe's own context{holder} "
                       f"({error.label})", **kw)
    if error.cause is fw.DRIVER_TOO_OLD:
        version = re.search(_FOUND_VERSION, str(err.get("message", "")))
        driver = (f"{int(version[1]) // 1000}.{int(version[1]) % 1000 // 10}" if version
                  else _driver_cuda(ctx))
        return _too_old(report, driver, kw)
    if error.category == cuda_errors.STICKY:
        kw["facts"]["fatal"] = True
        return error.verdict(SPEC.name, f"fatal CUDA error on {where} ({error.label}): sticky, "
                             f"the CUDA context is unusable; {deep.UNTIL_RESTART}", **kw)
    if error.category == cuda_errors.ENVIRONMENT:
        return error.verdict(SPEC.name, f"CUDA cannot start on {where} ({error.label})", **kw)
    return error.verdict(SPEC.name, f"CUDA error on {where} ({error.label})", **kw)


def _driver_cuda(ctx: Context) -> str | None:
    """The highest CUDA version the driver supports ("12.4"), as the nvml probe read it."""
    import re

    from probes import hardware

    seen = hardware.seen(ctx.results)
    value = seen.cuda_driver if seen is not None else None
    return value if value is not None and re.fullmatch(_CUDA_VERSION, value) else None


def _version(text: Any) -> tuple[int, int] | None:
    import re

    found = re.match(_CUDA_VERSION, str(text or ""))
    return (int(found[1]), int(found[2])) if found else None


def _driver_older(report: dict[str, Any], ctx: Context) -> bool:
    """True when NVML says the driver supports an older CUDA than torch was built with."""
    have, need = _version(_driver_cuda(ctx)), _version(report.get("cuda"))
    return have is not None and need is not None and have < need


def _too_old(report: dict[str, Any], driver: str | None, kw: dict[str, Any]) -> Result:
    have = f", driver supports CUDA {driver}" if driver else ""
    return verdict(SPEC.name, fw.DRIVER_TOO_OLD, f"CUDA driver too old for torch {report['torch']} "
                   f"(built for CUDA {report['cuda']}{have})", **kw)


def _judge_devices(report: dict[str, Any], ctx: Context, kw: dict[str, Any], notes: list[str]) -> Result:
    cuda = report["device"] == "cuda"
    per: list[dict[str, Any]] = []
    problems: list[Result] = []
    good: list[dict[str, Any]] = []
    for entry in report["devices"]:
        tag = f"cuda:{entry['index']}" if cuda else "cpu"
        row: dict[str, Any] = {"index": entry["index"], "name": entry["name"], "uuid": entry["uuid"],
                               "op_ms": entry["op_ms"], "free": entry["free"], "total": entry["total"]}
        per.append(row)
        if entry["error"] is not None:
            res = _device_error(entry["error"], report, ctx, kw, entry) or verdict(
                SPEC.name, fw.TORCH_ERROR, f"torch op failed on {tag} ({entry['error']['type']})", **kw)
            row["status"] = res.reason
            problems.append(res)
            continue
        scale = float(entry["scale"])
        max_err = float(entry["max_err"])
        rel = max_err / scale if math.isfinite(scale) and scale > 0 else math.inf
        row["max_rel_err"] = rel if math.isfinite(rel) else None
        if not math.isfinite(rel) or rel > TOLERANCE:
            shown = f"{rel:.1e}" if math.isfinite(rel) else "not a number"
            row["status"] = "wrong-result"
            problems.append(verdict(SPEC.name, fw.TORCH_WRONG_RESULT, f"wrong result on {tag}: matmul "
                                    f"differs from the CPU reference by {shown} (tolerance {TOLERANCE:.0e})",
                                    **kw))
            continue
        row["status"] = "ok"
        good.append({**entry, "rel": rel})
    kw["facts"]["devices"] = per
    checked = len(good)
    if problems:
        worst = max(problems, key=lambda r: SEVERITY[r.status])
        others = f"; {checked} other device(s) OK" if checked else ""
        return worst._replace(message=worst.message + others, observed=checked)
    if not good:
        return verdict(SPEC.name, fw.BAD_OUTPUT, "the torch worker checked no device", **kw)
    worst_rel = max(g["rel"] for g in good)
    slow = max(good, key=lambda g: g["op_ms"])
    base = f"{report['size']}x{report['size']} matmul matches the CPU reference (max rel err {worst_rel:.0e})"
    if cuda:
        tight = min(good, key=lambda g: g["free"] if g["free"] is not None else math.inf)
        models = list(dict.fromkeys(g["name"] for g in good))  # cleaned by validate()
        shown = ", ".join(models[:2]) + (f" and {len(models) - 2} other model(s)" if len(models) > 2 else "")
        message = (f"{checked} GPU(s) OK ({shown}): {base}; slowest {slow['op_ms']:.1f} ms on "
                   f"cuda:{slow['index']}, least free {_gib(tight['free'])}/{_gib(tight['total'])} GiB on "
                   f"cuda:{tight['index']}; "
                   f"torch {report['torch']}, CUDA {report['cuda']}")
    else:
        message = f"CPU OK: {base} in {slow['op_ms']:.1f} ms; torch {report['torch']}"
    if notes:
        message += f" ({'; '.join(notes)})"
    return passed(SPEC.name, message, observed=checked, **kw)
