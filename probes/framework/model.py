"""model: the image's model file loads onto the probe's device without running pickled code, and
answers as expected (opt-in; docs/probes.md, "Deep opt-in checks"). A worker (``model_worker.py``)
loads it in ``HEALTHCHECK_TORCH_PYTHON``; like torch-cuda it is one costly check, under the same
lock, and readiness reuses a pass younger than ``HEALTHCHECK_MODEL_TTL`` (the file's identity, size
and mtime are part of the key).

Command-line equivalent::

    python3 probes/framework/model_worker.py --path /models/m.pt --device cuda --input 1x3x224x224:float16
"""

from __future__ import annotations

import os

from probes import framework as fw
from probes import untrusted
from probes.context import Context, logger
from probes.framework import checkpoint, deep, protocol
from probes.framework.deep import cannot_run, deep_cached, deep_worker, lock_timeout, locked_run
from probes.framework.protocol import INT, MEASURE, NUM, STR
from probes.result import Result, passed, verdict
from probes.state import life_identity

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


UNIT = "ms"
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model_worker.py")
CACHE = "model.json"
_PHASES = r"start|open|import|init|load|expect|forward"
SPEC = fw.MODEL_SPEC

_REPORT = {"v": (INT, False), "device": (STR, False), "torch": (STR, True), "format": (STR, True),
           "loader": (STR, True), "file_bytes": (INT, True), "bytes": (INT, True), "budget": (INT, True),
           "budget_source": (STR, True), "load_ms": (NUM, True), "params": (INT, True),
           "param_bytes": (INT, True), "peak_gpu": (INT, True), "forward_ms": (NUM, True),
           "max_err": (MEASURE, True), "scale": (MEASURE, True)}
_ERROR = {"kind": (STR, False), "type": (STR, False), "message": (STR, False), "code": (INT, True)}
CUDA_KINDS = ("load", "forward", "worker", "oom")  # the failures a CUDA error can be behind
KINDS = {"missing": fw.MODEL_MISSING, "unreadable": fw.MODEL_UNREADABLE, "unsupported": fw.MODEL_UNSUPPORTED,
         "unsafe": fw.MODEL_UNSAFE, "corrupt": fw.MODEL_CORRUPT, "too-big": fw.MODEL_TOO_BIG, "oom": fw.OOM,
         "shape-mismatch": fw.MODEL_MISMATCH, "expect-missing": fw.MODEL_EXPECT, "worker": fw.MODEL_LOAD,
         "expect-unreadable": fw.MODEL_EXPECT, "bad-input": fw.MODEL_BAD_INPUT, "load": fw.MODEL_LOAD,
         "no-forward": fw.MODEL_BAD_INPUT, "forward": fw.MODEL_FORWARD, "import": fw.MODEL_TORCH_MISSING,
         "cuda-unavailable": fw.MODEL_TORCH_MISSING}


def validate(report: Any, device: str) -> dict[str, Any]:
    """A cleaned copy of the worker's report if it matches the schema exactly; raises protocol.Bad."""
    from probes.framework import model_worker

    protocol.fields(report, _REPORT, "result", nested=("error",))
    if report["v"] != model_worker.SCHEMA or report["device"] != device:
        raise protocol.Bad("the result is for another request")
    if report["format"] is not None and report["format"] not in model_worker.FORMATS:
        raise protocol.Bad("result.format is unknown")
    if report["error"] is not None:
        protocol.fields(report["error"], _ERROR, "result.error")
        if report["error"]["kind"] not in KINDS:
            raise protocol.Bad("result.error.kind is unknown")
    elif report["load_ms"] is None or report["params"] is None:
        raise protocol.Bad("a passing result without load time or parameters")
    return protocol.cleaned(report, 200)


def parse_output(stdout: bytes, device: str) -> tuple[dict[str, Any] | None, str | None]:
    from probes.framework import model_worker

    try:
        return validate(protocol.result(stdout, model_worker.PREFIX), device), None
    except protocol.Bad as exc:
        return None, str(exc)


def last_phase(stderr: bytes) -> str | None:
    from probes.framework import model_worker

    return protocol.last_phase(stderr, model_worker.PHASE, _PHASES)


def result_arrived(stdout: bytes) -> bool:
    from probes.framework import model_worker

    return protocol.arrived(stdout, model_worker.PREFIX)


# ---------------------------------------------------------------------------
# gather
# ---------------------------------------------------------------------------

def _argv(ctx: Context) -> list[str]:
    cfg, torch = ctx.config.of(fw.ModelSettings), ctx.config.of(fw.Torch)
    # --flag=value: a value that starts with '-' is still the flag's value, never another flag.
    argv = [torch.torch_python, WORKER, f"--path={cfg.model_path}", f"--device={torch.torch_device}"]
    if cfg.model_input is not None:
        argv.append(f"--input={cfg.model_input}")
    if cfg.model_expect is not None:
        argv.append(f"--expect={cfg.model_expect}")
    if cfg.model_max_bytes is not None:
        argv.append(f"--max-bytes={cfg.model_max_bytes}")
    return argv


def need_mib(ctx: Context) -> int:
    """Free GPU memory the load needs: HEALTHCHECK_TORCH_MIN_FREE_MIB, plus the model file's size
    (about its tensors' bytes); 0 when the setting turns the check off."""
    floor = ctx.config.of(fw.Torch).torch_min_free_mib
    found = _file_id(ctx.config.of(fw.ModelSettings).model_path)
    return floor + (-(-found[2] // 2**20) if found else 0) if floor else 0


def run_worker(ctx: Context) -> dict[str, Any]:
    device = ctx.config.of(fw.Torch).torch_device
    data = deep_worker(ctx, SPEC.name, _argv(ctx), {}, lambda out: parse_output(out, device), last_phase,
                       result_arrived, need_mib(ctx))[0]
    err = (data.get("report") or {}).get("error")
    if err is not None and _phrase(err) is None:  # an exception's text: the log's, never the output's
        logger().info("model worker: %s (%s): %s", err["kind"], err["type"], err["message"])
    return data


def _phrase(err: dict[str, Any]) -> str | None:
    """The worker's message when it is one of its own phrases; None for anything else."""
    from probes.framework import model_worker

    return err["message"] if err["message"] in model_worker.PHRASES else None


def _file_id(path: str | None) -> list[int] | None:
    try:
        st = os.stat(path) if path else None
    except OSError:
        return None
    return None if st is None else [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def _key(ctx: Context) -> dict[str, Any]:
    cfg, torch = ctx.config.of(fw.ModelSettings), ctx.config.of(fw.Torch)
    return {"python": torch.torch_python, "device": torch.torch_device, "path": cfg.model_path,
            "file": _file_id(cfg.model_path), "input": cfg.model_input, "expect": cfg.model_expect,
            "expect_file": _file_id(cfg.model_expect), "max_bytes": cfg.model_max_bytes,
            "identity": life_identity()}


def _cached(entry: dict[str, Any] | None, key: dict[str, Any], ttl: float,
            device: str) -> dict[str, Any] | None:
    """A passing result for the same file and request, younger than the TTL, re-validated."""
    return deep_cached(entry, key, ttl, lambda report: validate(report, device))


def gather(ctx: Context) -> dict[str, Any]:
    hold = checkpoint.hold(ctx)
    if hold is not None:
        return {"kind": "checkpointed", "why": hold}
    own, device = ctx.config.of(fw.ModelSettings), ctx.config.of(fw.Torch).torch_device
    if not own.model_path:
        return {"kind": "no-path"}
    key = _key(ctx)
    if ctx.config.profile_rules.reuses_cache:
        hit = _cached(ctx.state.read_json(CACHE), key, own.model_ttl, device)
        if hit is not None:
            return hit
    return locked_run(ctx, CACHE, key,
                      lambda entry: _cached(entry, key, own.model_ttl, device),
                      lambda: run_worker(ctx), judge)


def on_deadline(ctx: Context) -> Result:
    return verdict(SPEC.name, fw.MODEL_DEADLINE, "no result within the deadline: loading the model took too "
                   "long (a large model on a slow disk) or the GPU driver is stuck")


# ---------------------------------------------------------------------------
# judge: pure
# ---------------------------------------------------------------------------

def _type(err: dict[str, Any]) -> str:
    """An exception's class name as the worker reported it, if it looks like one."""
    name = err["type"]
    ok = 0 < len(name) <= 60 and name.replace("_", "a").replace(".", "a").isalnum() and name.isascii()
    return name if ok else "an exception"


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


ROOM = "HEALTHCHECK_TORCH_MIN_FREE_MIB plus the model's size"


def judge(data: dict[str, Any], ctx: Context) -> Result:
    from probes.framework import free_memory

    if data.get("kind") != free_memory.REASON:
        return deep.unkept(deep.with_room(_judge(data, ctx), data, ROOM), data)
    facts = data["room"]
    if all(g["total_mib"] is not None and g["total_mib"] < facts["need_mib"] for g in facts["full"]):
        path = untrusted.clean(ctx.config.of(fw.ModelSettings).model_path or "", 120)
        return verdict(SPEC.name, fw.MODEL_TOO_BIG, f"{path} would not fit: it needs {facts['need_mib']} MiB "
                       f"({ROOM}) and no GPU has that much memory even when idle; not loaded",
                       facts={"room": facts})
    return deep.not_checked(SPEC.name, data, ROOM, unit=UNIT)


def _judge(data: dict[str, Any], ctx: Context) -> Result:
    from probes import proc

    kind = data.get("kind")
    path = untrusted.clean(ctx.config.of(fw.ModelSettings).model_path or "", 120)
    if kind == "checkpointed":
        return verdict(SPEC.name, fw.HELD_BACK, f"not started: {data['why']}", remedy=False)
    if kind == "no-path":
        return verdict(SPEC.name, fw.MODEL_MISSING, "HEALTHCHECK_MODEL_PATH is not set")
    if kind == "lock-timeout":
        return lock_timeout(SPEC.name, data, fw.MODEL_DEADLINE)
    kw: dict[str, Any] = {"unit": UNIT, "facts": {"path": path, "cache": data.get("cache")}}
    report = data.get("report")
    unrunnable = cannot_run(SPEC.name, data, ctx, **kw)
    if unrunnable is not None:
        return unrunnable
    if report is None or data.get("lingered"):
        where = data.get("phase") or "start-up"
        if data.get("stuck") or data.get("held_by") is not None:
            return verdict(SPEC.name, fw.MODEL_DEADLINE, f"model worker stuck in {where} (survived SIGKILL), "
                           "the GPU driver is wedged", **kw)
        if data.get("timed_out"):
            return verdict(SPEC.name, fw.MODEL_DEADLINE, "model worker gave no result within "
                           f"{data.get('budget', 0):.1f}s (killed while in {where}): "
                           "a large model on a slow disk or a wedged driver",
                           **kw)
        rc = data.get("returncode")
        if isinstance(rc, int) and rc < 0:
            return verdict(SPEC.name, fw.KILLED, f"model worker killed by {proc.signal_name(-rc)} in {where}",
                           **kw)
        return verdict(SPEC.name, fw.BAD_OUTPUT, "model worker gave an unreadable result "
                       f"({data.get('problem')}, exit status {rc})", **kw)
    kw["facts"].update({k: report[k] for k in ("format", "loader", "bytes", "budget", "params",
                                                 "param_bytes", "peak_gpu", "load_ms", "forward_ms")})
    err = report["error"]
    if err is not None:
        return _judge_error(err, report, path, kw)
    loaded = (f"{path} ({report['format']}, {report['params']:,} parameters, {_size(report['param_bytes'])}) "
              f"loaded on {report['device']} in {report['load_ms']:.0f} ms")
    if report["peak_gpu"] is not None:
        loaded += f", peak GPU memory {_size(report['peak_gpu'])}"
    if report["forward_ms"] is not None:
        loaded += f"; forward pass {report['forward_ms']:.1f} ms"
    if report["max_err"] is not None:
        max_err, scale = float(report["max_err"]), float(report["scale"])
        rel = max_err / scale if scale > 0 else (0.0 if max_err == 0 else float("inf"))
        kw["facts"]["max_rel_err"] = rel if rel == rel and rel != float("inf") else None
        tol = ctx.config.of(fw.ModelSettings).model_tolerance
        if not rel <= tol:  # NaN fails too
            shown = f"{rel:.1e}" if rel == rel and rel != float("inf") else "not a number"
            return verdict(SPEC.name, fw.MODEL_MISMATCH, f"output mismatch: {path}'s forward pass differs "
                           f"from HEALTHCHECK_MODEL_EXPECT by {shown} (tolerance {tol:g})",
                           observed=report["load_ms"], **kw)
        loaded += f", matches the expected output (max rel err {rel:.0e})"
    cache = data.get("cache") or {}
    if cache.get("how") == "ttl":
        loaded += f" (cached, {cache.get('age', 0):.0f}s old)"
    return passed(SPEC.name, loaded, observed=report["load_ms"], **kw)


def _judge_error(err: dict[str, Any], report: dict[str, Any], path: str, kw: dict[str, Any]) -> Result:
    if err["kind"] in CUDA_KINDS:
        where = f"{report['device']}, loading {path}"
        cuda = deep.cuda_failure(SPEC.name, err["code"], err["message"], where, **kw)
        if cuda is not None:
            return cuda
    cause = KINDS[err["kind"]]
    # The worker's own phrase, or a fixed one: an exception's text (torch's, with its escapes and
    # the file's bytes; an errno text) went to the log.
    what = _phrase(err) or "details in the log"
    detail = {
        fw.MODEL_MISSING: f"model file {path} not found",
        fw.MODEL_UNREADABLE: f"model file {path} cannot be read ({what})",
        fw.MODEL_UNSUPPORTED: f"{path} is not a supported model format ({what})",
        fw.MODEL_UNSAFE: f"{path} is a pickle that needs code to load: "
                         "refused (weights_only), nothing executed",
        fw.MODEL_CORRUPT: f"{path} is damaged or truncated ({what})",
        fw.MODEL_TOO_BIG: f"{path} would not fit: {_size(report['bytes'])} of tensors, "
                          f"{_size(report['budget'])} allowed ({report['budget_source']}); not loaded",
        fw.OOM: f"out of memory loading {path} on {report['device']}",
        fw.MODEL_MISMATCH: f"output mismatch: {path}'s forward pass has another shape than "
                           "HEALTHCHECK_MODEL_EXPECT (both shapes are in the log)",
        fw.MODEL_EXPECT: f"HEALTHCHECK_MODEL_EXPECT cannot be used ({what})",
        fw.MODEL_BAD_INPUT: f"HEALTHCHECK_MODEL_INPUT cannot be used ({what})",
        fw.MODEL_TORCH_MISSING: f"torch cannot load models here ({what})",
        fw.MODEL_FORWARD: f"the forward pass of {path} failed ({_type(err)})",
    }.get(cause, f"loading {path} failed ({_type(err)})")
    return verdict(SPEC.name, cause, detail, **kw)
