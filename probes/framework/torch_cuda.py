"""torch-cuda: the image's own Python imports torch and runs a verified op on each GPU in a worker
(docs/probes.md, "How the probes decide"). Command-line equivalent: ``python3 torch_worker.py``."""

from __future__ import annotations

import math
import time

from probes import deadlines, untrusted
from probes.context import Context
from probes.framework import deep
from probes.framework.deep import Torch, fix
from probes.result import SEVERITY, Result, passed, verdict
from probes.spec import ALL_PROFILES, Spec, cause
from probes.state import life_identity

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from probes.config import Config

NAME = "torch-cuda"
UNIT = "devices"
CACHE = "torch-cuda.json"
SIZE = 1024  # 2 GFLOP: enough blocks to occupy a GPU, ~50 ms for the float64 CPU reference
# float32 vs float64 at this size differs by ~4e-7 of the largest value; TF32 would give ~1e-3 and a
# flipped exponent or high mantissa bit far more.
TOLERANCE = 1e-4

NOT_EXECUTABLE = fix("interpreter-not-executable", "interpreter not executable",
                     "set `HEALTHCHECK_TORCH_PYTHON` to an executable Python that has torch")
TORCH_MISSING = fix("torch-missing", "torch not installed in that interpreter", deep.SET_PYTHON)
IMPORT_FAILED = fix("torch-import-failed", "`import torch` fails (missing module or library; details in the "
                    "log)", "reinstall torch in the image or fix its libraries")
MEMORY_LIMIT = fix("memory-limit", "the worker ran out of host memory: the address-space limit (RLIMIT_AS, "
                   "`ulimit -v`) or the container's memory is too small for torch (MemoryError, \"failed to "
                   "map segment from shared object\", \"Cannot allocate memory\", std::bad_alloc)",
                   "raise the limit the message names: the container's memory, or its address space "
                   "(`ulimit -v`)")
CPU_ONLY = fix("cpu-only-build", "CPU-only torch build with `HEALTHCHECK_TORCH_DEVICE=cuda`", "install a "
               "CUDA build of torch in the image, or set `HEALTHCHECK_TORCH_DEVICE=cpu` for a CPU-only image")
COUNT_MISMATCH = cause("count-mismatch", "torch sees a different GPU count than NVML", "a GPU is not usable "
                       "by CUDA; check `nvidia-smi`, dmesg for Xid errors and `NVIDIA_VISIBLE_DEVICES`",
                       action="reset-gpu", actor="operator")
WRONG_RESULT = cause("wrong-result", "GPU result differs from the CPU reference", "silent data corruption; "
                     "drain the node and run the GPU diagnostics (`dcgmi diag`)", action="service-hardware",
                     actor="operator")
LATCHED = cause("latched", "latch in force from an earlier fatal error (or a critical Xid seen by "
                "`healthcheck serve`): no worker started, the hardware probes are skipped too", "restart the "
                "container (a new PID 1 clears it)", action="restart-container", actor="operator")
DEADLINE = cause("deadline", "worker gave no result by the deadline (killed while in `import`: a slow disk "
                 "or a wedged driver), or another costly check held the lock until then", "the GPU driver "
                 "may be wedged: check `nvidia-smi` and dmesg for Xid errors; raise `HEALTHCHECK_TIMEOUT` if "
                 "the image is slow to import torch", action="retry", actor="operator")
STUCK = cause("stuck", "worker survived SIGKILL (uninterruptible sleep): the driver is wedged; while it "
              "exists, later runs start no other worker and say so at once", "check dmesg for Xid errors, "
              "the node may need a reboot", action="reboot-node", actor="operator")
LINGERED = fix("lingered", "worker printed its result but did not exit within 1.0 s (a wrapper script as "
               "`HEALTHCHECK_TORCH_PYTHON` that keeps running, or a hang at exit); nothing from it is cached "
               "or shared", "point `HEALTHCHECK_TORCH_PYTHON` at the Python interpreter itself and check "
               "dmesg for Xid errors")
TORCH_ERROR = fix("torch-error", "other torch error", deep.LOGGED)

SPEC = Spec(
    NAME, layer="framework", module=__name__, toggle="ENABLE_TORCH_CHECK", timeout=45.0,
    profiles=ALL_PROFILES, requires=("nvidia-smi", "nvml"), measurement="devices", settings=Torch.SETTINGS,
    about="the image's own Python imports torch and runs a verified matmul on every GPU",
    causes=(deep.INTERPRETER_NOT_FOUND, NOT_EXECUTABLE, TORCH_MISSING, IMPORT_FAILED, MEMORY_LIMIT, CPU_ONLY,
            COUNT_MISMATCH, *deep.CUDA_CAUSES, WRONG_RESULT, LATCHED, DEADLINE, STUCK, deep.KILLED, LINGERED,
            deep.BAD_OUTPUT, deep.WORKLOAD_MEMORY, deep.HELD_BACK, TORCH_ERROR),
)


def requirements(config: Config) -> tuple[str, ...]:
    """The hardware layer and a checkpointed process matter only on the GPU."""
    return (*SPEC.requires, "checkpoint") if config.of(Torch).torch_device == "cuda" else ()


TEXT = 120  # characters kept of each cleaned string of the report, but for these:
TEXT_LIMITS = {"message": 1200, "visible_devices": 1000}  # a message keeps its line breaks, as \n
PHASES = r"start|import|init|reference|device (cpu|\d{1,4})"


def validate(report: Any, device: str, size: int) -> dict[str, Any]:
    from probes.framework import torch_worker

    deep.fields(report, torch_worker.REPORT, "result")
    if report["v"] != torch_worker.SCHEMA:
        raise deep.Bad(f"schema version {report['v']} is not {torch_worker.SCHEMA}")
    if report["device"] != device or report["size"] != size:
        raise deep.Bad("the result is for another request")
    if report["count"] is not None and not 0 <= report["count"] <= deep.MAX_ITEMS:
        raise deep.Bad("result.count is out of range")
    devices = report["devices"]
    for i, dev in enumerate(devices):
        if dev["error"] is None and None in (dev["op_ms"], dev["max_err"], dev["scale"]):
            raise deep.Bad(f"result.devices[{i}] is missing a measurement")
    # A report without an error covers every device it counted.
    stopped = report["error"] is not None or any(d["error"] is not None for d in devices)
    if not stopped and report["count"] is not None and len(devices) != report["count"]:
        raise deep.Bad("the result does not cover every device")
    return deep.cleaned(report, TEXT, TEXT_LIMITS)


def run_worker(ctx: Context, expect: int | None) -> dict[str, Any]:
    from probes.framework import torch_worker

    own = ctx.config.of(Torch)
    args = ["--device", own.torch_device, "--size", str(SIZE)]
    data, done = deep.run_worker(ctx, NAME, args, {}, torch_worker,
                                 lambda report: validate(report, own.torch_device, SIZE), PHASES,
                                 own.torch_min_free_mib)
    if done is None:
        return data
    shown = done.stdout
    if not shown.strip():  # nothing on stdout: the last line of stderr that is not a progress marker
        phase = torch_worker.PHASE.encode()
        lines = [ln for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith(phase)]
        shown = lines[-1] if lines else b""
    excerpt = untrusted.squeeze(shown, 80) if data["report"] is None else None
    return {**data, "python": own.torch_python, "device": own.torch_device, "expect": expect,
            "elapsed": round(done.elapsed, 3), "excerpt": excerpt}


def gather(ctx: Context) -> dict[str, Any]:
    latch = ctx.state.latch()
    if latch is not None:
        return deep.latched(latch)
    if not ctx.config.profile_rules.spawns_worker:
        return {"kind": "no-latch", "state_off": ctx.state.disabled_reason}
    own = ctx.config.of(Torch)
    from probes.hardware import common as hw

    seen = hw.seen(ctx.results) if own.torch_device == "cuda" else None
    expect = seen.count if seen is not None and seen.ok else None  # NVML's count when the hardware passed
    key = {"python": own.torch_python, "device": own.torch_device, "size": SIZE, "expect": expect,
           "identity": life_identity()}

    def reuse(entry: dict[str, Any] | None, ttl: float | None = None) -> dict[str, Any] | None:
        # What judge reads of a run besides deep.WORKER_RUN (run_worker adds it), checked before reuse.
        extra = {"python": "str", "device": "str", "expect": "int?", "elapsed": "num", "excerpt": "str?"}
        return deep.cached(entry, key, lambda report: validate(report, own.torch_device, SIZE), PHASES, extra,
                           ttl)

    if own.torch_device == "cuda":  # a process paused by CUDA checkpoint holds GPU work back
        from probes.framework.checkpoint import hold
    return deep.locked_run(ctx, CACHE, key, lambda entry: reuse(entry, own.torch_ttl),
                           lambda: run_worker(ctx, expect), judge, early=True,
                           hold=hold if own.torch_device == "cuda" else None, share=reuse, relatch=True)


def on_deadline(ctx: Context) -> Result:
    return verdict(NAME, DEADLINE, "no result within the deadline from the torch worker", unit=UNIT)


def judge(data: dict[str, Any], ctx: Context) -> Result:
    kind = data.get("kind")
    if kind == "latched":
        when = (f"since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(data['since']))} "
                f"({data['age']:.0f}s ago, " if data["since"] else "(since an unknown time, ")
        return verdict(NAME, LATCHED, f"latched unhealthy {when}by {data['source']}): {data['why']}",
                       unit=UNIT, facts={"latched": True, "since": data["since"], "source": data["source"]})
    if kind == "no-latch":
        off = data.get("state_off")
        note = f" (state dir off: {off}; a fatal error cannot latch)" if off else ""
        return passed(NAME, f"no CUDA-fatal latch{note}", unit=UNIT, facts={"latched": False})
    return deep.judged(NAME, data, ctx, _judge_worker, room=deep.MIN_FREE, deadline=DEADLINE, unit=UNIT)


def _judge_worker(data: dict[str, Any], ctx: Context) -> Result:
    python = untrusted.clean(data.get("python", "?"), 80)
    kw: dict[str, Any] = {"unit": UNIT, "facts": {"python": data.get("python"), "device": data.get("device"),
                                                  "cache": data.get("cache")}}
    if (unrunnable := deep.cannot_run(NAME, data, data.get("python", "?"), NOT_EXECUTABLE, **kw)) is not None:
        return unrunnable
    if data.get("lingered") and not data.get("stuck"):
        return verdict(NAME, LINGERED, "torch worker printed its result but did not exit within "
                       f"{deadlines.LINGER:.1f} s: its result is not used", **kw)
    report = None if data.get("lingered") else data.get("report")
    if report is not None:
        kw["facts"].update({"torch": report["torch"], "cuda": report["cuda"], "count": report["count"]})
    gone = data.get("held_by") is not None or data.get("stuck") or data.get("timed_out")
    if (report is not None or not gone) and (memory := memory_limit(report, data)) is not None:
        return verdict(NAME, MEMORY_LIMIT, f"torch worker in {python}: {memory}", remedy=False, **kw)
    if report is not None:
        return _judge_report(report, data, ctx, python, kw)
    return deep.no_report(NAME, data, "torch worker", stuck=STUCK, timed_out=DEADLINE,
                       excerpt=f": '{data.get('excerpt') or ''}'", **kw)


def memory_limit(report: dict[str, Any] | None, data: dict[str, Any]) -> str | None:
    """Why the worker failed when host memory is why (naming the limit and the remedy), else None."""
    import errno

    from probes import childio

    if report is not None:
        errors = [report["error"], *(d["error"] for d in report["devices"])]
        said = any(e is not None and (e["type"] == "MemoryError" or deep.out_of_memory(e["message"]))
                   for e in errors)
    else:
        rc = data.get("returncode")
        said = data.get("memory") is True and isinstance(rc, int) and rc != 0
    return childio.limit_words(errno.ENOMEM) if said else None


def _judge_report(report: dict[str, Any], data: dict[str, Any], ctx: Context, python: str,
                  kw: dict[str, Any]) -> Result:
    err = report["error"]
    cuda = report["device"] == "cuda"
    if err is not None and err["phase"] == "import":
        if err["module"] == "torch":
            return verdict(NAME, TORCH_MISSING, f"torch is not installed for {python}", **kw)
        what = (f"module {err['module']!r} is missing" if err["module"]
                else f"{err['type']}; details in the log")
        return verdict(NAME, IMPORT_FAILED, f"import torch failed in {python} ({what})", **kw)
    if cuda and report["available"] is False and report["cuda_built"] is False:
        built = f"torch {report['torch'] or '?'} in {python}"
        return verdict(NAME, CPU_ONLY, f"CUDA not available: {built} is a CPU-only build", **kw)
    if cuda and report["available"] is False:
        have, need = _version(_driver_cuda(ctx)), _version(report.get("cuda"))
        if have is not None and need is not None and have < need:
            return _too_old(report, _driver_cuda(ctx), kw)
    if err is not None and err["phase"] == "init":
        return _device_error(err, report, ctx, kw, None) or verdict(
            NAME, deep.CUDA_UNAVAILABLE, "CUDA not available (torch.cuda.is_available() is False)", **kw)
    if err is not None:
        return verdict(NAME, TORCH_ERROR, f"the torch worker failed in {err['phase']} ({err['type']})", **kw)
    count = report["count"] or 0
    if cuda and count == 0:
        return verdict(NAME, deep.CUDA_UNAVAILABLE, "CUDA not available: torch sees no GPU", **kw)
    notes = []
    expect = data.get("expect")
    held = data.get("room")  # checked: the run's own, or read() from the cache by deep.cached
    if expect is not None and held is not None:
        expect -= len(held["full"])  # those were kept from the worker (CUDA_VISIBLE_DEVICES)
    if cuda and expect is not None and count != expect:
        if report["visible_devices"] is None or count > expect:
            return verdict(NAME, COUNT_MISMATCH, f"torch sees {count} GPU(s) but NVML sees {expect}",
                           observed=count, **kw)
        notes.append(f"{count} of {expect} GPUs visible through CUDA_VISIBLE_DEVICES")
    return _judge_devices(report, ctx, kw, notes)


def _holder(ctx: Context, report: dict[str, Any], index: int, uuid: str | None) -> str:
    """Who holds a busy device, from the nvml probe's facts, as a short phrase."""
    from probes.hardware import common as hw

    def norm(uuid: Any) -> str:
        return str(uuid or "").lower().removeprefix("gpu-")

    seen = hw.seen(ctx.results)
    gpus = seen.gpus if seen is not None else ()
    gpu = next((g for g in gpus if norm(g.uuid) == norm(uuid)), None) if uuid else None
    if gpu is None and report.get("visible_devices") is None:
        gpu = next((g for g in gpus if g.index == index), None)
    if gpu is None:
        return ""
    parts = []
    if gpu.compute_mode not in ("DEFAULT", "N/A"):
        parts.append(f"{untrusted.clean(gpu.compute_mode, 40)} compute mode")
    if gpu.processes:  # process names come from NVML (any user's command line): cleaned, short
        who = ", ".join(f"{'MPS client ' if mps else ''}pid {pid} ({untrusted.clean(name, 40)})"
                        for pid, name, mps in gpu.processes[:3])
        parts.append(f"held by {who}")
    return f" ({'; '.join(parts)})" if parts else ""


def _device_error(err: dict[str, Any], report: dict[str, Any], ctx: Context, kw: dict[str, Any],
                  entry: dict[str, Any] | None) -> Result | None:
    """The result for one identified CUDA error, or None when it is not one we can name."""
    import re

    from probes.framework import cuda_errors

    message = str(err.get("message", ""))
    found = cuda_errors.identify(err.get("code"), message, err.get("type"))
    if found is not None and found.error.cause is deep.DRIVER_TOO_OLD:
        kw["facts"]["cuda_error"] = found.facts()
        version = re.search(r"found version (\d+)", message)  # in CUDA's "driver too old" message
        driver = f"{int(version[1]) // 1000}.{int(version[1]) % 1000 // 10}" if version else _driver_cuda(ctx)
        return _too_old(report, driver, kw)
    holder = _holder(ctx, report, entry["index"] if entry else 0, entry["uuid"] if entry else None)
    return cuda_errors.failure(NAME, found, "the GPU(s)" if entry is None else f"cuda:{entry['index']}",
                               holder=holder, start=True, **kw)


def _driver_cuda(ctx: Context) -> str | None:
    """The highest CUDA version the driver supports ("12.4"), as the nvml probe read it."""
    from probes.hardware import common as hw

    seen = hw.seen(ctx.results)
    return seen.cuda_driver if seen is not None and _version(seen.cuda_driver, whole=True) else None


def _version(text: Any, whole: bool = False) -> tuple[int, int] | None:
    import re

    found = (re.fullmatch if whole else re.match)(r"(\d{1,3})\.(\d{1,3})", str(text or ""))
    return (int(found[1]), int(found[2])) if found else None


def _too_old(report: dict[str, Any], driver: str | None, kw: dict[str, Any]) -> Result:
    have = f", driver supports CUDA {driver}" if driver else ""
    return verdict(NAME, deep.DRIVER_TOO_OLD, f"CUDA driver too old for torch {report['torch']} "
                   f"(built for CUDA {report['cuda']}{have})", **kw)


def _judge_devices(report: dict[str, Any], ctx: Context, kw: dict[str, Any], notes: list[str]) -> Result:
    cuda = report["device"] == "cuda"
    per: list[dict[str, Any]] = []
    problems: list[Result] = []
    good: list[dict[str, Any]] = []
    for entry in report["devices"]:
        tag = f"cuda:{entry['index']}" if cuda else "cpu"
        row = {k: entry[k] for k in ("index", "name", "uuid", "op_ms", "free", "total")}
        per.append(row)
        if entry["error"] is not None:
            res = _device_error(entry["error"], report, ctx, kw, entry) or verdict(
                NAME, TORCH_ERROR, f"torch op failed on {tag} ({entry['error']['type']})", **kw)
            row["status"] = res.reason
            problems.append(res)
            continue
        scale, max_err = float(entry["scale"]), float(entry["max_err"])
        rel = max_err / scale if math.isfinite(scale) and scale > 0 else math.inf
        row["max_rel_err"] = rel if math.isfinite(rel) else None
        if not math.isfinite(rel) or rel > TOLERANCE:
            shown = f"{rel:.1e}" if math.isfinite(rel) else "not a number"
            row["status"] = "wrong-result"
            problems.append(verdict(NAME, WRONG_RESULT, f"wrong result on {tag}: matmul differs from the CPU "
                                    f"reference by {shown} (tolerance {TOLERANCE:.0e})", **kw))
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
        return verdict(NAME, deep.BAD_OUTPUT, "the torch worker checked no device", **kw)
    worst_rel = max(g["rel"] for g in good)
    slow = max(good, key=lambda g: g["op_ms"])
    base = f"{report['size']}x{report['size']} matmul matches the CPU reference (max rel err {worst_rel:.0e})"
    if cuda:
        tight = min(good, key=lambda g: g["free"] if g["free"] is not None else math.inf)
        free, total = ("?" if n is None else f"{n / 2**30:.1f}" for n in (tight["free"], tight["total"]))
        models = list(dict.fromkeys(g["name"] for g in good))  # cleaned by validate()
        shown = ", ".join(models[:2]) + (f" and {len(models) - 2} other model(s)" if len(models) > 2 else "")
        message = (f"{checked} GPU(s) OK ({shown}): {base}; slowest {slow['op_ms']:.1f} ms on "
                   f"cuda:{slow['index']}, least free {free}/{total} GiB on "
                   f"cuda:{tight['index']}; torch {report['torch']}, CUDA {report['cuda']}")
    else:
        message = f"CPU OK: {base} in {slow['op_ms']:.1f} ms; torch {report['torch']}"
    if notes:
        message += f" ({'; '.join(notes)})"
    return passed(NAME, message, observed=checked, **kw)
