"""The torch worker's one result line, parsed and checked (pure): where its report enters the
suite (torch_cuda.py judges it). A report that does not match the schema exactly is refused."""

from __future__ import annotations

from probes.framework import protocol
from probes.framework.protocol import BOOL, INT, MEASURE, NUM, STR

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from probes.framework import cuda_errors


MAX_DEVICES = 1024
# Characters kept of each cleaned string of the worker's report (default TEXT).
TEXT = 120
TEXT_LIMITS = {"message": 1200, "visible_devices": 1000}  # a message keeps its line breaks, as \n
PHASES = r"start|import|init|reference|device (cpu|\d{1,4})"

_ERROR = {"phase": (STR, False), "type": (STR, False), "message": (STR, False),
          "device": (INT, True), "module": (STR, True), "code": (INT, True)}
_DEVICE = {"index": (INT, False), "name": (STR, False), "uuid": (STR, True), "op_ms": (NUM, True),
           "max_err": (MEASURE, True), "scale": (MEASURE, True), "free": (INT, True),
           "total": (INT, True)}
_TOP = {"v": (INT, False), "device": (STR, False), "size": (INT, False), "expect_count": (INT, True),
        "torch": (STR, True), "cuda": (STR, True), "cuda_built": (BOOL, True),
        "available": (BOOL, True), "count": (INT, True), "visible_devices": (STR, True)}


def validate(report: Any, device: str, size: int) -> dict[str, Any]:
    """A cleaned copy of the report if it matches the schema exactly; raises protocol.Bad otherwise.
    Every number converts to a finite float and every string is cleaned, so that no later use
    (messages, the latch, the cache, JSON, Docker's log) sees a control character."""
    from probes.framework import torch_worker

    protocol.fields(report, _TOP, "result", nested=("error", "devices"))
    if report["v"] != torch_worker.SCHEMA:
        raise protocol.Bad(f"schema version {report['v']} is not {torch_worker.SCHEMA}")
    if report["device"] != device or report["size"] != size:
        raise protocol.Bad("the result is for another request")
    if report["count"] is not None and not 0 <= report["count"] <= MAX_DEVICES:
        raise protocol.Bad("result.count is out of range")
    if report["error"] is not None:
        protocol.fields(report["error"], _ERROR, "result.error")
    devices = report["devices"]
    if not isinstance(devices, list) or len(devices) > MAX_DEVICES:
        raise protocol.Bad("result.devices is not a list")
    for i, dev in enumerate(devices):
        protocol.fields(dev, _DEVICE, f"result.devices[{i}]", nested=("error",))
        if dev["error"] is None:
            for key in ("op_ms", "max_err", "scale"):
                protocol.check(dev[key], _DEVICE[key][0], False, f"result.devices[{i}].{key}")
        else:
            protocol.fields(dev["error"], _ERROR, f"result.devices[{i}].error")
    # A report without an error covers every device it counted.
    stopped = report["error"] is not None or any(d["error"] is not None for d in devices)
    if not stopped and report["count"] is not None and len(devices) != report["count"]:
        raise protocol.Bad("the result does not cover every device")
    return protocol.cleaned(report, TEXT, TEXT_LIMITS)


def parse_output(stdout: bytes, device: str, size: int) -> tuple[dict[str, Any] | None, str | None]:
    """(report, None) for one valid result line, else (None, what is wrong)."""
    from probes.framework import torch_worker

    try:
        return validate(protocol.result(stdout, torch_worker.PREFIX), device, size), None
    except protocol.Bad as exc:
        return None, str(exc)


def last_phase(stderr: bytes) -> str | None:
    """Where the worker was when it stopped, from its progress markers (validated)."""
    from probes.framework import torch_worker

    return protocol.last_phase(stderr, torch_worker.PHASE, PHASES)


def identify(err: dict[str, Any]) -> cuda_errors.Found | None:
    """The CUDA error the worker reported (probes/framework/cuda_errors.py), or None. torch's
    OutOfMemoryError is CUDA's out of memory whatever its text says."""
    from probes.framework import cuda_errors

    found = cuda_errors.identify(err.get("code"), str(err.get("message", "")))
    if found is None and err.get("type") == "OutOfMemoryError":
        return cuda_errors.Found(cuda_errors.BY_CODE[2], "type")
    return found


def memory_limit(report: dict[str, Any] | None, data: dict[str, Any]) -> str | None:
    """Why the worker failed when host memory is why (naming the limit and the remedy), else None.

    A too-small address-space limit (RLIMIT_AS, ``ulimit -v``), which the worker inherits, shows as
    a MemoryError, as the dynamic loader's "failed to map segment from shared object" (an
    ImportError naming torch's ``_C``: no module is missing), as torch's CPU allocator's "Cannot
    allocate memory", or as std::bad_alloc and abort() (no report, a SIGABRT: torch did not
    crash). A GPU's own out of memory is none of these (CUDA says "out of memory")."""
    import errno

    from probes import childio

    if report is not None:
        errors = [report["error"], *(d["error"] for d in report["devices"])]
        said = any(e is not None and (e["type"] == "MemoryError" or protocol.out_of_memory(e["message"]))
                   for e in errors)
    else:
        rc = data.get("returncode")
        said = data.get("memory") is True and isinstance(rc, int) and rc != 0
    return childio.limit_words(errno.ENOMEM) if said else None
