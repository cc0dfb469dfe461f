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

from probes import untrusted
from probes.context import Context, logger
from probes.framework import checkpoint, deep, protocol
from probes.framework.deep import cannot_run, deep_cached, deep_worker, lock_timeout, locked_run
from probes.framework.protocol import INT, MEASURE, NUM, STR
from probes.record import Record
from probes.result import Result, Status, failed, passed, warned
from probes.spec import INTEGER, NUMBER, TEXT, Setting, Spec
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


SPEC = Spec(
    NAME, "framework", __name__, "ENABLE_MODEL_CHECK", 60.0, ("startup", "readiness"),
    requires=("checkpoint", "torch-cuda"), measurement=MEASUREMENT,
    about="the image's model file loads onto the device without running pickled code (opt-in)",
    default_on=False, on_with="model_path",
    settings=(
        Setting("HEALTHCHECK_MODEL_PATH", "model_path", TEXT, None,
                "the model file to load (TorchScript archive, safetensors, or a `torch.save` state dict); "
                "setting it turns the `model` probe on"),
        Setting("HEALTHCHECK_MODEL_INPUT", "model_input", TEXT, None,
                "one forward pass of a TorchScript model on this input, `SHAPE:DTYPE[:zeros|seeded]` "
                "(e.g. `1x3x224x224:float16`: at most 8 dimensions of ASCII digits, none 0; zero-filled "
                "unless `seeded`, which is `torch.randn(shape, generator=torch.Generator().manual_seed("
                "20240601), dtype=torch.float64).to(dtype)`)", parse=lambda text: parse_input(text)),
        Setting("HEALTHCHECK_MODEL_EXPECT", "model_expect", TEXT, None,
                "a tensor saved with `torch.save`: the forward pass's expected output"),
        Setting("HEALTHCHECK_MODEL_TOLERANCE", "model_tolerance", NUMBER, TOLERANCE,
                "largest accepted max(abs(output - expected)) / max(abs(expected))", low=0, high=1),
        Setting("HEALTHCHECK_MODEL_MAX_BYTES", "model_max_bytes", INTEGER, None,
                "the most bytes the model may take (besides the free GPU memory or available RAM, "
                "whichever is smaller)", low=0, high=2**62),
        Setting("HEALTHCHECK_MODEL_TTL", "model_ttl", NUMBER, 3600.0,
                "seconds a passing model result is reused by readiness", low=0, high=86400,
                low_inclusive=True),
    ),
    causes=(
        _c("model-missing", "`HEALTHCHECK_MODEL_PATH` names no file",
           "mount the model or fix `HEALTHCHECK_MODEL_PATH`"),
        _c("model-unreadable", "the model file cannot be read (permissions, a directory; a FIFO, socket or "
           "device is refused at once, never opened and waited on)",
           "make it a regular file readable by the probe's user"),
        _c("unsupported-format", "not a TorchScript archive, safetensors file or `torch.save` state dict (or "
           "a torch without `weights_only` loading)", "save the model with `torch.jit.save`, "
           "safetensors or `torch.save(model.state_dict())`"),
        _c("unsafe-pickle", "the file is a pickle that needs code to load: refused, never executed",
           "re-save only the weights (`torch.save(model.state_dict())` or safetensors)"),
        _c("model-corrupt", "the file is damaged or truncated", "copy the model file again and check its "
           "checksum"),
        _c("would-not-fit", "the model's bytes exceed the free GPU memory (or available RAM, or "
           "`HEALTHCHECK_MODEL_MAX_BYTES`); said before loading", "free memory, use a larger GPU, or raise "
           "the limit"),
        _c("oom", "out of memory while loading or running the model", "none: the workload uses the memory; "
           "not a fault", "warn"),
        _c("workload-memory", "NVML says no GPU has the free memory the load needs "
           "(`HEALTHCHECK_TORCH_MIN_FREE_MIB` plus the model's size): nothing started", "none: the workload "
           "holds the memory; not a fault", "warn"),
        _c("device-busy", "the GPU is busy with the workload (exclusive mode, MPS full)", "none: not a fault",
           "warn"),
        _c("cuda-fatal", "a sticky CUDA error while loading or running the model (see torch-cuda); latches",
           "restart the container; the error's own remedy is in the message"),
        _c("cuda-error", "another CUDA error while loading or running the model",
           "the error's own remedy, in the message"),
        _c("output-mismatch", "the forward pass differs from `HEALTHCHECK_MODEL_EXPECT` beyond the "
           "tolerance (or in shape)", "check the GPU (torch-cuda, `dcgmi diag`) and the model and "
           "expected files"),
        _c("expect-unreadable", "the expected-output file is missing, not a regular file (said before the "
           "model loads), too large for the memory, or not a saved tensor",
           "save it with `torch.save(tensor, path)`"),
        _c("bad-input", "`HEALTHCHECK_MODEL_INPUT` is not `SHAPE:DTYPE[:zeros|seeded]`, or the model is not "
           "TorchScript", "fix the setting (a forward pass needs a TorchScript model)"),
        _c("forward-failed", "the forward pass raised", "details in the log"),
        _c("load-failed", "loading raised another error", "details in the log"),
        _c("checkpointed", "a process here is CUDA-checkpointed: no GPU work is started", "wait for the "
           "restore", "skip"),
        _c("interpreter-not-found", "`HEALTHCHECK_TORCH_PYTHON` cannot be run", "set it to the image's "
           "Python"),
        _c("torch-missing", "torch cannot be imported, or CUDA is not available to it",
           "see the `torch-cuda` probe"),
        _c("deadline", "no result by the deadline (a large model on a slow disk, or a wedged driver)",
           "raise `HEALTHCHECK_TIMEOUT` for large models; check `nvidia-smi`"),
        _c("killed", "worker killed by a signal", "SIGKILL: check the container's memory limit"),
        _c("bad-output", "worker output unreadable", "check `HEALTHCHECK_TORCH_PYTHON`"),
    ),
)


class Settings(Record):
    """The settings model reads, typed (``ctx.config.of(Settings)``); torch-cuda's are ``deep.Torch``."""

    __slots__ = ("model_path", "model_input", "model_expect", "model_tolerance", "model_max_bytes",
                 "model_ttl")

    model_path: str | None
    model_input: str | None
    model_expect: str | None
    model_tolerance: float
    model_max_bytes: int | None
    model_ttl: float

    def __init__(self, model_path: str | None, model_input: str | None, model_expect: str | None,
                 model_tolerance: float, model_max_bytes: int | None, model_ttl: float) -> None:
        self.model_path = model_path
        self.model_input = model_input
        self.model_expect = model_expect
        self.model_tolerance = model_tolerance
        self.model_max_bytes = model_max_bytes
        self.model_ttl = model_ttl


_REPORT = {"v": (INT, False), "device": (STR, False), "torch": (STR, True), "format": (STR, True),
           "loader": (STR, True), "file_bytes": (INT, True), "bytes": (INT, True), "budget": (INT, True),
           "budget_source": (STR, True), "load_ms": (NUM, True), "params": (INT, True),
           "param_bytes": (INT, True), "peak_gpu": (INT, True), "forward_ms": (NUM, True),
           "max_err": (MEASURE, True), "scale": (MEASURE, True)}
_ERROR = {"kind": (STR, False), "type": (STR, False), "message": (STR, False), "code": (INT, True)}
CUDA_KINDS = ("load", "forward", "worker", "oom")  # the failures a CUDA error can be behind
KINDS = {"missing": "model-missing", "unreadable": "model-unreadable", "unsupported": "unsupported-format",
         "unsafe": "unsafe-pickle", "corrupt": "model-corrupt", "too-big": "would-not-fit", "oom": "oom",
         "shape-mismatch": "output-mismatch", "expect-missing": "expect-unreadable",
         "expect-unreadable": "expect-unreadable", "bad-input": "bad-input", "no-forward": "bad-input",
         "forward": "forward-failed", "load": "load-failed", "import": "torch-missing",
         "cuda-unavailable": "torch-missing", "worker": "load-failed"}


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
    if ctx.profile == "readiness":
        hit = _cached(state.read_json(CACHE), key, own.model_ttl, device)
        if hit is not None:
            return hit
    return locked_run(ctx, CACHE, key,
                      lambda entry: _cached(entry, key, own.model_ttl, device),
                      lambda: run_worker(ctx), judge)


def on_deadline(ctx: Context) -> Result:
    return failed(NAME, "no result within the deadline: loading the model took too long (a large model on "
                  "a slow disk: raise HEALTHCHECK_TIMEOUT) or the GPU driver is stuck", reason="deadline")


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
        return failed(NAME, f"{path} would not fit: it needs "
                      f"{facts['need_mib']} MiB ({ROOM}) and no GPU has that much memory even when idle; not "
                      "loaded: use a larger GPU", reason="would-not-fit", facts={"room": facts})
    return deep.not_checked(NAME, data, ROOM, unit=UNIT)


def _judge(data: dict[str, Any], ctx: Context) -> Result:
    from probes import proc

    kind = data.get("kind")
    path = untrusted.clean(ctx.config.of(Settings).model_path or "", 120)
    if kind == "checkpointed":
        return Result(NAME, Status.SKIP, f"not started: {data['why']}", reason="checkpointed")
    if kind == "no-path":
        return failed(NAME, "HEALTHCHECK_MODEL_PATH is not set: name the model file to load",
                      reason="model-missing")
    if kind == "lock-timeout":
        return lock_timeout(NAME, data)
    kw: dict[str, Any] = {"unit": UNIT, "facts": {"path": path, "cache": data.get("cache")}}
    report = data.get("report")
    unrunnable = cannot_run(NAME, data, ctx, **kw)
    if unrunnable is not None:
        return unrunnable
    if report is None or data.get("lingered"):
        where = data.get("phase") or "start-up"
        if data.get("stuck") or data.get("held_by") is not None:
            return failed(NAME, f"model worker stuck in {where} (survived SIGKILL): the GPU driver is "
                          "wedged; check dmesg", reason="deadline", **kw)
        if data.get("timed_out"):
            return failed(NAME, f"model worker gave no result within {data.get('budget', 0):.1f}s (killed "
                          f"while in {where}): a large model on a slow disk (raise HEALTHCHECK_TIMEOUT) or a "
                          "wedged driver", reason="deadline", **kw)
        rc = data.get("returncode")
        if isinstance(rc, int) and rc < 0:
            sig = proc.signal_name(-rc)
            return failed(NAME, f"model worker killed by {sig} in {where}: check the container's memory "
                          "limit and dmesg", reason="killed", **kw)
        return failed(NAME, f"model worker gave an unreadable result ({data.get('problem')}, exit status "
                      f"{rc})", reason="bad-output", **kw)
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
            return failed(NAME, f"output mismatch: {path}'s forward pass differs from "
                          f"HEALTHCHECK_MODEL_EXPECT by {shown} (tolerance {tol:g}): check the GPU "
                          "(torch-cuda, dcgmi diag) and that the expected file fits this model and input",
                          reason="output-mismatch", observed=report["load_ms"], **kw)
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
    reason = KINDS[err["kind"]]
    # The worker's own phrase, or a fixed one: an exception's text (torch's, with its escapes and
    # the file's bytes; an errno text) went to the log.
    what = _phrase(err) or "details in the log"
    if reason == "model-missing":
        msg = f"model file {path} not found: mount the model or fix HEALTHCHECK_MODEL_PATH"
    elif reason == "model-unreadable":
        msg = (f"model file {path} cannot be read ({what}): make it a regular file readable by the probe's "
               "user")
    elif reason == "unsupported-format":
        msg = (f"{path} is not a supported model format ({what}): save it with torch.jit.save, safetensors "
               "or torch.save(model.state_dict())")
    elif reason == "unsafe-pickle":
        msg = (f"{path} is a pickle that needs code to load: refused (weights_only), nothing executed; "
               "re-save only the weights (state dict or safetensors)")
    elif reason == "model-corrupt":
        msg = f"{path} is damaged or truncated ({what}): copy the model file again and check its checksum"
    elif reason == "would-not-fit":
        msg = (f"{path} would not fit: {_size(report['bytes'])} of tensors, {_size(report['budget'])} "
               f"allowed ({report['budget_source']}); not loaded: free memory or raise the limit")
    elif reason == "oom":
        return warned(NAME, f"out of memory loading {path} on {report['device']}: the workload uses the "
                      "memory; not checked, not a fault", reason="oom", **kw)
    elif reason == "output-mismatch":
        msg = (f"output mismatch: {path}'s forward pass has another shape than HEALTHCHECK_MODEL_EXPECT "
               "(both shapes are in the log)")
    elif reason == "expect-unreadable":
        msg = f"HEALTHCHECK_MODEL_EXPECT cannot be used ({what}): save a tensor with torch.save(tensor, path)"
    elif reason == "bad-input":
        msg = f"HEALTHCHECK_MODEL_INPUT cannot be used ({what})"
    elif reason == "torch-missing":
        msg = f"torch cannot load models here ({what}): see the torch-cuda probe"
    elif reason == "forward-failed":
        msg = f"the forward pass of {path} failed ({_type(err)}; details in the log)"
    else:
        msg = f"loading {path} failed ({_type(err)}; details in the log)"
    return failed(NAME, msg, reason=reason, **kw)
