"""nccl (opt-in): one all-reduce across every visible GPU, checked exactly, in a worker whose NCCL
warnings name the cause (docs/probes.md, "Deep opt-in checks"). Command-line equivalent:
``NCCL_DEBUG=WARN python3 nccl_worker.py``."""

from __future__ import annotations

import os

from probes import untrusted
from probes.context import Context
from probes.framework import checkpoint, deep
from probes.framework.deep import Torch, fix
from probes.result import Result, passed, verdict
from probes.spec import INTEGER, NUMBER, Declared, Spec, cause, setting
from probes.state import life_identity

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NAME = "nccl"
UNIT = "ms"
CACHE = "nccl.json"
PHASES = r"start|import|nccl|init|place|allreduce|verify"
BUFFERS_MIB = 256  # NCCL's buffers on each GPU, on top (NCCL_BUFFSIZE 4 MiB per channel and peer)
ROOM = "HEALTHCHECK_TORCH_MIN_FREE_MIB plus NCCL's buffers"
# Lower-case words of NCCL's WARN lines (misc/shmutils.cc, include/shm.h, transport/p2p.cc): only a
# segment NCCL could not extend ("posix_fallocate failed : No space left on device", "failed to extend
# /dev/shm/nccl-X") blames the size; one it could not attach ("No such file or directory") is NCCL's.
SHM_SIZE_WORDS = ("no space left on device", "posix_fallocate", "failed to extend")
SHM_WORDS = ("/dev/shm", "shared memory", "nccl-shm")  # noqa: S108
P2P_WORDS = ("peer access", "p2p", "cudaipc", "ipc handle", "peer-to-peer")
P2P_REMEDY = ("confirm with `NCCL_P2P_DISABLE=1` (if that passes, P2P is the problem), then fix the "
              "host's IOMMU/ACS settings (ACS off on the PCIe switches, iommu=pt) or keep P2P disabled")


class Settings(Declared):
    nccl_ttl: float = setting("HEALTHCHECK_NCCL_TTL", NUMBER, 300.0, "seconds a passing nccl result is "
                              "reused by readiness", low=0, high=86400, low_inclusive=True)
    nccl_min_shm_mib: int = setting("HEALTHCHECK_NCCL_MIN_SHM_MIB", INTEGER, 256,
                                    "`/dev/shm` smaller than this (MiB) fails the nccl probe before it runs",
                                    low=0, high=2**30, low_inclusive=True)


SHM_SMALL = fix("shm-too-small", "`/dev/shm` smaller than `HEALTHCHECK_NCCL_MIN_SHM_MIB` (checked first), or "
                "NCCL warns it could not extend a shared memory segment (no space left on device)",
                "start the container with `--shm-size=1g` (or `--ipc=host`; Kubernetes: an emptyDir medium "
                "Memory)")
OWN_SHM = fix("nccl-shm", "NCCL could not open or attach its own shared memory segment (\"No such file or "
              "directory\"): not the size of `/dev/shm`", "NCCL lost a shared memory segment another of its "
              "threads had made (a known regression of some NCCL releases, or something else clearing "
              "/dev/shm): try another NCCL (torch) release, keep /dev/shm private to the container, and "
              "confirm with `NCCL_SHM_DISABLE=1`")
P2P = cause("p2p", "NCCL warns that peer-to-peer access is not supported or failed", P2P_REMEDY,
            action="fix-config", actor="operator")
HANG = cause("nccl-hang", "the collective did not finish by the deadline (P2P hanging with IOMMU/ACS on is "
             "the usual cause)", P2P_REMEDY, action="fix-config", actor="operator")
NO_NCCL = fix("no-nccl", "this torch build has no NCCL (a CPU-only or ROCm-less build)", "install a CUDA "
              "build of torch, or leave `ENABLE_NCCL_CHECK` off")
WRONG_SUM = cause("wrong-result", "the all-reduce gave a wrong sum on some GPU", "drain the node; run "
                  "`nccl-tests` and `dcgmi diag`", action="service-hardware", actor="operator")
NCCL_ERROR = fix("nccl-error", "the collective raised another NCCL or CUDA error (NCCL's warning is in the "
                 "message)", "read NCCL's warning; rerun with `NCCL_DEBUG=INFO` by hand")
ON_CPU = cause("device-cpu", "`HEALTHCHECK_TORCH_DEVICE=cpu`: NCCL is not judged", "none", "skip",
               action="none", actor="tenant")
DEADLINE = cause("deadline", "no result by the deadline before the collective started, or another costly "
                 "check held the lock until then", "check `nvidia-smi`; raise `HEALTHCHECK_TIMEOUT` if torch "
                 "is slow to import", action="retry", actor="operator")

SPEC = Spec(
    NAME, layer="framework", module=__name__, toggle="ENABLE_NCCL_CHECK", timeout=45.0,
    profiles=("startup", "readiness"), requires=("checkpoint", "torch-cuda"), measurement="allreduce",
    default_on=False, about="an NCCL all-reduce across every visible GPU gives the exact sum (opt-in)",
    settings=Settings.SETTINGS,
    causes=(SHM_SMALL, OWN_SHM, P2P, HANG, NO_NCCL, WRONG_SUM, NCCL_ERROR, deep.CUDA_UNAVAILABLE,
            deep.CUDA_FATAL, deep.CUDA_ERROR, deep.OOM, deep.DEVICE_BUSY, deep.MPS_BUSY, deep.WORKLOAD_MEMORY,
            ON_CPU, deep.HELD_BACK, deep.INTERPRETER_NOT_FOUND, DEADLINE, deep.KILLED, deep.BAD_OUTPUT),
)

def shm_size() -> int | None:
    try:
        st = os.statvfs("/dev/shm")  # noqa: S108 (only its size is read)
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def validate(report: Any) -> dict[str, Any]:
    from probes.framework import nccl_worker

    deep.fields(report, nccl_worker.REPORT, "result")
    if report["v"] != nccl_worker.SCHEMA or report["backend"] != "nccl":
        raise deep.Bad("the result is for another request")
    if report["error"] is not None:
        if report["error"]["kind"] not in ("no-nccl", "cuda-unavailable", "import", "collective", "worker"):
            raise deep.Bad("result.error.kind is unknown")
    elif None in (report["count"], report["bad"], report["max_err"], report["ms"]):
        raise deep.Bad("a result without its measurements")
    return deep.cleaned(report, 40, {"kind": 300, "type": 300, "message": 300})


def warnings(stderr: bytes) -> list[str]:
    """The last NCCL WARN lines (``host:pid:tid [dev] file.cc:NN NCCL WARN text``), text only, cleaned."""
    found = [line.split("NCCL WARN ", 1)[1].strip() for line in stderr.decode("utf-8", "replace").splitlines()
             if "NCCL WARN " in line]
    return [untrusted.clean(text, 200) for text in found[-5:]]


def run_worker(ctx: Context) -> dict[str, Any]:
    from probes.framework import nccl_worker

    floor = ctx.config.of(Torch).torch_min_free_mib
    data, done = deep.run_worker(ctx, NAME, [], {"NCCL_DEBUG": "WARN"}, nccl_worker, validate, PHASES,
                                 floor + BUFFERS_MIB if floor else 0)
    return {**data, "warnings": warnings(done.stderr) if done is not None else []}


def gather(ctx: Context) -> dict[str, Any]:
    own = ctx.config.of(Settings)
    if ctx.config.of(Torch).torch_device != "cuda":
        return {"kind": "device-cpu"}
    shm = shm_size()
    if shm is not None and shm < own.nccl_min_shm_mib * 2**20:
        return {"kind": "shm-small", "shm": shm}
    key = {"python": ctx.config.of(Torch).torch_python, "identity": life_identity(),
           "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def reuse(entry: dict[str, Any] | None) -> dict[str, Any] | None:
        return deep.cached(entry, key, validate, PHASES, {"shm": "int?"}, own.nccl_ttl)

    return deep.locked_run(ctx, CACHE, key, reuse, lambda: {**run_worker(ctx), "shm": shm}, judge,
                           early=True, hold=checkpoint.hold)


def on_deadline(ctx: Context) -> Result:
    return verdict(NAME, HANG, "no result within the deadline: the NCCL worker or the GPU driver is stuck")


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.0f} MiB"


def _has(lines: list[str], words: tuple[str, ...]) -> str | None:
    return next((line for line in lines if any(w in line.lower() for w in words)), None)


def judge(data: dict[str, Any], ctx: Context) -> Result:
    return deep.judged(NAME, data, ctx, _judge_run, room=ROOM, deadline=DEADLINE, unit=UNIT)


def _judge_run(data: dict[str, Any], ctx: Context) -> Result:
    from probes.framework import cuda_errors

    kind = data.get("kind")
    if kind == "device-cpu":
        return verdict(NAME, ON_CPU, "not judged: HEALTHCHECK_TORCH_DEVICE=cpu (NCCL needs GPUs)",
                       remedy=False)
    if kind == "shm-small":
        return verdict(NAME, SHM_SMALL, f"/dev/shm is {_mib(data['shm'])}, below "  # noqa: S108
                       f"{ctx.config.of(Settings).nccl_min_shm_mib} MiB: "
                       "NCCL fails with 'unhandled system error' (and DataLoader workers die)", unit=UNIT)
    lines: list[str] = list(data.get("warnings") or [])
    kw: dict[str, Any] = {"unit": UNIT, "facts": {"warnings": lines, "shm": data.get("shm"),
                                                  "cache": data.get("cache")}}
    if (unrunnable := deep.cannot_run(NAME, data, ctx.config.of(Torch).torch_python, **kw)) is not None:
        return unrunnable
    if (line := _has(lines, SHM_SIZE_WORDS)) is not None:
        return verdict(NAME, SHM_SMALL, "NCCL cannot use shared memory "
                       f"(/dev/shm is {_mib(data.get('shm'))}; NCCL WARN {line})", **kw)
    # The CUDA error behind a failed collective: the worker's exception, or NCCL's "Cuda failure".
    report = data.get("report")
    err = report["error"] if report is not None and not data.get("lingered") else None
    message = "\n".join(([err["message"]] if err is not None else []) + lines)
    found = cuda_errors.identify(err["code"] if err is not None else None, message)
    cuda = cuda_errors.failure(NAME, found, "the GPUs", unit=UNIT, facts=dict(kw["facts"]))
    if cuda is not None and cuda.reason != deep.CUDA_ERROR.reason:
        return cuda
    if (line := _has(lines, SHM_WORDS)) is not None:
        return verdict(NAME, OWN_SHM, f"NCCL's own shared memory failed (NCCL WARN {line})", **kw)
    if (line := _has(lines, P2P_WORDS)) is not None:
        return verdict(NAME, P2P, f"NCCL peer-to-peer failed (NCCL WARN {line})", **kw)
    if report is None or data.get("lingered"):
        late = HANG if data.get("phase") in ("place", "allreduce", "verify") else DEADLINE
        return deep.no_report(NAME, data, "NCCL worker", stuck=late, timed_out=late, **kw)
    kw["facts"].update({"nccl": report["nccl"], "count": report["count"], "torch": report["torch"]})
    err = report["error"]
    said = {"no-nccl": (NO_NCCL, f"NCCL is not available in this torch build (torch {report['torch']})"),
            "cuda-unavailable": (deep.CUDA_UNAVAILABLE, "torch sees no GPU"),
            "import": (deep.INTERPRETER_NOT_FOUND, "torch cannot be imported")}
    if err is not None and err["kind"] in said:
        return verdict(NAME, *said[err["kind"]], **kw)
    if err is not None:
        return cuda or verdict(NAME, NCCL_ERROR, f"the NCCL all-reduce failed ({err['type']}: "
                               f"{err['message'][:160]})", **kw)
    count = report["count"]
    if report["bad"]:
        return verdict(NAME, WRONG_SUM, f"wrong all-reduce result on {report['bad']} of {count} GPU(s) "
                       f"(max error {report['max_err']:g})", observed=report["ms"], **kw)
    note = "" if count and count > 1 else " (one GPU: no peer traffic)"
    return passed(NAME, f"NCCL {report['nccl']} all-reduce over {count} GPU(s) exact in {report['ms']:.1f} ms"
                  f"{note}; /dev/shm {_mib(data.get('shm'))}", observed=report["ms"], **kw)
