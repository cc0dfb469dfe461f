"""jupyter-kernel: a kernel started through Jupyter Server runs a verified op with torch and is shut down
(docs/probes.md, "The notebook path"); kernel_run.py runs it."""

from __future__ import annotations

import os
import time

from probes import deadlines, untrusted
from probes.config import Config
from probes.context import Context
from probes.framework import deep
from probes.result import Result, passed, verdict
from probes.services import kernel_run
from probes.services.common import host_header, json_or_none
from probes.spec import NUMBER, TEXT, Declared, Spec, cause, setting
from probes.state import life_identity

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class KernelSettings(Declared):
    jupyter_kernel_name: str | None = setting("HEALTHCHECK_JUPYTER_KERNEL_NAME", TEXT, None,
                                              "the kernelspec jupyter-kernel starts",
                                              shown_default="the server's default kernelspec")
    jupyter_kernel_ttl: float = setting(
        "HEALTHCHECK_JUPYTER_KERNEL_TTL", NUMBER, 600.0, "seconds a passing jupyter-kernel result is reused "
        "by readiness while the server is in use (an idle server's last result stands until it is used)",
        low=0, high=86400, low_inclusive=True)


# The kernel, its kernelspec and its environment are the tenant's (their image, their ~/.local).
KERNEL_API_ERROR = cause(
    "api-error", "the kernel API did not answer `GET {base_url}api/kernelspecs` (401/403: no trusted "
    "runtime file gave the token, or the token file's was withheld from a listener of another uid; or the "
    "server is unreachable)", "point `HEALTHCHECK_JUPYTER_RUNTIME_DIR` at the server's runtime directory, "
    "or `HEALTHCHECK_JUPYTER_TOKEN_FILE` at its token; on HTTP 5xx see Jupyter Server's log",
    action="fix-config", actor="tenant")
KERNELSPEC_MISSING = cause(
    "kernelspec-missing", "the named (or default) kernelspec is not among the server's; the message lists "
    "those that are", "set `HEALTHCHECK_JUPYTER_KERNEL_NAME` to one of them, or install the kernel "
    "(`python -m ipykernel install`)", action="fix-config", actor="tenant")
KERNEL_START_FAILED = cause(
    "kernel-start-failed", "the server refused to start the kernel (its reason, cleaned and bounded: for "
    "example an interpreter that is gone)", "fix the kernelspec's `argv` (`jupyter kernelspec list`) or "
    "reinstall the kernel; see the server's log", action="fix-config", actor="tenant")
KERNEL_DIED = cause(
    "kernel-died", "the kernel process exited during start-up (or the server said it died); the message "
    "gives the line of its output that names the cause (the module or file that failed to import), read by "
    "running the kernelspec again as the server's uid, or says why it was not read",
    "remove or fix what breaks it (often a package under `~/.local`: `pip list --user`)",
    action="fix-config", actor="tenant")
KERNEL_TIMEOUT = cause(
    "kernel-timeout", "no verified reply within the kernel's share of the deadline; the kernel is removed "
    "(by the next run when the server had not yet answered its start)", "the kernel hangs or the machine "
    "is overloaded; raise `HEALTHCHECK_TIMEOUT` if the image is slow", action="retry", actor="tenant")
KERNEL_NO_TORCH = cause("kernel-no-torch", "the kernel's interpreter cannot import torch", "install torch "
                        "in the kernel's environment or point the kernelspec at the image's Python",
                        action="fix-config", actor="tenant")
KERNEL_NO_GPU = cause(
    "kernel-no-gpu", "the kernel's torch sees no CUDA device (a CPU-only torch in the kernel's environment, "
    "or `CUDA_VISIBLE_DEVICES` emptied)", "install a CUDA build of torch in the kernel's environment, or use "
    "the image's kernel; `HEALTHCHECK_TORCH_DEVICE=cpu` on CPU-only images", action="fix-config",
    actor="tenant")
KERNEL_OP_FAILED = cause("kernel-op-failed", "the op raised in the kernel (a CUDA error, out of memory)",
                         "see the error it names; check the torch-cuda probe", action="retry", actor="tenant")
# A wrong matmul is the GPU's: only the node's operator can drain the node and test it.
KERNEL_WRONG_RESULT = cause("kernel-wrong-result", "the cell's answer is not the verified result (a wrong "
                            "matmul, no result line, an error)", "silent data corruption; drain the node and "
                            "run `dcgmi diag`", action="service-hardware", actor="operator")
KERNEL_WORKLOAD_MEMORY = cause("workload-memory", "NVML says the workload holds a GPU's memory: "
                               "torch imported and the GPU seen, no op run", "not a fault: nothing to do",
                               "warn", action="none", actor="tenant")
KERNEL_CLIENT_MISSING = cause(
    "client-missing", "websocket-client is not installed beside the suite: no kernel was started",
    "install the suite with its `jupyter` extra (`pip install gpu-healthcheck[jupyter]`)", "warn",
    action="fix-config", actor="tenant")
KERNEL_LEFT = cause(
    "kernel-left", "the kernel could not be removed (its processes could not be ended)",
    "end them by hand (`jupyter` server log, `ps`); the suite may not signal the server's user",
    action="restart-app", actor="tenant")

SPEC = Spec(
    "jupyter-kernel", layer="services", module=__name__, toggle="ENABLE_JUPYTER_KERNEL_CHECK",
    follows="ENABLE_JUPYTER_CHECK", timeout=40.0, profiles=("startup", "readiness"), requires=("jupyter",),
    measurement="startTime",
    about="through Jupyter Server, a kernel of the default kernelspec starts, imports torch and runs a "
          "verified op on `HEALTHCHECK_TORCH_DEVICE`, and is shut down", settings=KernelSettings.SETTINGS,
    causes=(KERNEL_API_ERROR, KERNELSPEC_MISSING, KERNEL_START_FAILED, KERNEL_DIED, KERNEL_TIMEOUT,
            KERNEL_NO_TORCH, KERNEL_NO_GPU, KERNEL_OP_FAILED, KERNEL_WRONG_RESULT, KERNEL_WORKLOAD_MEMORY,
            KERNEL_CLIENT_MISSING, KERNEL_LEFT),
)
NAME = SPEC.name
UNIT = "s"
CACHE = "jupyter-kernel.json"
CLEANUP = 3.0  # seconds kept from the kernel's share for its removal (DELETE, then ending it)
SLACK = 1.0  # seconds of the server's activity after our status read that are our kernel's last messages
PREFIX = "HEALTHCHECK-KERNEL-RESULT "
TOLERANCE = 1e-4  # float32 against float64 at 256x256 differs by ~1e-6 of the largest value
# The cell: a function, so that it leaves one name (deleted) in a kernel that is deleted anyway.
CELL = '''def _healthcheck(device, gentle):
    out, phase = dict.fromkeys(("torch", "cuda", "available", "count", "op", "error")), "import"
    try:
        import torch
        out["torch"], out["cuda"], phase = str(torch.__version__), torch.version.cuda, "op"
        if device == "cuda":
            out["available"], out["count"] = bool(torch.cuda.is_available()), int(torch.cuda.device_count())
            if gentle or not out["available"] or not out["count"]:
                return out
        torch.backends.cuda.matmul.allow_tf32 = False
        dev, g = torch.device(device), torch.Generator().manual_seed(1234)
        a, b = (torch.randn(256, 256, generator=g, dtype=torch.float32) for _ in range(2))
        got = torch.matmul(a.to(dev), b.to(dev))  # brought back to the CPU below: a CUDA error raises there
        ref = torch.matmul(a.double(), b.double())
        out["op"] = {"max_err": float((got.double().cpu() - ref).abs().max().item()),
                     "scale": float(ref.abs().max().item())}
    except BaseException as exc:
        out["error"] = {"phase": phase, "type": type(exc).__name__, "module": getattr(exc, "name", None),
                        "text": (str(exc).splitlines() or [""])[0][:200]}
    return out
print(%r + __import__("json").dumps(_healthcheck(%r, %r)))
del _healthcheck
'''


def requirements(config: Config) -> tuple[str, ...]:
    """The server must answer; on the GPU, the image's own torch must work there first."""
    return (*SPEC.requires, "torch-cuda") if config.of(deep.Torch).torch_device == "cuda" else SPEC.requires


def _reuse(entry: dict[str, Any] | None, key: dict[str, Any], ttl: float,
           status: tuple[int, float] | None) -> dict[str, Any] | None:
    """A cached result for the same key, judged again: any while the server has stayed idle since
    (``status``: its kernels and last activity), else a pass or warning younger than ``ttl``."""
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    if not isinstance(data := entry.get("data"), dict) or not deep.finite(finished := entry.get("finished")):
        return None
    age, after = time.time() - finished, data.get("after")
    idle = status is not None and deep.finite(after) and status[0] == 0 and status[1] <= after + SLACK
    if not idle and (entry.get("status") not in ("pass", "warn") or not 0 <= age < ttl):
        return None
    try:
        if _judge(data, None).status.value != entry.get("status"):
            return None
    except Exception:
        return None
    return {**data, "cache": {"how": "idle" if idle else "ttl", "age": round(max(age, 0.0), 1)}}


def gather(ctx: Context) -> dict[str, Any]:
    srv, source, withheld = kernel_run.server(ctx)
    end = ctx.deadline - deadlines.MARGIN
    kernel_run.reap(ctx.state, srv, time.monotonic() + min(CLEANUP, max(0.0, end - time.monotonic()) / 4))
    own = ctx.config.of(KernelSettings)
    key = {"kernel": own.jupyter_kernel_name, "device": ctx.config.of(deep.Torch).torch_device,
           "server": [srv.host, srv.port, srv.base_url], "identity": life_identity()}
    # Readiness leaves an idle server idle: its kernel path is checked again once it is used.
    reuses = ctx.config.profile_rules.reuses_cache
    status = kernel_run.activity(srv, min(end, time.monotonic() + 2.0)) if reuses else None

    def run() -> dict[str, Any]:
        data = {**check(ctx, srv), "source": source, "withheld": withheld, "finished": time.time()}
        after = kernel_run.activity(srv, min(end, time.monotonic() + 1.0))  # later activity is another's
        return {**data, "after": after[1] if after is not None else None}

    return deep.locked_run(ctx, CACHE, key, lambda entry: _reuse(entry, key, own.jupyter_kernel_ttl, status),
                           run, judge, early=True)


def check(ctx: Context, srv: kernel_run.Server) -> dict[str, Any]:
    end = ctx.deadline - deadlines.MARGIN
    share = end - min(CLEANUP, max(0.0, end - time.monotonic()) / 4)
    torch, where = ctx.config.of(deep.Torch), host_header(srv.host, srv.port)
    data: dict[str, Any] = {"kind": "kernel", "lingered": False, "device": torch.torch_device, "where": where,
                            "budget": round(max(0.0, share - time.monotonic()), 2)}
    got = kernel_run.rest(srv, "GET", "api/kernelspecs", share)
    doc = got.get("doc") if got.get("status") == 200 else None
    if not isinstance(doc, dict) or not isinstance(doc.get("kernelspecs"), dict):
        return {**data, "outcome": "api", "http": got.get("status"), "net": got["outcome"]}
    specs = {name: kernel_run.command(entry) for name, entry in list(doc["kernelspecs"].items())[:32]}
    default = str(doc["default"]) if isinstance(doc.get("default"), str) else ""
    data["kernel"] = name = ctx.config.of(KernelSettings).jupyter_kernel_name or default
    if name not in specs:  # the judge cleans the names it shows
        return {**data, "outcome": "kernelspec-missing", "names": sorted(specs)}
    try:
        import websocket  # noqa: F401  (the channels' client: the jupyter extra)
    except ImportError:
        return {**data, "outcome": "no-client"}
    # Do no harm: where the workload holds a GPU's memory, the cell only looks (no op, no context).
    space = deep.survey(torch.torch_min_free_mib, os.environ) if torch.torch_device == "cuda" else None
    data["room"] = space.facts() if space is not None and space.full else None
    code = CELL % (PREFIX, torch.torch_device, data["room"] is not None)
    return {**data, **kernel_run.run(ctx, srv, name, specs[name], code, share, end)}


def on_deadline(ctx: Context) -> Result:
    return verdict(NAME, KERNEL_TIMEOUT, "no result within the deadline (the kernel the probe started is "
                   "removed when the suite exits, or by the next run)", unit=UNIT)


def judge(data: dict[str, Any], ctx: Context | None) -> Result:
    if data.get("kind") == "lock-timeout":
        return deep.lock_timeout(NAME, data, unit=UNIT)
    result = _judge(data, ctx)
    cache = data.get("cache") or {}
    said = {"ttl": "cached, {:.0f}s old", "idle": "the result of {:.0f}s ago: the server has been idle since"}
    if cache.get("how") in said:
        note = said[cache["how"]].format(cache.get("age", 0))
        result = result._replace(message=f"{result.message} ({note})")
    if data.get("lingered"):
        left = data.get("cleanup", {}).get("left")
        return verdict(NAME, KERNEL_LEFT, f"{result.message}; and the kernel could not be removed ({left} "
                       "process(es) left)", unit=UNIT, facts=result.facts)
    return result


def _judge(data: dict[str, Any], ctx: Context | None) -> Result:
    clean = untrusted.clean
    name, outcome, status = clean(data.get("kernel") or "?", 40), data.get("outcome"), data.get("http")
    what, where = f"kernel {name!r}", clean(data.get("where") or "?", 80)
    facts = {"kernel": name, "device": data.get("device"), "runtime_file": data.get("source"),
             "cache": data.get("cache"), "cleanup": data.get("cleanup")}
    kw: dict[str, Any] = {"unit": UNIT, "facts": facts}
    if outcome == "api":
        why = (f"HTTP {status}: no trusted runtime file gave the server's token" if status in (401, 403)
               else f"HTTP {status}: the server failed; a read-only home or /tmp keeps it from listing "
                    "kernels" if isinstance(status, int) and status >= 500
               else f"HTTP {status}" if status else clean(data.get("net"), 30))
        if data.get("withheld"):
            why += f"; the token file's token was not sent: {clean(data['withheld'], 160)}"
        return verdict(NAME, KERNEL_API_ERROR, f"the kernel API at {where} did not list kernelspecs ({why})",
                       **kw)
    if outcome == "no-client":
        return verdict(NAME, KERNEL_CLIENT_MISSING, "not checked: websocket-client, which speaks to a "
                       "kernel's channels, is not installed beside the suite", **kw)
    if outcome == "kernelspec-missing":
        names = [clean(n, 40) for n in data.get("names") or []]
        have = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "") or "none"
        return verdict(NAME, KERNELSPEC_MISSING, f"no kernelspec {name!r} on the server (it has: {have})",
                       **kw)
    if outcome == "start-failed":
        why = clean(data.get("why"), 200) + (f" ({clean(data['interpreter'], 160)})"
                                             if data.get("interpreter") else "")
        return verdict(NAME, KERNEL_START_FAILED, f"the server could not start {what}: {why}", **kw)
    if outcome == "died":
        said, unread = data.get("said"), clean(data.get("unread") or "", 80)
        shown = (f": {clean(said, 200)}" if said
                 else f"; the cause was not read ({unread}; the server's log has it)" if unread
                 else " (the server's log has its output)")
        return verdict(NAME, KERNEL_DIED, f"{what} died during start-up{shown}", **kw)
    if outcome == "channels-failed":
        why = clean(data.get("why"), 80)
        found = KERNEL_API_ERROR if why.endswith(("HTTP 401", "HTTP 403")) else KERNEL_START_FAILED
        return verdict(NAME, found, f"{what} started but {why}", **kw)
    if outcome == "timeout":
        stage = {"start": "to start", "execute": "to run the cell"}.get(str(data.get("stage")), "to answer")
        cleanup = data.get("cleanup") or {}
        fate = ("it was removed" if cleanup.get("deleted") else "the next run removes it"
                if cleanup.get("recorded") else "it may not be removed (no state dir records it)")
        return verdict(NAME, KERNEL_TIMEOUT, f"{what} gave no verified reply within "
                       f"{float(data.get('budget') or 0):.1f}s: it took too long {stage}; {fate}", **kw)
    return _judge_reply(data, what, kw, ctx)


def _judge_reply(data: dict[str, Any], what: str, kw: dict[str, Any], ctx: Context | None) -> Result:
    clean = untrusted.clean
    lines = [ln for ln in str(data.get("stdout") or "").splitlines() if ln.startswith(PREFIX)]
    report = json_or_none(lines[0][len(PREFIX):]) if len(lines) == 1 else None  # the cell's one result line
    if not isinstance(report, dict):
        err = data.get("error")
        shown = f" ({clean(err.get('ename'), 60)}: {clean(err.get('evalue'), 120)})" if err else ""
        # Not a wrong matmul: the remedy for silent data corruption would mislead.
        return verdict(NAME, KERNEL_WRONG_RESULT, f"{what} ran the cell but gave no result line{shown}",
                       remedy=False, **kw)
    version = kw["facts"]["torch"] = clean(report.get("torch") or "?", 40)
    err = report["error"] if isinstance(report.get("error"), dict) else None
    raised = f"{clean(err.get('type'), 40)}: {clean(err.get('text'), 120)}" if err is not None else ""
    if err is not None and err.get("phase") == "import":
        module = clean(err.get("module") or "", 60)
        return verdict(NAME, KERNEL_NO_TORCH, f"{what} cannot import torch "
                       f"({f'no module {module!r}' if module else raised})", **kw)
    sees = report.get("available") is True and deep.finite(count := report.get("count")) and count > 0
    if data.get("device") == "cuda" and not sees:
        from probes.hardware import common as hardware

        seen = hardware.seen(ctx.results) if ctx is not None else None
        count = f" while NVML sees {seen.count} GPU(s)" if seen is not None and seen.ok and seen.count else ""
        build = " (a CPU-only build)" if report.get("cuda") is None else ""
        return verdict(NAME, KERNEL_NO_GPU, f"{what}'s torch {version}{build} sees no CUDA device{count}",
                       **kw)
    if err is not None:
        return verdict(NAME, KERNEL_OP_FAILED, f"the op failed in {what} ({raised})", **kw)
    observed = float(data["observed"]) if deep.finite(data.get("observed")) else None
    if data.get("room") is not None:
        return verdict(NAME, KERNEL_WORKLOAD_MEMORY, f"{what} started in {observed or 0:.1f}s, imports torch "
                       f"{version} and sees {report.get('count')} GPU(s); the op was not run: "
                       "the workload holds a GPU's memory", observed=observed, **kw)
    op = report["op"] if isinstance(report.get("op"), dict) else {}
    err_max, scale = op.get("max_err"), op.get("scale")
    ratio = err_max / scale if deep.finite(err_max) and deep.finite(scale) and scale > 0 else None
    if ratio is None or ratio > TOLERANCE:
        shown = f"{ratio:.1e}" if ratio is not None else "not a number"
        return verdict(NAME, KERNEL_WRONG_RESULT, f"wrong result in {what}: the matmul differs from the CPU "
                       f"reference by {shown} (tolerance {TOLERANCE:.0e})", **kw)
    return passed(NAME, f"{what} started and ran a verified matmul on {clean(data.get('device'), 8)} in "
                  f"{observed or 0:.1f}s (torch {version})", observed=observed, **kw)
