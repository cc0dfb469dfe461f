"""jupyter-kernel: through the running Jupyter Server, a kernel starts, imports torch and runs a
verified op on the torch-cuda probe's device, and is shut down.

The path a notebook user takes: the server found as the jupyter probe finds it (port, base
URL, TLS, a trusted runtime file and the token in it, sent in a header and never shown),
``GET {base_url}api/kernelspecs``, the kernelspec HEALTHCHECK_JUPYTER_KERNEL_NAME or the
server's default, ``POST {base_url}api/kernels``, one cell over the kernel's channels
(probes/services/_kernel.py) that imports torch and runs a seeded float32 matmul on
HEALTHCHECK_TORCH_DEVICE checked against a float64 CPU reference, then
``DELETE {base_url}api/kernels/<id>``. Observed value: seconds from the start request to the
verified reply.

Command-line equivalent::

    curl -H "Authorization: token $T" -X POST -d '{"name": "python3"}' http://127.0.0.1:8888/api/kernels
    # then run `import torch; torch.ones(2, device="cuda") @ ...` in that kernel, and DELETE it

Hard cases, decided here:
- Nothing is left behind: the kernel is deleted through the API on every path (pass, failure,
  deadline, and a SIGTERM to the suite: ``end_all``). When the server cannot shut it down
  within its share of the time, its processes (found by their connection file) are ended as
  the suite ends its own workers. Only the kernel this probe started is ever touched.
- The kernel gets the probe's deadline less a reserve for that shut-down (CLEANUP): a kernel
  that never answers ends with ``kernel-timeout`` in time to be removed.
- A kernel that dies while it starts (an interpreter that is gone, a package under ``~/.local``
  that breaks ipykernel): the kernelspec's command is run once more as a contained child of the
  suite, as the server's user with the server's environment, to read the line that names the
  cause; nothing else of the kernel's output is shown.
- Do no harm: when NVML says the workload holds a GPU's memory (torch-cuda's rule,
  HEALTHCHECK_TORCH_MIN_FREE_MIB), the cell only imports torch and asks whether it sees the
  GPU (no CUDA context) and the probe warns that the op was not run.
- Cost: one costly check at a time (torch-cuda's lock); readiness reuses a pass (or that
  warning) younger than HEALTHCHECK_JUPYTER_KERNEL_TTL; startup always runs it; liveness never.
"""

from __future__ import annotations

from probes.record import Record
from probes.spec import ABSOLUTE_PATH, NUMBER, TEXT, Setting, Spec
from probes.spec import cause as _c

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from probes.config import Config
    from probes.context import Context
    from probes.result import Result
    from probes.services._kernel import Server

NAME = "jupyter-kernel"
MEASUREMENT = "startTime"
UNIT = "s"

SPEC = Spec(
    NAME, "services", __name__, "ENABLE_JUPYTER_KERNEL_CHECK", 40.0, ("startup", "readiness"),
    requires=("jupyter",), measurement=MEASUREMENT, follows="ENABLE_JUPYTER_CHECK",
    about="through Jupyter Server, a kernel of the default kernelspec starts, imports torch and runs a "
          "verified op on `HEALTHCHECK_TORCH_DEVICE`, and is shut down",
    settings=(
        Setting("HEALTHCHECK_JUPYTER_KERNEL_NAME", "jupyter_kernel_name", TEXT, None,
                "the kernelspec jupyter-kernel starts", shown_default="the server's default kernelspec"),
        Setting("HEALTHCHECK_JUPYTER_KERNEL_TTL", "jupyter_kernel_ttl", NUMBER, 600.0,
                "seconds a passing jupyter-kernel result is reused by readiness", low=0, high=86400,
                low_inclusive=True),
        Setting("HEALTHCHECK_JUPYTER_TOKEN_FILE", "jupyter_token_file", ABSOLUTE_PATH, None,
                "a file holding the server's token, for when no trusted runtime file gives it (a probe run "
                "as root without `CAP_SYS_PTRACE`, as in the image)", shown_default="none"),
    ),
    causes=(
        _c("api-error", "the kernel API did not answer `GET {base_url}api/kernelspecs` (401/403: no trusted "
           "runtime file gave the token; or the server is unreachable)",
           "point `HEALTHCHECK_JUPYTER_RUNTIME_DIR` at the server's runtime directory; see the jupyter "
           "probe"),
        _c("kernelspec-missing", "the named (or default) kernelspec is not among the server's; the message "
           "lists those that are", "set `HEALTHCHECK_JUPYTER_KERNEL_NAME` to one of them, or install the "
           "kernel (`python -m ipykernel install`)"),
        _c("kernel-start-failed", "the server refused to start the kernel (its reason, cleaned and bounded: "
           "for example an interpreter that is gone)", "fix the kernelspec's `argv` (`jupyter kernelspec "
           "list`), or reinstall the kernel"),
        _c("kernel-died", "the kernel process exited during start-up; the message gives the line of its "
           "output that names the cause (the module that failed to import)",
           "remove or fix what breaks it, often a package under `~/.local` (`pip list --user`)"),
        _c("kernel-timeout", "no verified reply within the kernel's share of the deadline; the kernel is "
           "removed", "the kernel hangs at start or the machine is overloaded; raise `HEALTHCHECK_TIMEOUT` "
           "if the image is slow"),
        _c("kernel-no-torch", "the kernel's interpreter cannot import torch",
           "install torch in the kernel's environment, or point the kernelspec at the image's Python"),
        _c("kernel-no-gpu", "the kernel's torch sees no CUDA device (a CPU-only torch in the kernel's "
           "environment, or `CUDA_VISIBLE_DEVICES` emptied)", "install a CUDA build of torch there, or use "
           "the image's kernel; `HEALTHCHECK_TORCH_DEVICE=cpu` on CPU-only images"),
        _c("kernel-op-failed", "the op raised in the kernel (a CUDA error, out of memory)",
           "see the error named in the message; check the torch-cuda probe"),
        _c("kernel-wrong-result", "the cell's answer is not the verified result (a wrong matmul, no result "
           "line, an error)", "a wrong matmul is silent data corruption: drain the node and run "
           "`dcgmi diag`"),
        _c("workload-memory", "NVML says the workload holds a GPU's memory: torch imported and the GPU seen, "
           "no op run", "none: not a fault", "warn"),
        _c("client-missing", "websocket-client is not installed beside the suite: no kernel was started",
           "install the suite with its `jupyter` extra (`pip install gpu-healthcheck[jupyter]`)", "warn"),
        _c("kernel-left", "the kernel could not be removed (its processes could not be ended)",
           "end them by hand (`jupyter` server log, `ps`); the suite may not signal the server's user"),
    ),
)


class Settings(Record):
    """The settings jupyter-kernel reads, typed (``config.of(Settings)``)."""

    __slots__ = ("jupyter_kernel_name", "jupyter_kernel_ttl", "jupyter_token_file")

    jupyter_kernel_name: str | None
    jupyter_kernel_ttl: float
    jupyter_token_file: str | None

    def __init__(self, jupyter_kernel_name: str | None, jupyter_kernel_ttl: float,
                 jupyter_token_file: str | None) -> None:
        self.jupyter_kernel_name = jupyter_kernel_name
        self.jupyter_kernel_ttl = jupyter_kernel_ttl
        self.jupyter_token_file = jupyter_token_file


def requirements(config: Config) -> tuple[str, ...]:
    """The server must answer; on the GPU, the image's own torch must work there first."""
    from probes.framework.deep import Torch

    return (*SPEC.requires, "torch-cuda") if config.of(Torch).torch_device == "cuda" else SPEC.requires


CACHE = "jupyter-kernel.json"
CLEANUP = 3.0  # seconds kept from the kernel's share for its removal (DELETE, then ending it)
REPLAY = 5.0  # seconds the kernelspec's command gets when run again to read why it died
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

def server(ctx: Context) -> tuple[Server, str | None]:
    """The server, found as the jupyter probe finds it, and the runtime file that said so."""
    from probes.services import jupyter
    from probes.services._kernel import Server

    found, _ = jupyter.find_runtime_file(ctx.config, secret=True)
    if found is not None and found["token"]:
        return Server(found["host"], found["port"], found["base_url"], found["secure"], found["token"],
                      found["pid"]), found["file"]
    token = token_file(ctx.config.of(Settings).jupyter_token_file)
    if found is not None:
        return Server(found["host"], found["port"], found["base_url"], found["secure"], token,
                      found["pid"]), found["file"]
    own = ctx.config.of(jupyter.Settings)
    return Server(ctx.config.host, own.jupyter_port, own.jupyter_base_url, bool(own.jupyter_tls), token,
                  None), None


def token_file(path: str | None) -> str:
    """The token in HEALTHCHECK_JUPYTER_TOKEN_FILE (one line; a regular file of at most 4 KiB,
    never through a link, never blocking), or "" when there is none we can use."""
    from probes import untrusted
    from probes.services import jupyter

    if not path:
        return ""
    try:
        raw, _ = untrusted.read_regular(path, 4096)
    except untrusted.Refused:
        return ""
    return jupyter.token(raw.decode("ascii", "replace").strip())


def _key(ctx: Context, srv: Server) -> dict[str, Any]:
    from probes.framework.deep import Torch
    from probes.state import life_identity

    return {"kernel": ctx.config.of(Settings).jupyter_kernel_name,
            "device": ctx.config.of(Torch).torch_device, "server": [srv.host, srv.port, srv.base_url],
            "identity": life_identity()}


def _reuse(entry: dict[str, Any] | None, key: dict[str, Any], ttl: float) -> dict[str, Any] | None:
    """A cached pass (or do-no-harm warning) for the same key younger than ``ttl``, judged again
    (a damaged entry is a miss), or None."""
    import time

    if not isinstance(entry, dict) or entry.get("key") != key or entry.get("status") not in ("pass", "warn"):
        return None
    data, finished = entry.get("data"), entry.get("finished")
    if not isinstance(data, dict) or not isinstance(finished, (int, float)) or isinstance(finished, bool):
        return None
    age = time.time() - float(finished)
    if not 0 <= age < ttl:
        return None
    try:
        result = _judge(data, None)
    except Exception:
        return None
    if result.status.value != entry["status"]:
        return None
    return {**data, "cache": {"how": "ttl", "age": round(age, 1)}}


def gather(ctx: Context) -> dict[str, Any]:
    from probes.framework import deep

    srv, source = server(ctx)
    if not ctx.state.enabled:
        return {**check(ctx, srv), "source": source, "cache": {"how": "off"}}
    key = _key(ctx, srv)
    ttl = ctx.config.of(Settings).jupyter_kernel_ttl
    data = deep.locked_run(ctx, CACHE, key, lambda entry: _reuse(entry, key, ttl),
                           lambda: {**check(ctx, srv), "source": source}, judge, early=True)
    return data


def _gentle(ctx: Context) -> dict[str, Any] | None:
    """The room survey's facts when the workload holds a GPU's memory (then no op runs), else None."""
    import os

    from probes.framework import room
    from probes.framework.deep import Torch

    own = ctx.config.of(Torch)
    if own.torch_device != "cuda":
        return None
    space = room.survey(own.torch_min_free_mib, os.environ)
    return space.facts() if space.full else None


def check(ctx: Context, srv: Server) -> dict[str, Any]:
    """The costly run: kernelspecs, a kernel, its cell, its removal (see the module's docstring)."""
    import time

    from probes import proc
    from probes.framework.deep import Torch
    from probes.services import _kernel, _net, kernel_run

    end = ctx.deadline - proc.MARGIN
    share = end - min(CLEANUP, max(0.0, end - time.monotonic()) / 4)
    device = ctx.config.of(Torch).torch_device
    data: dict[str, Any] = {"kind": "kernel", "lingered": False, "device": device,
                            "where": _net.host_header(srv.host, srv.port),
                            "budget": round(max(0.0, share - time.monotonic()), 2)}
    specs = _kernel.rest(srv, "GET", "api/kernelspecs", share)
    listing = kernel_run.kernelspecs(specs)
    if listing is None:
        return {**data, "outcome": "api", "http": specs.get("status"), "net": specs["outcome"],
                "finished": time.time()}
    names, default, specs_by_name = listing
    name = ctx.config.of(Settings).jupyter_kernel_name or default
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
    from probes.result import failed

    return failed(NAME, "no result within the deadline: the kernel or the server is stuck; the kernel "
                  "started by the probe is removed when the suite exits", reason="kernel-timeout", unit=UNIT)


def end_all() -> None:
    """Remove every kernel a run of this process started and has not removed yet (SIGTERM, exit)."""
    from probes.services import kernel_run

    kernel_run.end_all()


# ---------------------------------------------------------------- judge

def judge(data: dict[str, Any], ctx: Context | None) -> Result:
    from probes.framework import deep
    from probes.result import failed

    kind = data.get("kind")
    if kind == "lock-timeout":
        return deep.lock_timeout(NAME, data, unit=UNIT)
    result = _judge(data, ctx)
    cache = data.get("cache") or {}
    if cache.get("how") == "ttl":
        result = result._replace(message=f"{result.message} (cached, {cache.get('age', 0):.0f}s old)")
    if data.get("lingered") and result.reason != "kernel-left":
        left = data.get("cleanup", {}).get("left")
        return failed(NAME, f"{result.message}; and the kernel could not be removed ({left} process(es) "
                      "left): end them by hand", reason="kernel-left", unit=UNIT, facts=result.facts)
    return result


def _fields(data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    from probes import untrusted

    name = untrusted.clean(data.get("kernel") or "?", 40)
    facts = {"kernel": name, "device": data.get("device"), "runtime_file": data.get("source"),
             "cache": data.get("cache"), "cleanup": data.get("cleanup")}
    return f"kernel {name!r}", facts


def _judge(data: dict[str, Any], ctx: Context | None) -> Result:
    """The verdict on a run's data (a cached one's too): gather's outcome names the row."""
    from probes import untrusted
    from probes.result import failed, warned

    what, facts = _fields(data)
    kw: dict[str, Any] = {"unit": UNIT, "facts": facts}
    outcome = data.get("outcome")
    where = untrusted.clean(data.get("where") or "?", 80)
    if outcome == "api":
        status = data.get("http")
        why = (f"HTTP {status}: no trusted runtime file gave the server's token" if status in (401, 403)
               else f"HTTP {status}" if status else f"{untrusted.clean(data.get('net'), 30)}")
        fix = ("the server failed: see Jupyter Server's log (a read-only home or /tmp keeps it from "
               "listing kernels)" if isinstance(status, int) and status >= 500 else
               "point HEALTHCHECK_JUPYTER_RUNTIME_DIR at the server's runtime directory")
        return failed(NAME, f"the kernel API at {where} did not list kernelspecs ({why}): {fix}",
                      reason="api-error", **kw)
    if outcome == "no-client":
        return warned(NAME, "not checked: websocket-client, which speaks to a kernel's channels, is not "
                      "installed beside the suite: install gpu-healthcheck[jupyter]", reason="client-missing",
                      **kw)
    if outcome == "kernelspec-missing":
        names = [untrusted.clean(n, 40) for n in data.get("names") or []]
        have = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "") or "none"
        return failed(NAME, f"no kernelspec {what[7:]} on the server (it has: {have}): set "
                      "HEALTHCHECK_JUPYTER_KERNEL_NAME to one of them or install the kernel",
                      reason="kernelspec-missing", **kw)
    if outcome == "start-failed":
        why = untrusted.clean(data.get("why"), 200)
        if data.get("interpreter"):
            why += f" ({untrusted.clean(data['interpreter'], 160)})"
        return failed(NAME, f"the server could not start {what}: {why}: fix the kernelspec's "
                      "argv (jupyter kernelspec list) or reinstall the kernel",
                      reason="kernel-start-failed", **kw)
    if outcome == "died":
        said = data.get("said")
        cause = f": {untrusted.clean(said, 200)}" if said else " (the server's log has its output)"
        return failed(NAME, f"{what} died during start-up{cause}: remove or fix what breaks it (often a "
                      "package under ~/.local: pip list --user)", reason="kernel-died", **kw)
    if outcome == "channels-failed":
        why = untrusted.clean(data.get("why"), 80)
        denied = why.endswith(("HTTP 401", "HTTP 403"))
        return failed(NAME, f"{what} started but {why}: " + (
            "point HEALTHCHECK_JUPYTER_RUNTIME_DIR or HEALTHCHECK_JUPYTER_TOKEN_FILE at the server's token"
            if denied else "see the server's log; fix the kernelspec or reinstall the kernel"),
            reason="api-error" if denied else "kernel-start-failed", **kw)
    if outcome == "timeout":
        stage = {"start": "to start", "connect": "to answer", "execute": "to run the cell"}.get(
            str(data.get("stage")), "to answer")
        return failed(NAME, f"{what} gave no verified reply within {float(data.get('budget') or 0):.1f}s: it "
                      f"took too long {stage}; it was removed: the kernel hangs or the machine is "
                      "overloaded", reason="kernel-timeout", **kw)
    return _judge_reply(data, what, kw, ctx)


def _report(stdout: str) -> dict[str, Any] | None:
    """The cell's result line, read strictly (untrusted), or None."""
    from probes import untrusted

    lines = [ln for ln in stdout.splitlines() if ln.startswith(PREFIX)]
    if len(lines) != 1:
        return None
    try:
        doc = untrusted.load_json(lines[0][len(PREFIX):].encode())
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _number(value: Any) -> float | None:
    import math

    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))
    return float(value) if ok else None


def _judge_reply(data: dict[str, Any], what: str, kw: dict[str, Any], ctx: Context | None) -> Result:
    from probes import untrusted
    from probes.result import failed, passed, warned

    report = _report(str(data.get("stdout") or ""))
    if report is None:
        err = data.get("error") or {}
        shown = f" ({untrusted.clean(err.get('ename'), 60)}: {untrusted.clean(err.get('evalue'), 120)})" \
            if err else ""
        return failed(NAME, f"{what} ran the cell but gave no result line{shown}",
                      reason="kernel-wrong-result", **kw)
    version = untrusted.clean(report.get("torch") or "?", 40)
    kw["facts"]["torch"] = version
    err = report.get("error") if isinstance(report.get("error"), dict) else None
    if err is not None and err.get("phase") == "import":
        module = untrusted.clean(err.get("module") or "", 60)
        detail = (f"no module {module!r}" if module else
                  f"{untrusted.clean(err.get('type'), 40)}: {untrusted.clean(err.get('text'), 120)}")
        return failed(NAME, f"{what} cannot import torch ({detail}): install torch in the kernel's "
                      "environment or point the kernelspec at the image's Python", reason="kernel-no-torch",
                      **kw)
    sees = report.get("available") is True and (_number(report.get("count")) or 0) > 0
    if data.get("device") == "cuda" and not sees:
        build = " (a CPU-only build)" if report.get("cuda") is None else ""
        return failed(NAME, f"{what}'s torch {version}{build} sees no CUDA device{_gpu_layer(ctx)}: "
                      "install a CUDA build of torch in the kernel's environment, or use the image's kernel",
                      reason="kernel-no-gpu", **kw)
    if err is not None:
        return failed(NAME, f"the op failed in {what} ({untrusted.clean(err.get('type'), 40)}: "
                      f"{untrusted.clean(err.get('text'), 120)})", reason="kernel-op-failed", **kw)
    observed = _number(data.get("observed"))
    if data.get("room") is not None:
        return warned(NAME, f"{what} started in {observed or 0:.1f}s, imports torch {version} and sees "
                      f"{report.get('count')} GPU(s); the op was not run: the workload holds a GPU's memory "
                      "(not a fault)", reason="workload-memory", observed=observed, **kw)
    op = report.get("op")
    op = op if isinstance(op, dict) else {}
    err_max, scale = _number(op.get("max_err")), _number(op.get("scale"))
    if err_max is None or scale is None or scale <= 0 or err_max / scale > TOLERANCE:
        shown = f"{err_max / scale:.1e}" if err_max is not None and scale else "not a number"
        return failed(NAME, f"wrong result in {what}: the matmul differs from the CPU reference by {shown} "
                      f"(tolerance {TOLERANCE:.0e}): silent data corruption; drain the node and run "
                      "dcgmi diag",
                      reason="kernel-wrong-result", **kw)
    device = untrusted.clean(data.get("device"), 8)
    return passed(NAME, f"{what} started and ran a verified matmul on {device} in {observed or 0:.1f}s "
                  f"(torch {version})", observed=observed, **kw)


def _gpu_layer(ctx: Context | None) -> str:
    """", while NVML sees 2 GPU(s)" when the GPU layer saw some in this run."""
    nvml = ctx.results.get("nvml") if ctx is not None else None
    count = nvml.facts.get("count") if nvml is not None and nvml.ok else None
    return f" while NVML sees {count} GPU(s)" if isinstance(count, int) and count > 0 else ""
