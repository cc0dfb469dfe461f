"""model: the image's model file loads onto the probe's device (and answers as expected).

Opt-in: it runs only when ``HEALTHCHECK_MODEL_PATH`` names a file (or ``ENABLE_MODEL_CHECK``
is true). A worker (``model_worker.py``) runs in the interpreter that owns torch
(``HEALTHCHECK_TORCH_PYTHON``), in its own session and under the probe's deadline, and
loads the file onto ``HEALTHCHECK_TORCH_DEVICE`` without executing pickled code: a
TorchScript archive (``torch.jit.load``), a safetensors file, or a state dict through
``torch.load(weights_only=True)``. Before loading it compares the model's size with the
memory it may take (free GPU memory; available RAM and the cgroup limit on the CPU;
``HEALTHCHECK_MODEL_MAX_BYTES``) and refuses one that would not fit. For a TorchScript model
with ``HEALTHCHECK_MODEL_INPUT`` it runs one forward pass and, with
``HEALTHCHECK_MODEL_EXPECT``, compares the output with the saved one: the largest absolute
difference divided by the expected output's largest magnitude must be at most
``HEALTHCHECK_MODEL_TOLERANCE``.

Command-line equivalent::

    python3 probes/framework/model_worker.py --path /models/m.pt --device cuda --input 1x3x224x224:float16

Like torch-cuda it is one costly check: it takes the same lock in the state dir, so a model
load never overlaps the torch-cuda op or the NCCL check, and readiness reuses a passing
result younger than ``HEALTHCHECK_MODEL_TTL`` (the file, its size and mtime are part of the
key). It is never part of liveness. The worker's result line is untrusted input, validated
field by field with every string cleaned.
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
from probes.spec import INTEGER, NUMBER, TEXT, Cause, Declared, Spec, setting
from probes.spec import cause as _c
from probes.state import life_identity

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


NAME = "model"
MEASUREMENT = "load"
UNIT = "ms"
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model_worker.py")
CACHE = "model.json"
_PHASES = r"start|open|import|init|load|expect|forward"
TOLERANCE = 1e-3


class Settings(Declared):
    """The settings model reads (``ctx.config.of(Settings)``); torch-cuda's are ``deep.Torch``."""

    model_path: str | None = setting(
        "HEALTHCHECK_MODEL_PATH", TEXT, None, "the model file to load (TorchScript archive, safetensors, or "
        "a `torch.save` state dict); setting it turns the `model` probe on")
    model_input: str | None = setting(
        "HEALTHCHECK_MODEL_INPUT", TEXT, None, "one forward pass of a TorchScript model on this input, "
        "`SHAPE:DTYPE[:zeros|seeded]` (e.g. `1x3x224x224:float16`: at most 8 dimensions of ASCII digits, "
        "none 0; zero-filled unless `seeded`, which is `torch.randn(shape, "
        "generator=torch.Generator().manual_seed(20240601), dtype=torch.float64).to(dtype)`)",
        parse=lambda text: parse_input(text))
    model_expect: str | None = setting("HEALTHCHECK_MODEL_EXPECT", TEXT, None,
                                       "a tensor saved with `torch.save`: the forward pass's expected output")
    model_tolerance: float = setting("HEALTHCHECK_MODEL_TOLERANCE", NUMBER, TOLERANCE,
                                     "largest accepted max(abs(output - expected)) / max(abs(expected))",
                                     low=0, high=1)
    model_max_bytes: int | None = setting(
        "HEALTHCHECK_MODEL_MAX_BYTES", INTEGER, None, "the most bytes the model may take (besides the free "
        "GPU memory or available RAM, whichever is smaller)", low=0, high=2**62)
    model_ttl: float = setting("HEALTHCHECK_MODEL_TTL", NUMBER, 3600.0,
                               "seconds a passing model result is reused by readiness", low=0, high=86400,
                               low_inclusive=True)


def _fix(reason: str, what: str, remedy: str) -> Cause:
    """A cause the model's owner fixes: the file, or a setting."""
    return _c(reason, what, remedy, action="fix-config", actor="tenant")


MISSING = _fix("model-missing", "`HEALTHCHECK_MODEL_PATH` is not set or names no file",
               "mount the model or fix `HEALTHCHECK_MODEL_PATH`")
UNREADABLE = _fix("model-unreadable", "the model file cannot be read (permissions, a directory; a FIFO, "
                  "socket or device is refused at once, never opened and waited on)",
                  "make it a regular file readable by the probe's user")
UNSUPPORTED = _fix("unsupported-format", "not a TorchScript archive, safetensors file or `torch.save` state "
                   "dict (or a torch without `weights_only` loading)",
                   "save it with `torch.jit.save`, safetensors or `torch.save(model.state_dict())`")
UNSAFE = _fix("unsafe-pickle", "the file is a pickle that needs code to load: refused, never executed",
              "re-save only the weights (`torch.save(model.state_dict())` or safetensors)")
CORRUPT = _fix("model-corrupt", "the file is damaged or truncated",
               "copy the model file again and check its checksum")
TOO_BIG = _fix("would-not-fit", "the model's bytes exceed the free GPU memory (or available RAM, or "
               "`HEALTHCHECK_MODEL_MAX_BYTES`), or every GPU's whole memory; said before loading",
               "free memory, use a larger GPU, or raise the limit")
MISMATCH = _fix("output-mismatch", "the forward pass differs from `HEALTHCHECK_MODEL_EXPECT` beyond the "
                "tolerance (or in shape)", "check the GPU (torch-cuda, `dcgmi diag`) and that the expected "
                "file fits this model and input")
EXPECT = _fix("expect-unreadable", "the expected-output file is missing, not a regular file (said before the "
              "model loads), too large for the memory, or not a saved tensor",
              "save a tensor with `torch.save(tensor, path)`")
BAD_INPUT = _fix("bad-input", "`HEALTHCHECK_MODEL_INPUT` is not `SHAPE:DTYPE[:zeros|seeded]`, or the model "
                 "is not TorchScript", "fix the setting (a forward pass needs a TorchScript model)")
FORWARD = _fix("forward-failed", "the forward pass raised", fw.LOGGED)
LOAD = _fix("load-failed", "loading raised another error", fw.LOGGED)
TORCH_MISSING = _fix("torch-missing", "torch cannot be imported, or CUDA is not available to it",
                     "see the `torch-cuda` probe")
DEADLINE = _c("deadline", "no result by the deadline (a large model on a slow disk, or a wedged driver), "
              "or another costly check held the lock until then",
              "raise `HEALTHCHECK_TIMEOUT` for large models; check `nvidia-smi` and dmesg",
              action="retry", actor="tenant")

SPEC = Spec(
    NAME, layer="framework", module=__name__, toggle="ENABLE_MODEL_CHECK", timeout=60.0,
    profiles=("startup", "readiness"), requires=("checkpoint", "torch-cuda"), measurement=MEASUREMENT,
    about="the image's model file loads onto the device without running pickled code (opt-in)",
    default_on=False, on_with="model_path", settings=Settings.SETTINGS,
    causes=(MISSING, UNREADABLE, UNSUPPORTED, UNSAFE, CORRUPT, TOO_BIG, fw.OOM, fw.WORKLOAD_MEMORY,
            fw.DEVICE_BUSY, fw.CUDA_FATAL, fw.CUDA_ERROR, MISMATCH, EXPECT, BAD_INPUT, FORWARD, LOAD,
            fw.HELD_BACK, fw.INTERPRETER_NOT_FOUND, TORCH_MISSING, DEADLINE, fw.KILLED,
            fw.BAD_OUTPUT),
)


_REPORT = {"v": (INT, False), "device": (STR, False), "torch": (STR, True), "format": (STR, True),
           "loader": (STR, True), "file_bytes": (INT, True), "bytes": (INT, True), "budget": (INT, True),
           "budget_source": (STR, True), "load_ms": (NUM, True), "params": (INT, True),
           "param_bytes": (INT, True), "peak_gpu": (INT, True), "forward_ms": (NUM, True),
           "max_err": (MEASURE, True), "scale": (MEASURE, True)}
_ERROR = {"kind": (STR, False), "type": (STR, False), "message": (STR, False), "code": (INT, True)}
CUDA_KINDS = ("load", "forward", "worker", "oom")  # the failures a CUDA error can be behind
KINDS = {"missing": MISSING, "unreadable": UNREADABLE, "unsupported": UNSUPPORTED, "unsafe": UNSAFE,
         "corrupt": CORRUPT, "too-big": TOO_BIG, "oom": fw.OOM, "shape-mismatch": MISMATCH,
         "expect-missing": EXPECT, "expect-unreadable": EXPECT, "bad-input": BAD_INPUT,
         "no-forward": BAD_INPUT, "forward": FORWARD, "load": LOAD, "import": TORCH_MISSING,
         "cuda-unavailable": TORCH_MISSING, "worker": LOAD}


def parse_input(text: str) -> str:
    """HEALTHCHECK_MODEL_INPUT, read by the worker's own grammar when the settings are read; a
    ValueError says what is wrong and what is accepted."""
    from probes.framework import model_worker

    try:
        model_worker.parse_input(text)
    except model_worker.Failure as exc:
        raise ValueError(f"is not SHAPE:DTYPE[:zeros|seeded] ({exc}; accepted: e.g. 1x3x224x224:float16, "
                         f"dtypes {', '.join(model_worker.INPUT_DTYPES)})") from None
    return text


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
    cleaned: dict[str, Any] = protocol.cleaned(report, 200)
    return cleaned


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
    cfg, torch = ctx.config.of(Settings), ctx.config.of(deep.Torch)
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
    floor = ctx.config.of(deep.Torch).torch_min_free_mib
    found = _file_id(ctx.config.of(Settings).model_path)
    return floor + (-(-found[2] // 2**20) if found else 0) if floor else 0


def run_worker(ctx: Context) -> dict[str, Any]:
    device = ctx.config.of(deep.Torch).torch_device
    data = deep_worker(ctx, NAME, _argv(ctx), {}, lambda out: parse_output(out, device), last_phase,
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
    cfg, torch = ctx.config.of(Settings), ctx.config.of(deep.Torch)
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
    state = ctx.state
    own, device = ctx.config.of(Settings), ctx.config.of(deep.Torch).torch_device
    if not own.model_path:
        return {"kind": "no-path"}
    key = _key(ctx)
    if ctx.config.profile_rules.reuses_cache:
        hit = _cached(state.read_json(CACHE), key, own.model_ttl, device)
        if hit is not None:
            return hit
    return locked_run(ctx, CACHE, key,
                      lambda entry: _cached(entry, key, own.model_ttl, device),
                      lambda: run_worker(ctx), judge)


def on_deadline(ctx: Context) -> Result:
    return verdict(NAME, DEADLINE, "no result within the deadline: loading the model took too long (a large "
                   "model on a slow disk) or the GPU driver is stuck")


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
        path = untrusted.clean(ctx.config.of(Settings).model_path or "", 120)
        return verdict(NAME, TOO_BIG, f"{path} would not fit: it needs {facts['need_mib']} MiB ({ROOM}) and "
                       "no GPU has that much memory even when idle; not loaded", facts={"room": facts})
    return deep.not_checked(NAME, data, ROOM, unit=UNIT)


def _judge(data: dict[str, Any], ctx: Context) -> Result:
    from probes import proc

    kind = data.get("kind")
    path = untrusted.clean(ctx.config.of(Settings).model_path or "", 120)
    if kind == "checkpointed":
        return verdict(NAME, fw.HELD_BACK, f"not started: {data['why']}", remedy=False)
    if kind == "no-path":
        return verdict(NAME, MISSING, "HEALTHCHECK_MODEL_PATH is not set")
    if kind == "lock-timeout":
        return lock_timeout(NAME, data, DEADLINE)
    kw: dict[str, Any] = {"unit": UNIT, "facts": {"path": path, "cache": data.get("cache")}}
    report = data.get("report")
    unrunnable = cannot_run(NAME, data, ctx, **kw)
    if unrunnable is not None:
        return unrunnable
    if report is None or data.get("lingered"):
        where = data.get("phase") or "start-up"
        if data.get("stuck") or data.get("held_by") is not None:
            return verdict(NAME, DEADLINE, f"model worker stuck in {where} (survived SIGKILL), the GPU "
                           "driver is wedged", **kw)
        if data.get("timed_out"):
            return verdict(NAME, DEADLINE, f"model worker gave no result within {data.get('budget', 0):.1f}s "
                           f"(killed while in {where}): a large model on a slow disk or a wedged driver",
                           **kw)
        rc = data.get("returncode")
        if isinstance(rc, int) and rc < 0:
            return verdict(NAME, fw.KILLED, f"model worker killed by {proc.signal_name(-rc)} in {where}",
                           **kw)
        return verdict(NAME, fw.BAD_OUTPUT, f"model worker gave an unreadable result ({data.get('problem')}, "
                       f"exit status {rc})", **kw)
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
        tol = ctx.config.of(Settings).model_tolerance
        if not rel <= tol:  # NaN fails too
            shown = f"{rel:.1e}" if rel == rel and rel != float("inf") else "not a number"
            return verdict(NAME, MISMATCH, f"output mismatch: {path}'s forward pass differs from "
                           f"HEALTHCHECK_MODEL_EXPECT by {shown} (tolerance {tol:g})",
                           observed=report["load_ms"], **kw)
        loaded += f", matches the expected output (max rel err {rel:.0e})"
    cache = data.get("cache") or {}
    if cache.get("how") == "ttl":
        loaded += f" (cached, {cache.get('age', 0):.0f}s old)"
    return passed(NAME, loaded, observed=report["load_ms"], **kw)


def _judge_error(err: dict[str, Any], report: dict[str, Any], path: str, kw: dict[str, Any]) -> Result:
    if err["kind"] in CUDA_KINDS:
        where = f"{report['device']}, loading {path}"
        cuda = deep.cuda_failure(NAME, err["code"], err["message"], where, **kw)
        if cuda is not None:
            return cuda
    cause = KINDS[err["kind"]]
    # The worker's own phrase, or a fixed one: an exception's text (torch's, with its escapes and
    # the file's bytes; an errno text) went to the log.
    what = _phrase(err) or "details in the log"
    detail = {
        MISSING: f"model file {path} not found",
        UNREADABLE: f"model file {path} cannot be read ({what})",
        UNSUPPORTED: f"{path} is not a supported model format ({what})",
        UNSAFE: f"{path} is a pickle that needs code to load: refused (weights_only), nothing executed",
        CORRUPT: f"{path} is damaged or truncated ({what})",
        TOO_BIG: f"{path} would not fit: {_size(report['bytes'])} of tensors, {_size(report['budget'])} "
                 f"allowed ({report['budget_source']}); not loaded",
        fw.OOM: f"out of memory loading {path} on {report['device']}",
        MISMATCH: f"output mismatch: {path}'s forward pass has another shape than HEALTHCHECK_MODEL_EXPECT "
                  "(both shapes are in the log)",
        EXPECT: f"HEALTHCHECK_MODEL_EXPECT cannot be used ({what})",
        BAD_INPUT: f"HEALTHCHECK_MODEL_INPUT cannot be used ({what})",
        TORCH_MISSING: f"torch cannot load models here ({what})",
        FORWARD: f"the forward pass of {path} failed ({_type(err)})",
    }.get(cause, f"loading {path} failed ({_type(err)})")
    return verdict(NAME, cause, detail, **kw)
