"""jupyter-kernel: through the running Jupyter Server, a kernel starts, imports torch and runs a
verified op on the torch-cuda probe's device, and is shut down.

The path a notebook user takes, and its hard cases (nothing left behind, a kernel that dies while
it starts, do no harm, cost): docs/probes.md, "The notebook path". The client is
probes/services/_kernel.py; one kernel's run and removal, probes/services/kernel_run.py.
"""

from __future__ import annotations

import math
import os
import time

from probes import deadlines, hardware, services, untrusted
from probes.framework import deep
from probes.result import Result, passed, verdict
from probes.services import jupyter
from probes.state import life_identity

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from probes.config import Config
    from probes.context import Context
    from probes.services._kernel import Server

SPEC = services.KERNEL_SPEC
NAME = SPEC.name
UNIT = "s"


def requirements(config: Config) -> tuple[str, ...]:
    """The server must answer; on the GPU, the image's own torch must work there first."""
    return (*SPEC.requires, "torch-cuda") if config.of(deep.Torch).torch_device == "cuda" else SPEC.requires


CACHE = "jupyter-kernel.json"
CLEANUP = 3.0  # seconds kept from the kernel's share for its removal (DELETE, then ending it)
SLACK = 1.0  # seconds of the server's activity after our status read that are our kernel's last messages
PREFIX = "HEALTHCHECK-KERNEL-RESULT "
TOLERANCE = 1e-4  # float32 against float64 at 256x256 differs by ~1e-6 of the largest value
# The cell: a function, so that it leaves one name (deleted) in a kernel that is deleted anyway.
CELL = '''def _healthcheck(device, gentle):
    import time
    out = {"torch": None, "cuda": None, "available": None, "count": None, "op": None, "error": None}
    try:
        import torch
    except BaseException as exc:
        out["error"] = {"phase": "import", "type": type(exc).__name__, "module": getattr(exc, "name", None),
                        "text": (str(exc).splitlines() or [""])[0][:200]}
        return out
    out["torch"], out["cuda"] = str(torch.__version__), torch.version.cuda
    if device == "cuda":
        out["available"], out["count"] = bool(torch.cuda.is_available()), int(torch.cuda.device_count())
        if gentle or not out["available"] or not out["count"]:
            return out
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        dev, g = torch.device(device), torch.Generator().manual_seed(1234)
        a = torch.randn(256, 256, generator=g, dtype=torch.float32)
        b = torch.randn(256, 256, generator=g, dtype=torch.float32)
        t0 = time.perf_counter()
        got = torch.matmul(a.to(dev), b.to(dev))
        if device == "cuda":
            torch.cuda.synchronize()
        ref = torch.matmul(a.double(), b.double())
        out["op"] = {"max_err": float((got.double().cpu() - ref).abs().max().item()),
                     "scale": float(ref.abs().max().item()), "ms": (time.perf_counter() - t0) * 1000}
    except BaseException as exc:
        out["error"] = {"phase": "op", "type": type(exc).__name__, "module": None,
                        "text": (str(exc).splitlines() or [""])[0][:200]}
    return out
print(%r + __import__("json").dumps(_healthcheck(%r, %r)))
del _healthcheck
'''


# ---------------------------------------------------------------- gather

def server(ctx: Context) -> tuple[Server, str | None, str]:
    """The server, found as the jupyter probe finds it; the runtime file that said so; and why the
    token file's token was withheld ("" when it was not, or there is none). ``Server.uid`` owns the
    socket listening on the port (None: none, or several uids); the token goes only with a
    listener of its owner (the trusted runtime file's, or the token file's)."""
    from probes.services._kernel import Server

    own = ctx.config.of(services.JupyterSettings)
    found, _ = jupyter.find_runtime_file(ctx.config, secret=True)
    if found is not None:  # trusted: its owner alone listens on its port
        where = (found["host"], found["port"], found["base_url"], found["secure"])
        pid, held, source = found["pid"], {found["owner"]}, found["file"]
        if found["token"]:
            return Server(*where, found["token"], pid, found["owner"]), source, ""
    else:
        where = (ctx.config.host, own.jupyter_port, own.jupyter_base_url, bool(own.jupyter_tls))
        pid, held, source = None, jupyter.listeners().get(own.jupyter_port, set()), None
    uid = next(iter(held)) if len(held) == 1 else None
    token, owner = jupyter.token_file(own.jupyter_token_file)
    withheld = jupyter.held_by(where[1], held, owner, "the token file") if token and owner is not None else ""
    return Server(*where, "" if withheld else token, pid, uid), source, withheld


def _key(ctx: Context, srv: Server) -> dict[str, Any]:
    return {"kernel": ctx.config.of(services.KernelSettings).jupyter_kernel_name,
            "device": ctx.config.of(deep.Torch).torch_device, "server": [srv.host, srv.port, srv.base_url],
            "identity": life_identity()}


def _reuse(entry: dict[str, Any] | None, key: dict[str, Any], ttl: float,
           status: tuple[int, float] | None) -> dict[str, Any] | None:
    """A cached result for the same key, judged again (a damaged entry is a miss): whatever it
    was while the server has stayed idle since (``status``: its kernels and last activity, which
    must be no later than the one read right after that run), else a pass (or do-no-harm
    warning) younger than ``ttl``; None when the kernel path must be checked."""
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    data, finished = entry.get("data"), _number(entry.get("finished"))
    if not isinstance(data, dict) or finished is None:
        return None
    age = time.time() - finished
    after = _number(data.get("after"))
    idle = status is not None and after is not None and status[0] == 0 and status[1] <= after + SLACK
    if not idle and (entry.get("status") not in ("pass", "warn") or not 0 <= age < ttl):
        return None
    try:
        result = _judge(data, None)
    except Exception:
        return None
    if result.status.value != entry.get("status"):
        return None
    return {**data, "cache": {"how": "idle" if idle else "ttl", "age": round(max(age, 0.0), 1)}}


def activity(srv: Server, deadline: float) -> tuple[int, float] | None:
    """The server's ``GET api/status``: how many kernels it runs and when it was last active
    (seconds since the epoch), or None."""
    from datetime import datetime

    from probes.services import _kernel

    got = _kernel.rest(srv, "GET", "api/status", deadline)
    doc = got.get("doc")
    if got["outcome"] != "response" or got.get("status") != 200 or not isinstance(doc, dict):
        return None
    kernels, when = _number(doc.get("kernels")), doc.get("last_activity")
    if kernels is None or not isinstance(when, str) or len(when) > 40:
        return None
    try:  # "2026-11-28T04:35:48.404000Z"; before Python 3.11 fromisoformat takes no "Z"
        stamp = datetime.fromisoformat(when.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (int(kernels), stamp.timestamp()) if stamp.tzinfo is not None else None


def gather(ctx: Context) -> dict[str, Any]:
    from probes.services import kernel_run

    srv, source, withheld = server(ctx)
    end = ctx.deadline - deadlines.MARGIN
    kernel_run.reap(ctx.state, srv, time.monotonic() + min(CLEANUP, max(0.0, end - time.monotonic()) / 4))
    if not ctx.state.enabled:
        return {**check(ctx, srv), "source": source, "withheld": withheld, "cache": {"how": "off"}}
    key = _key(ctx, srv)
    ttl = ctx.config.of(services.KernelSettings).jupyter_kernel_ttl
    # Readiness leaves an idle server idle: its kernel path is checked again once it is used.
    reuses = ctx.config.profile_rules.reuses_cache
    status = activity(srv, min(end, time.monotonic() + 2.0)) if reuses else None

    def run() -> dict[str, Any]:
        data = {**check(ctx, srv), "source": source, "withheld": withheld}
        after = activity(srv, min(end, time.monotonic() + 1.0))  # ours is gone: later activity is another's
        data["after"] = after[1] if after is not None else None
        return data

    return deep.locked_run(ctx, CACHE, key, lambda entry: _reuse(entry, key, ttl, status), run, judge,
                           early=True)


def _gentle(ctx: Context) -> dict[str, Any] | None:
    """The room survey's facts when the workload holds a GPU's memory (then no op runs), else None."""
    from probes.framework import free_memory

    own = ctx.config.of(deep.Torch)
    if own.torch_device != "cuda":
        return None
    space = free_memory.survey(own.torch_min_free_mib, os.environ)
    return space.facts() if space.full else None


def check(ctx: Context, srv: Server) -> dict[str, Any]:
    """The costly run: kernelspecs, a kernel, its cell, its removal."""
    from probes.services import _kernel, _net, kernel_run

    end = ctx.deadline - deadlines.MARGIN
    share = end - min(CLEANUP, max(0.0, end - time.monotonic()) / 4)
    device = ctx.config.of(deep.Torch).torch_device
    data: dict[str, Any] = {"kind": "kernel", "lingered": False, "device": device,
                            "where": _net.host_header(srv.host, srv.port),
                            "budget": round(max(0.0, share - time.monotonic()), 2)}
    specs = _kernel.rest(srv, "GET", "api/kernelspecs", share)
    listing = kernel_run.kernelspecs(specs)
    if listing is None:
        return {**data, "outcome": "api", "http": specs.get("status"), "net": specs["outcome"],
                "finished": time.time()}
    names, default, specs_by_name = listing
    name = ctx.config.of(services.KernelSettings).jupyter_kernel_name or default
    data["kernel"] = name
    if name not in specs_by_name:
        return {**data, "outcome": "kernelspec-missing", "names": names, "finished": time.time()}
    try:
        import websocket  # noqa: F401  (the channels' client: the jupyter extra)
    except ImportError:
        return {**data, "outcome": "no-client", "finished": time.time()}
    gentle = _gentle(ctx)
    data["room"] = gentle
    code = CELL % (PREFIX, device, gentle is not None)
    data.update(kernel_run.run(ctx, srv, name, specs_by_name[name], code, share, end))
    data["finished"] = time.time()
    return data


def on_deadline(ctx: Context) -> Result:
    return verdict(NAME, services.KERNEL_TIMEOUT, "no result within the deadline (the kernel the "
                   "probe started is removed when the suite exits, or by the next run)", unit=UNIT)


def end_all() -> None:
    """Remove every kernel a run of this process started and has not removed yet (SIGTERM, exit)."""
    from probes.services import kernel_run

    kernel_run.end_all()


# ---------------------------------------------------------------- judge

def judge(data: dict[str, Any], ctx: Context | None) -> Result:
    kind = data.get("kind")
    if kind == "lock-timeout":
        return deep.lock_timeout(NAME, data, unit=UNIT)
    result = _judge(data, ctx)
    cache = data.get("cache") or {}
    if cache.get("how") == "ttl":
        result = result._replace(message=f"{result.message} (cached, {cache.get('age', 0):.0f}s old)")
    elif cache.get("how") == "idle":
        result = result._replace(message=f"{result.message} (the result of {cache.get('age', 0):.0f}s ago: "
                                 "the server has been idle since)")
    if data.get("lingered") and result.reason != "kernel-left":
        left = data.get("cleanup", {}).get("left")
        return verdict(NAME, services.KERNEL_LEFT, f"{result.message}; and the kernel could not be removed "
                       f"({left} process(es) left)", unit=UNIT, facts=result.facts)
    return result


def _fields(data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    name = untrusted.clean(data.get("kernel") or "?", 40)
    facts = {"kernel": name, "device": data.get("device"), "runtime_file": data.get("source"),
             "cache": data.get("cache"), "cleanup": data.get("cleanup")}
    return f"kernel {name!r}", facts


def _judge(data: dict[str, Any], ctx: Context | None) -> Result:
    """The verdict on a run's data (a cached one's too): gather's outcome names the row."""
    what, facts = _fields(data)
    kw: dict[str, Any] = {"unit": UNIT, "facts": facts}
    outcome = data.get("outcome")
    where = untrusted.clean(data.get("where") or "?", 80)
    if outcome == "api":
        status = data.get("http")
        failing = isinstance(status, int) and status >= 500
        why = (f"HTTP {status}: no trusted runtime file gave the server's token" if status in (401, 403)
               else f"HTTP {status}: the server failed; "
                    "a read-only home or /tmp keeps it from listing kernels" if failing
               else f"HTTP {status}" if status else f"{untrusted.clean(data.get('net'), 30)}")
        if data.get("withheld"):
            why += f"; the token file's token was not sent: {untrusted.clean(data['withheld'], 160)}"
        return verdict(NAME, services.KERNEL_API_ERROR, f"the kernel API at {where} did not list "
                       f"kernelspecs ({why})", **kw)
    if outcome == "no-client":
        return verdict(NAME, services.KERNEL_CLIENT_MISSING, "not checked: websocket-client, which speaks to "
                       "a kernel's channels, is not installed beside the suite", **kw)
    if outcome == "kernelspec-missing":
        names = [untrusted.clean(n, 40) for n in data.get("names") or []]
        have = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "") or "none"
        return verdict(NAME, services.KERNELSPEC_MISSING, f"no kernelspec {what[7:]} on the server "
                       f"(it has: {have})", **kw)
    if outcome == "start-failed":
        why = untrusted.clean(data.get("why"), 200)
        if data.get("interpreter"):
            why += f" ({untrusted.clean(data['interpreter'], 160)})"
        return verdict(NAME, services.KERNEL_START_FAILED, f"the server could not start {what}: {why}", **kw)
    if outcome == "died":
        said, unread = data.get("said"), untrusted.clean(data.get("unread") or "", 80)
        shown = f": {untrusted.clean(said, 200)}" if said else \
            f"; the cause was not read ({unread}; the server's log has it)" if unread else \
            " (the server's log has its output)"
        return verdict(NAME, services.KERNEL_DIED, f"{what} died during start-up{shown}", **kw)
    if outcome == "channels-failed":
        why = untrusted.clean(data.get("why"), 80)
        denied = why.endswith(("HTTP 401", "HTTP 403"))
        found = services.KERNEL_API_ERROR if denied else services.KERNEL_START_FAILED
        return verdict(NAME, found, f"{what} started but {why}", **kw)
    if outcome == "timeout":
        stage = {"start": "to start", "connect": "to answer", "execute": "to run the cell"}.get(
            str(data.get("stage")), "to answer")
        budget = float(data.get("budget") or 0)
        cleanup = data.get("cleanup") or {}
        fate = "it was removed" if cleanup.get("deleted") else "the next run removes it" \
            if cleanup.get("recorded") else "it may not be removed (no state dir records it)"
        return verdict(NAME, services.KERNEL_TIMEOUT, f"{what} gave no verified reply within {budget:.1f}s: "
                       f"it took too long {stage}; {fate}", **kw)
    return _judge_reply(data, what, kw, ctx)


def _report(stdout: str) -> dict[str, Any] | None:
    """The cell's result line, read strictly (untrusted), or None."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith(PREFIX)]
    if len(lines) != 1:
        return None
    try:
        doc = untrusted.load_json(lines[0][len(PREFIX):].encode())
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))
    return float(value) if ok else None


def _judge_reply(data: dict[str, Any], what: str, kw: dict[str, Any], ctx: Context | None) -> Result:
    report = _report(str(data.get("stdout") or ""))
    if report is None:
        err = data.get("error") or {}
        shown = f" ({untrusted.clean(err.get('ename'), 60)}: {untrusted.clean(err.get('evalue'), 120)})" \
            if err else ""
        # Not a wrong matmul: the remedy for silent data corruption would mislead.
        return verdict(NAME, services.KERNEL_WRONG_RESULT, f"{what} ran the cell but gave no "
                       f"result line{shown}", remedy=False, **kw)
    version = untrusted.clean(report.get("torch") or "?", 40)
    kw["facts"]["torch"] = version
    err = report.get("error") if isinstance(report.get("error"), dict) else None
    if err is not None and err.get("phase") == "import":
        module = untrusted.clean(err.get("module") or "", 60)
        detail = (f"no module {module!r}" if module else
                  f"{untrusted.clean(err.get('type'), 40)}: {untrusted.clean(err.get('text'), 120)}")
        return verdict(NAME, services.KERNEL_NO_TORCH, f"{what} cannot import torch ({detail})", **kw)
    sees = report.get("available") is True and (_number(report.get("count")) or 0) > 0
    if data.get("device") == "cuda" and not sees:
        build = " (a CPU-only build)" if report.get("cuda") is None else ""
        return verdict(NAME, services.KERNEL_NO_GPU, f"{what}'s torch {version}{build} sees no CUDA "
                       f"device{_gpu_layer(ctx)}", **kw)
    if err is not None:
        raised = f"{untrusted.clean(err.get('type'), 40)}: {untrusted.clean(err.get('text'), 120)}"
        return verdict(NAME, services.KERNEL_OP_FAILED, f"the op failed in {what} ({raised})", **kw)
    observed = _number(data.get("observed"))
    if data.get("room") is not None:
        count = report.get("count")
        return verdict(NAME, services.KERNEL_WORKLOAD_MEMORY, f"{what} started in {observed or 0:.1f}s, "
                       f"imports torch {version} and sees {count} GPU(s); the op was not run: "
                       "the workload holds a GPU's memory", observed=observed, **kw)
    op = report.get("op")
    op = op if isinstance(op, dict) else {}
    err_max, scale = _number(op.get("max_err")), _number(op.get("scale"))
    if err_max is None or scale is None or scale <= 0 or err_max / scale > TOLERANCE:
        shown = f"{err_max / scale:.1e}" if err_max is not None and scale else "not a number"
        return verdict(NAME, services.KERNEL_WRONG_RESULT, f"wrong result in {what}: the matmul differs from "
                       f"the CPU reference by {shown} (tolerance {TOLERANCE:.0e})", **kw)
    device = untrusted.clean(data.get("device"), 8)
    return passed(NAME, f"{what} started and ran a verified matmul on {device} in {observed or 0:.1f}s "
                  f"(torch {version})", observed=observed, **kw)


def _gpu_layer(ctx: Context | None) -> str:
    """", while NVML sees 2 GPU(s)" when the GPU layer saw some in this run."""
    seen = hardware.seen(ctx.results) if ctx is not None else None
    count = seen.count if seen is not None and seen.ok else None
    return f" while NVML sees {count} GPU(s)" if count else ""
