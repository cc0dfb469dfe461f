"""model (opt-in): the model file loads without running pickled code and answers as expected, in a
worker (docs/probes.md, "Deep opt-in checks"). Command-line equivalent: ``python3 model_worker.py --path
m.pt``."""

from __future__ import annotations

import os

from probes import untrusted
from probes.context import Context, logger
from probes.framework import checkpoint, deep
from probes.framework.deep import Torch, fix
from probes.result import Result, passed, verdict
from probes.spec import INTEGER, NUMBER, TEXT, Declared, Spec, cause, setting
from probes.state import life_identity

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NAME = "model"
UNIT = "ms"
CACHE = "model.json"
PHASES = r"start|open|import|init|load|expect|forward"
ROOM = "HEALTHCHECK_TORCH_MIN_FREE_MIB plus the model's size"


def model_input(text: str) -> str:
    from probes.framework import model_worker

    try:
        model_worker.parse_input(text)
    except model_worker.Failure as exc:
        raise ValueError(f"is not SHAPE:DTYPE[:zeros|seeded] ({exc}; accepted: e.g. 1x3x224x224:float16, "
                         f"dtypes {', '.join(model_worker.INPUT_DTYPES)})") from None
    return text


class Settings(Declared):
    model_path: str | None = setting(
        "HEALTHCHECK_MODEL_PATH", TEXT, None, "the model file to load (TorchScript archive, safetensors, or "
        "a `torch.save` state dict); setting it turns the `model` probe on")
    model_input: str | None = setting(
        "HEALTHCHECK_MODEL_INPUT", TEXT, None, "one forward pass of a TorchScript model on this input, "
        "`SHAPE:DTYPE[:zeros|seeded]` (e.g. `1x3x224x224:float16`: at most 8 dimensions of ASCII digits, "
        "none 0; zero-filled unless `seeded`, which is `torch.randn(shape, "
        "generator=torch.Generator().manual_seed(20240601), dtype=torch.float64).to(dtype)`)",
        parse=model_input)
    model_expect: str | None = setting("HEALTHCHECK_MODEL_EXPECT", TEXT, None,
                                       "a tensor saved with `torch.save`: the forward pass's expected output")
    model_tolerance: float = setting("HEALTHCHECK_MODEL_TOLERANCE", NUMBER, 1e-3, "largest accepted "
                                     "max(abs(output - expected)) / max(abs(expected))", low=0, high=1)
    model_max_bytes: int | None = setting(
        "HEALTHCHECK_MODEL_MAX_BYTES", INTEGER, None, "the most bytes the model may take (besides the free "
        "GPU memory or available RAM, whichever is smaller)", low=0, high=2**62)
    model_ttl: float = setting("HEALTHCHECK_MODEL_TTL", NUMBER, 3600.0, "seconds a passing model result is "
                               "reused by readiness", low=0, high=86400, low_inclusive=True)


MISSING = fix("model-missing", "`HEALTHCHECK_MODEL_PATH` is not set or names no file", "mount the model or "
              "fix `HEALTHCHECK_MODEL_PATH`")
UNREADABLE = fix("model-unreadable", "the model file cannot be read (permissions, a directory; a FIFO, "
                 "socket or device is refused at once, never opened and waited on)", "make it a regular file "
                 "readable by the probe's user")
UNSUPPORTED = fix("unsupported-format", "not a TorchScript archive, safetensors file or `torch.save` state "
                  "dict (or a torch without `weights_only` loading)", "save it with `torch.jit.save`, "
                  "safetensors or `torch.save(model.state_dict())`")
UNSAFE = fix("unsafe-pickle", "the file is a pickle that needs code to load: refused, never executed",
             "re-save only the weights (`torch.save(model.state_dict())` or safetensors)")
CORRUPT = fix("model-corrupt", "the file is damaged or truncated", "copy the model file again and check its "
              "checksum")
TOO_BIG = fix("would-not-fit", "the model's bytes exceed the free GPU memory (or available RAM, or "
              "`HEALTHCHECK_MODEL_MAX_BYTES`), or every GPU's whole memory; said before loading",
              "free memory, use a larger GPU, or raise the limit")
MISMATCH = fix("output-mismatch", "the forward pass differs from `HEALTHCHECK_MODEL_EXPECT` beyond the "
               "tolerance (or in shape)", "check the GPU (torch-cuda, `dcgmi diag`) and that the expected "
               "file fits this model and input")
EXPECT = fix("expect-unreadable", "the expected-output file is missing, not a regular file (said before the "
             "model loads), too large for the memory, or not a saved tensor", "save a tensor with "
             "`torch.save(tensor, path)`")
BAD_INPUT = fix("bad-input", "`HEALTHCHECK_MODEL_INPUT` is not `SHAPE:DTYPE[:zeros|seeded]`, or the model is "
                "not TorchScript", "fix the setting (a forward pass needs a TorchScript model)")
FORWARD = fix("forward-failed", "the forward pass raised", deep.LOGGED)
LOAD = fix("load-failed", "loading raised another error", deep.LOGGED)
TORCH_MISSING = fix("torch-missing", "torch cannot be imported, or CUDA is not available to it",
                    "see the `torch-cuda` probe")
DEADLINE = cause("deadline", "no result by the deadline (a large model on a slow disk, or a wedged driver), "
                 "or another costly check held the lock until then", "raise `HEALTHCHECK_TIMEOUT` for large "
                 "models; check `nvidia-smi` and dmesg", action="retry", actor="tenant")

SPEC = Spec(
    NAME, layer="framework", module=__name__, toggle="ENABLE_MODEL_CHECK", timeout=60.0,
    profiles=("startup", "readiness"), requires=("checkpoint", "torch-cuda"), measurement="load",
    about="the image's model file loads onto the device without running pickled code (opt-in)",
    default_on=False, on_with="model_path", settings=Settings.SETTINGS,
    causes=(MISSING, UNREADABLE, UNSUPPORTED, UNSAFE, CORRUPT, TOO_BIG, deep.OOM, deep.WORKLOAD_MEMORY,
            deep.DEVICE_BUSY, deep.MPS_BUSY, deep.CUDA_FATAL, deep.CUDA_ERROR, MISMATCH, EXPECT, BAD_INPUT,
            FORWARD, LOAD, deep.HELD_BACK, deep.INTERPRETER_NOT_FOUND, TORCH_MISSING, DEADLINE, deep.KILLED,
            deep.BAD_OUTPUT),
)

KINDS = {"missing": MISSING, "unreadable": UNREADABLE, "unsupported": UNSUPPORTED, "unsafe": UNSAFE,
         "corrupt": CORRUPT, "too-big": TOO_BIG, "oom": deep.OOM, "shape-mismatch": MISMATCH,
         "expect-missing": EXPECT, "worker": LOAD, "expect-unreadable": EXPECT, "bad-input": BAD_INPUT,
         "load": LOAD, "no-forward": BAD_INPUT, "forward": FORWARD, "import": TORCH_MISSING,
         "cuda-unavailable": TORCH_MISSING}


def validate(report: Any, device: str) -> dict[str, Any]:
    from probes.framework import model_worker

    deep.fields(report, model_worker.REPORT, "result")
    if report["v"] != model_worker.SCHEMA or report["device"] != device:
        raise deep.Bad("the result is for another request")
    if report["format"] is not None and report["format"] not in model_worker.FORMATS:
        raise deep.Bad("result.format is unknown")
    if report["error"] is not None:
        if report["error"]["kind"] not in KINDS:
            raise deep.Bad("result.error.kind is unknown")
    elif report["load_ms"] is None or report["params"] is None:
        raise deep.Bad("a passing result without load time or parameters")
    return deep.cleaned(report, 200)


def _file_id(path: str | None) -> list[int] | None:
    try:
        st = os.stat(path) if path else None
    except OSError:
        return None
    return None if st is None else [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def run_worker(ctx: Context) -> dict[str, Any]:
    from probes.framework import model_worker

    own, torch = ctx.config.of(Settings), ctx.config.of(Torch)
    # --flag=value: a value that starts with '-' is still the flag's value, never another flag.
    args = [f"--path={own.model_path}", f"--device={torch.torch_device}"]
    args += [f"--{flag}={value}" for flag, value in (("input", own.model_input), ("expect", own.model_expect),
                                                     ("max-bytes", own.model_max_bytes)) if value is not None]
    # The free GPU memory the load needs: the setting (0: off) plus the file's size, about its tensors'.
    found = _file_id(own.model_path)
    floor = torch.torch_min_free_mib
    need = floor + (-(-found[2] // 2**20) if found else 0) if floor else 0
    data = deep.run_worker(ctx, NAME, args, {}, model_worker,
                           lambda report: validate(report, torch.torch_device), PHASES, need)[0]
    err = (data.get("report") or {}).get("error")
    if err is not None and err["message"] not in model_worker.PHRASES:  # an exception's text: the log's
        logger().info("model worker: %s (%s): %s", err["kind"], err["type"], err["message"])
    return data


def gather(ctx: Context) -> dict[str, Any]:
    own, torch = ctx.config.of(Settings), ctx.config.of(Torch)
    if not own.model_path:
        return {"kind": "no-path"}
    key = {"python": torch.torch_python, "device": torch.torch_device, "path": own.model_path,
           "file": _file_id(own.model_path), "input": own.model_input, "expect": own.model_expect,
           "expect_file": _file_id(own.model_expect), "max_bytes": own.model_max_bytes,
           "identity": life_identity()}

    def reuse(entry: dict[str, Any] | None) -> dict[str, Any] | None:
        return deep.cached(entry, key, lambda report: validate(report, torch.torch_device), PHASES,
                           ttl=own.model_ttl)

    return deep.locked_run(ctx, CACHE, key, reuse, lambda: run_worker(ctx), judge, early=True,
                           hold=checkpoint.hold)


def on_deadline(ctx: Context) -> Result:
    return verdict(NAME, DEADLINE, "no result within the deadline: loading the model took too long "
                   "(a large model on a slow disk) or the GPU driver is stuck")


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def judge(data: dict[str, Any], ctx: Context) -> Result:
    room = data.get("room") if data.get("kind") == deep.WORKLOAD_MEMORY.reason else None
    if room and all(g["total_mib"] is not None and g["total_mib"] < room["need_mib"] for g in room["full"]):
        path = untrusted.clean(ctx.config.of(Settings).model_path or "", 120)
        return verdict(NAME, TOO_BIG, f"{path} would not fit: it needs {room['need_mib']} MiB ({ROOM}) "
                       "and no GPU has that much memory even when idle; not loaded", facts={"room": room})
    return deep.judged(NAME, data, ctx, _judge_run, room=ROOM, deadline=DEADLINE, unit=UNIT)


def _judge_run(data: dict[str, Any], ctx: Context) -> Result:
    path = untrusted.clean(ctx.config.of(Settings).model_path or "", 120)
    if data.get("kind") == "no-path":
        return verdict(NAME, MISSING, "HEALTHCHECK_MODEL_PATH is not set")
    kw: dict[str, Any] = {"unit": UNIT, "facts": {"path": path, "cache": data.get("cache")}}
    if (unrunnable := deep.cannot_run(NAME, data, ctx.config.of(Torch).torch_python, **kw)) is not None:
        return unrunnable
    report = data.get("report")
    if report is None or data.get("lingered"):
        return deep.no_report(NAME, data, "model worker", stuck=DEADLINE, timed_out=DEADLINE, **kw)
    kw["facts"].update({k: report[k] for k in ("format", "loader", "bytes", "budget", "params", "param_bytes",
                                                 "peak_gpu", "load_ms", "forward_ms")})
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
        finite = deep.finite(rel)
        kw["facts"]["max_rel_err"] = rel if finite else None
        tol = ctx.config.of(Settings).model_tolerance
        if not rel <= tol:  # NaN fails too
            return verdict(NAME, MISMATCH, f"output mismatch: {path}'s forward pass differs from "
                           f"HEALTHCHECK_MODEL_EXPECT by {f'{rel:.1e}' if finite else 'not a number'} "
                           f"(tolerance {tol:g})", observed=report["load_ms"], **kw)
        loaded += f", matches the expected output (max rel err {rel:.0e})"
    return passed(NAME, loaded, observed=report["load_ms"], **kw)


def _judge_error(err: dict[str, Any], report: dict[str, Any], path: str, kw: dict[str, Any]) -> Result:
    from probes.framework import cuda_errors, model_worker

    if err["kind"] in ("load", "forward", "worker", "oom"):  # the failures a CUDA error can be behind
        where = f"{report['device']}, loading {path}"
        found = cuda_errors.failure(NAME, cuda_errors.identify(err["code"], err["message"]), where, **kw)
        if found is not None:
            return found
    cause = KINDS[err["kind"]]
    # The worker's own phrase, or a fixed one: an exception's text went to the log.
    what = err["message"] if err["message"] in model_worker.PHRASES else "details in the log"
    kind = err["type"]  # an exception's class name as the worker reported it, if it looks like one
    if not (0 < len(kind) <= 60 and kind.replace("_", "a").replace(".", "a").isalnum() and kind.isascii()):
        kind = "an exception"
    detail = {
        MISSING: f"model file {path} not found",
        UNREADABLE: f"model file {path} cannot be read ({what})",
        UNSUPPORTED: f"{path} is not a supported model format ({what})",
        UNSAFE: f"{path} is a pickle that needs code to load: refused (weights_only), nothing executed",
        CORRUPT: f"{path} is damaged or truncated ({what})",
        TOO_BIG: f"{path} would not fit: {_size(report['bytes'])} of tensors, "
                 f"{_size(report['budget'])} allowed ({report['budget_source']}); not loaded",
        deep.OOM: f"out of memory loading {path} on {report['device']}",
        MISMATCH: f"output mismatch: {path}'s forward pass has another shape than HEALTHCHECK_MODEL_EXPECT "
                  "(both shapes are in the log)",
        EXPECT: f"HEALTHCHECK_MODEL_EXPECT cannot be used ({what})",
        BAD_INPUT: f"HEALTHCHECK_MODEL_INPUT cannot be used ({what})",
        TORCH_MISSING: f"torch cannot load models here ({what})",
        FORWARD: f"the forward pass of {path} failed ({kind})",
    }.get(cause, f"loading {path} failed ({kind})")
    return verdict(NAME, cause, detail, **kw)
