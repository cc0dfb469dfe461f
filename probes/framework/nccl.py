"""nccl: NCCL works in this container: one all-reduce across every visible GPU, checked exactly
(opt-in; docs/probes.md, "Deep opt-in checks"). A too small ``/dev/shm`` fails before anything
starts; then a worker (``nccl_worker.py``) runs with ``NCCL_DEBUG=WARN`` under the probe's deadline:
PyTorch's own NCCL watchdog waits 30 minutes, so only a killable child is safe. NCCL's warnings name
the cause. Like torch-cuda and model it is one costly check under the same lock, and it starts
nothing on a GPU without room.

Command-line equivalent::

    NCCL_DEBUG=WARN python3 probes/framework/nccl_worker.py
"""

from __future__ import annotations

import os

from probes import framework as fw
from probes import untrusted
from probes.context import Context
from probes.framework import checkpoint, deep, protocol
from probes.framework.deep import cannot_run, deep_cached, deep_worker, lock_timeout, locked_run
from probes.framework.protocol import INT, NUM, STR
from probes.record import Record
from probes.result import Result, passed, verdict
from probes.state import life_identity

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

UNIT = "ms"
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nccl_worker.py")
CACHE = "nccl.json"
SHM = "/dev/shm"  # noqa: S108 (only its size is read)
_PHASES = r"start|import|nccl|init|place|allreduce|verify"
MAX_WARNINGS = 5
# Lower-case substrings of NCCL's WARN lines (misc/shmutils.cc, include/shm.h, transport/p2p.cc). Only a
# segment NCCL could not extend ("Call to posix_fallocate failed : No space left on device", "Error: failed
# to extend /dev/shm/nccl-X to N bytes") blames the size; one it could not open or attach ("Error while
# attaching to shared memory segment ... No such file or directory") is NCCL's own failure.
SHM_SIZE_WORDS = ("no space left on device", "posix_fallocate", "failed to extend")
SHM_WORDS = ("/dev/shm", "shared memory", "nccl-shm")  # noqa: S108
P2P_WORDS = ("peer access", "p2p", "cudaipc", "ipc handle", "peer-to-peer")
SPEC = fw.NCCL_SPEC

_REPORT = {"v": (INT, False), "backend": (STR, False), "torch": (STR, True), "nccl": (STR, True),
           "count": (INT, True), "ms": (NUM, True), "bad": (INT, True), "max_err": (NUM, True)}
_ERROR = {"kind": (STR, False), "type": (STR, False), "message": (STR, False), "code": (INT, True)}
KINDS = ("no-nccl", "cuda-unavailable", "import", "collective", "worker")


class Shm(Record):
    __slots__ = ("size",)

    size: int | None  # bytes, None when it cannot be read

    def __init__(self, size: int | None) -> None:
        self.size = size


def shm_size() -> Shm:
    try:
        st = os.statvfs(SHM)
    except OSError:
        return Shm(None)
    return Shm(st.f_frsize * st.f_blocks)


def validate(report: Any) -> dict[str, Any]:
    from probes.framework import nccl_worker

    protocol.fields(report, _REPORT, "result", nested=("error",))
    if report["v"] != nccl_worker.SCHEMA or report["backend"] != "nccl":
        raise protocol.Bad("the result is for another request")
    if report["error"] is not None:
        protocol.fields(report["error"], _ERROR, "result.error")
        if report["error"]["kind"] not in KINDS:
            raise protocol.Bad("result.error.kind is unknown")
    elif None in (report["count"], report["bad"], report["max_err"], report["ms"]):
        raise protocol.Bad("a result without its measurements")
    return protocol.cleaned(report, 40, {"kind": 300, "type": 300, "message": 300})


def parse_output(stdout: bytes) -> tuple[dict[str, Any] | None, str | None]:
    from probes.framework import nccl_worker

    try:
        return validate(protocol.result(stdout, nccl_worker.PREFIX)), None
    except protocol.Bad as exc:
        return None, str(exc)


def warnings(stderr: bytes) -> list[str]:
    """NCCL's WARN lines (``host:pid:tid [dev] file.cc:NN NCCL WARN text``), text only, cleaned."""
    found = []
    for line in stderr.decode("utf-8", "replace").splitlines():
        at = line.find("NCCL WARN ")
        if at >= 0:
            found.append(untrusted.clean(line[at + len("NCCL WARN "):].strip(), 200))
    return found[-MAX_WARNINGS:]


def last_phase(stderr: bytes) -> str | None:
    from probes.framework import nccl_worker

    return protocol.last_phase(stderr, nccl_worker.PHASE, _PHASES)


def result_arrived(stdout: bytes) -> bool:
    from probes.framework import nccl_worker

    return protocol.arrived(stdout, nccl_worker.PREFIX)


# ---------------------------------------------------------------------------
# gather
# ---------------------------------------------------------------------------

def run_worker(ctx: Context) -> dict[str, Any]:
    from probes.framework import free_memory

    torch = ctx.config.of(fw.Torch)
    floor = torch.torch_min_free_mib
    data, done = deep_worker(ctx, SPEC.name, [torch.torch_python, WORKER], {"NCCL_DEBUG": "WARN"},
                             parse_output, last_phase, result_arrived,
                             floor + free_memory.NCCL_MIB if floor else 0)
    return {**data, "warnings": warnings(done.stderr) if done is not None else []}


def _key(ctx: Context) -> dict[str, Any]:
    return {"python": ctx.config.of(fw.Torch).torch_python, "identity": life_identity(),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


def _cached(entry: dict[str, Any] | None, key: dict[str, Any], ttl: float) -> dict[str, Any] | None:
    hit = deep_cached(entry, key, ttl, validate)
    if hit is None or entry is None or hit["report"]["bad"] != 0:
        return None
    shm = entry["data"].get("shm")  # deep_cached checked that data is a dict
    return {**hit, "warnings": [], "shm": shm if isinstance(shm, int) else None}


def gather(ctx: Context) -> dict[str, Any]:
    hold = checkpoint.hold(ctx)
    if hold is not None:
        return {"kind": "checkpointed", "why": hold}
    own = ctx.config.of(fw.NcclSettings)
    if ctx.config.of(fw.Torch).torch_device != "cuda":
        return {"kind": "device-cpu"}
    key = _key(ctx)
    if ctx.config.profile_rules.reuses_cache:
        hit = _cached(ctx.state.read_json(CACHE), key, own.nccl_ttl)
        if hit is not None:
            return hit
    shm = shm_size()
    if shm.size is not None and shm.size < own.nccl_min_shm_mib * 2**20:
        return {"kind": "shm-small", "shm": shm.size}
    return locked_run(ctx, CACHE, key, lambda entry: _cached(entry, key, own.nccl_ttl),
                      lambda: {**run_worker(ctx), "shm": shm.size}, judge)


def on_deadline(ctx: Context) -> Result:
    return verdict(SPEC.name, fw.NCCL_HANG,
                   "no result within the deadline: the NCCL worker or the GPU driver is stuck")


# ---------------------------------------------------------------------------
# judge: pure
# ---------------------------------------------------------------------------

def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.0f} MiB"


def _has(lines: list[str], words: tuple[str, ...]) -> str | None:
    return next((line for line in lines if any(w in line.lower() for w in words)), None)


ROOM = "HEALTHCHECK_TORCH_MIN_FREE_MIB plus NCCL's buffers"


def judge(data: dict[str, Any], ctx: Context) -> Result:
    from probes.framework import free_memory

    if data.get("kind") == free_memory.REASON:
        return deep.not_checked(SPEC.name, data, ROOM, unit=UNIT)
    return deep.unkept(deep.with_room(_judge(data, ctx), data, ROOM), data)


def _cuda(report: dict[str, Any] | None, lines: list[str], kw: dict[str, Any]) -> Result | None:
    """The CUDA error behind a failed collective: the worker's exception, or NCCL's "Cuda failure"."""
    err = report["error"] if report is not None else None
    if err is None and not lines:
        return None
    message = "\n".join(([err["message"]] if err is not None else []) + lines)
    return deep.cuda_failure(SPEC.name, err["code"] if err is not None else None, message, "the GPUs",
                             unit=UNIT, facts=dict(kw["facts"]))


def _judge(data: dict[str, Any], ctx: Context) -> Result:
    from probes import proc

    kind = data.get("kind")
    if kind == "checkpointed":
        return verdict(SPEC.name, fw.HELD_BACK, f"not started: {data['why']}", remedy=False)
    if kind == "device-cpu":
        return verdict(SPEC.name, fw.NCCL_ON_CPU, "not judged: HEALTHCHECK_TORCH_DEVICE=cpu "
                       "(NCCL needs GPUs)", remedy=False)
    if kind == "shm-small":
        return verdict(SPEC.name, fw.NCCL_SHM_SMALL, f"/dev/shm is {_mib(data['shm'])}, below "  # noqa: S108
                       f"{ctx.config.of(fw.NcclSettings).nccl_min_shm_mib} MiB: "
                       "NCCL fails with 'unhandled system error' (and DataLoader workers die)", unit=UNIT)
    if kind == "lock-timeout":
        return lock_timeout(SPEC.name, data, fw.NCCL_DEADLINE, unit=UNIT)
    warned_lines: list[str] = list(data.get("warnings") or [])
    kw: dict[str, Any] = {"unit": UNIT, "facts": {"warnings": warned_lines, "shm": data.get("shm"),
                                                  "cache": data.get("cache")}}
    report = data.get("report")
    unrunnable = cannot_run(SPEC.name, data, ctx, **kw)
    if unrunnable is not None:
        return unrunnable
    shm_line = _has(warned_lines, SHM_SIZE_WORDS)
    if shm_line is not None:
        return verdict(SPEC.name, fw.NCCL_SHM_SMALL, f"NCCL cannot use shared memory (/dev/shm is "
                       f"{_mib(data.get('shm'))}; NCCL WARN {shm_line})", **kw)
    cuda = _cuda(report if not data.get("lingered") else None, warned_lines, kw)
    if cuda is not None and cuda.reason != fw.CUDA_ERROR.reason:
        return cuda
    shm_line = _has(warned_lines, SHM_WORDS)
    if shm_line is not None:
        return verdict(SPEC.name, fw.NCCL_OWN_SHM, f"NCCL's own shared memory failed (NCCL WARN {shm_line})",
                       **kw)
    p2p_line = _has(warned_lines, P2P_WORDS)
    if p2p_line is not None:
        return verdict(SPEC.name, fw.NCCL_P2P, f"NCCL peer-to-peer failed (NCCL WARN {p2p_line})", **kw)
    where = data.get("phase") or "start-up"
    if report is None or data.get("lingered"):
        budget = data.get("budget", 0)
        if data.get("timed_out") or data.get("stuck") or data.get("held_by") is not None:
            if where in ("place", "allreduce", "verify"):
                return verdict(SPEC.name, fw.NCCL_HANG, f"the NCCL all-reduce hung "
                               f"(killed in {where} after {budget:.1f}s)", **kw)
            return verdict(SPEC.name, fw.NCCL_DEADLINE, "the NCCL worker gave no result within "
                           f"{budget:.1f}s (killed in {where})", **kw)
        rc = data.get("returncode")
        if isinstance(rc, int) and rc < 0:
            return verdict(SPEC.name, fw.KILLED,
                           f"the NCCL worker was killed by {proc.signal_name(-rc)} in {where}", **kw)
        return verdict(SPEC.name, fw.BAD_OUTPUT, f"the NCCL worker gave an unreadable result "
                       f"({data.get('problem')}, exit status {rc})", **kw)
    kw["facts"].update({"nccl": report["nccl"], "count": report["count"], "torch": report["torch"]})
    err = report["error"]
    if err is not None:
        if err["kind"] == "no-nccl":
            return verdict(SPEC.name, fw.NO_NCCL, f"NCCL is not available in this torch build (torch "
                           f"{report['torch']})", **kw)
        if err["kind"] == "cuda-unavailable":
            return verdict(SPEC.name, fw.CUDA_UNAVAILABLE, "torch sees no GPU", **kw)
        if err["kind"] == "import":
            return verdict(SPEC.name, fw.INTERPRETER_NOT_FOUND, "torch cannot be imported", **kw)
        if cuda is not None:
            return cuda
        return verdict(SPEC.name, fw.NCCL_ERROR, f"the NCCL all-reduce failed ({err['type']}: "
                       f"{err['message'][:160]})", **kw)
    count = report["count"]
    if report["bad"]:
        return verdict(SPEC.name, fw.NCCL_WRONG_SUM, f"wrong all-reduce result on {report['bad']} of {count} "
                       f"GPU(s) (max error {report['max_err']:g})", observed=report["ms"], **kw)
    note = "" if count and count > 1 else " (one GPU: no peer traffic)"
    cache = data.get("cache") or {}
    cached = f" (cached, {cache.get('age', 0):.0f}s old)" if cache.get("how") == "ttl" else ""
    return passed(SPEC.name, f"NCCL {report['nccl']} all-reduce over {count} GPU(s) exact in "
                  f"{report['ms']:.1f} ms{note}; /dev/shm {_mib(data.get('shm'))}{cached}",
                  observed=report["ms"], **kw)
