"""Every NVML call the suite makes, made once on every GPU of this machine.

The nvml probe (probes/hardware/nvml.py) and the serve Xid watcher (probes/hardware/nvml_lib.py)
turn most NVML errors into "N/A" or a reason code, so a call that a real driver rejects could go
unnoticed on the fakes. This module makes the same calls with nvidia-ml-py directly and lists every
error that is not expected: NOT_SUPPORTED is always allowed (a GPU without that feature), a few
calls have their own allowed answers (an empty MIG slot, a process that exited, an event wait that
times out).

Used by tests/gpu/test_real_gpu.py on a real driver, and by tests/gpu/test_verify.py against the
fake library, which exports only the calls the suite makes: a new NVML call in probes/ belongs in
CALLS too. Read-only: nothing here changes a GPU setting.

Command line (prints the reading as JSON; exit 0 when there is no problem)::

    python -m tests.gpu.nvml_fields
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, NamedTuple

# NVML return codes (nvml.h).
NOT_SUPPORTED = 3
NOT_FOUND = 6
NO_PERMISSION = 4
TIMEOUT = 10
FUNCTION_NOT_FOUND = 13
INVALID_ARGUMENT = 2

# Every NVML function the suite calls (probes/hardware/nvml.py, nvml_lib.py), plus the CUDA
# driver version that test_real_gpu.py compares with torch's CUDA.
CALLS = frozenset({
    "nvmlInit", "nvmlShutdown", "nvmlSystemGetDriverVersion", "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetComputeRunningProcesses", "nvmlSystemGetProcessName", "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlEventSetCreate", "nvmlDeviceGetSupportedEventTypes", "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2", "nvmlEventSetFree", "nvmlSystemGetCudaDriverVersion",
    "nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceGetPersistenceMode", "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetFieldValues", "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter",
})

# Answers other than NOT_SUPPORTED that are not a problem, per call.
ALLOWED: dict[str, frozenset[int]] = {
    # A process listed a moment ago may have exited; a host pid is not ours to name.
    "nvmlSystemGetProcessName": frozenset({NOT_FOUND, NO_PERMISSION}),
    "nvmlDeviceGetMigDeviceHandleByIndex": frozenset({NOT_FOUND}),  # an empty MIG slot
    "nvmlEventSetWait_v2": frozenset({TIMEOUT}),  # no event within the wait: the healthy answer
    # Drivers before the rename have only the throttle-reasons name (the probe falls back).
    "nvmlDeviceGetCurrentClocksEventReasons": frozenset({FUNCTION_NOT_FOUND}),
    # Newer calls an older driver lacks: the probe does not judge what it cannot read.
    "nvmlDeviceGetMPSComputeRunningProcesses": frozenset({FUNCTION_NOT_FOUND}),
    "nvmlDeviceGetGpuFabricInfoV": frozenset({FUNCTION_NOT_FOUND}),
    "nvmlDeviceGetGpuFabricInfo": frozenset({FUNCTION_NOT_FOUND}),
    # Past the last NVLink (the probe stops there).
    "nvmlDeviceGetNvLinkState": frozenset({INVALID_ARGUMENT}),
    "nvmlDeviceGetNvLinkErrorCounter": frozenset({INVALID_ARGUMENT}),
}


class Reading(NamedTuple):
    driver: str
    count: int
    gpus: list[dict[str, Any]]  # per GPU: call -> shown value or "error N"
    problems: list[str]  # "GPU i: call: NVML error N (name)" for every unexpected error


def _code(exc: BaseException) -> int:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else -1


def _shown(value: Any) -> Any:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return "ok"  # a handle or a structure (the caller shows the fields it needs)


class _Reader:
    def __init__(self, nv: Any):
        self.nv = nv
        self.problems: list[str] = []

    def call(self, where: str, row: dict[str, Any], name: str, *args: Any,
             key: str | None = None) -> tuple[Any, int | None]:
        """One call: (value, None) or (None, NVML code); unexpected codes become problems."""
        fn: Callable[..., Any] | None = getattr(self.nv, name, None)
        try:
            if fn is None:  # older nvidia-ml-py: as if the driver lacked it
                raise self.nv.NVMLError(FUNCTION_NOT_FOUND)
            value = fn(*args)
        except self.nv.NVMLError as exc:
            code = _code(exc)
            row[key or name] = f"error {code}"
            if code != NOT_SUPPORTED and code not in ALLOWED.get(name, ()):
                self.problems.append(f"{where}: {name}: NVML error {code} ({exc})")
            return None, code
        row[key or name] = _shown(value)
        return value, None

    def gpu(self, index: int) -> dict[str, Any]:
        nv, row = self.nv, {"index": index}
        where = f"GPU {index}"
        handle, err = self.call(where, row, "nvmlDeviceGetHandleByIndex", index)
        if err is not None:
            return row
        for name in ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetComputeMode",
                     "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetSupportedEventTypes"):
            self.call(where, row, name, handle)
        mem, _ = self.call(where, row, "nvmlDeviceGetMemoryInfo", handle)
        if mem is not None:
            row["nvmlDeviceGetMemoryInfo"] = {"total": int(mem.total), "used": int(mem.used)}
        self.call(where, row, "nvmlDeviceGetTotalEccErrors", handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                  nv.NVML_VOLATILE_ECC)
        remap, _ = self.call(where, row, "nvmlDeviceGetRemappedRows", handle)
        if remap is not None:
            row["nvmlDeviceGetRemappedRows"] = [int(x) for x in remap]
        _, err = self.call(where, row, "nvmlDeviceGetCurrentClocksEventReasons", handle)
        if err is not None:  # what the probe falls back to
            self.call(where, row, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        self.call(where, row, "nvmlDeviceGetTemperature", handle, nv.NVML_TEMPERATURE_GPU)
        self.call(where, row, "nvmlDeviceGetTemperatureThreshold", handle,
                  nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        procs, _ = self.call(where, row, "nvmlDeviceGetComputeRunningProcesses", handle)
        if procs is not None:
            row["nvmlDeviceGetComputeRunningProcesses"] = [int(p.pid) for p in procs]
            for p in procs:
                self.call(where, row, "nvmlSystemGetProcessName", p.pid, key=f"process {int(p.pid)}")
        self._newer_fields(where, row, handle)
        mig, _ = self.call(where, row, "nvmlDeviceGetMigMode", handle)
        if mig is not None:
            row["nvmlDeviceGetMigMode"] = [int(x) for x in mig]
            if mig[0]:
                slots, _ = self.call(where, row, "nvmlDeviceGetMaxMigDeviceCount", handle)
                for slot in range(slots or 0):
                    mig_row: dict[str, Any] = {}
                    h, err = self.call(f"{where} MIG slot {slot}", mig_row, "nvmlDeviceGetMigDeviceHandleByIndex",
                                       handle, slot)
                    if err is None:
                        self.call(f"{where} MIG slot {slot}", mig_row, "nvmlDeviceGetUUID", h)
                        self.call(f"{where} MIG slot {slot}", mig_row, "nvmlDeviceGetName", h)
                    row[f"mig slot {slot}"] = mig_row
        return row

    def _newer_fields(self, where: str, row: dict[str, Any], handle: Any) -> None:
        """Recovery action, fabric, PCIe link, NVLink, MPS, persistence, utilisation: as the nvml probe reads them."""
        import ctypes

        nv = self.nv
        for name in ("nvmlDeviceGetPersistenceMode", "nvmlDeviceGetCurrPcieLinkGeneration",
                     "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkGeneration",
                     "nvmlDeviceGetMaxPcieLinkWidth"):
            self.call(where, row, name, handle)
        util, _ = self.call(where, row, "nvmlDeviceGetUtilizationRates", handle)
        if util is not None:
            row["nvmlDeviceGetUtilizationRates"] = {"gpu": int(util.gpu), "memory": int(util.memory)}
        mps, _ = self.call(where, row, "nvmlDeviceGetMPSComputeRunningProcesses", handle)
        if mps is not None:
            row["nvmlDeviceGetMPSComputeRunningProcesses"] = [int(p.pid) for p in mps]
        field_id = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field_id is not None:
            values, _ = self.call(where, row, "nvmlDeviceGetFieldValues", handle, [field_id])
            if values is not None:
                row["nvmlDeviceGetFieldValues"] = {"return": int(values[0].nvmlReturn),
                                                   "value": int(values[0].value.uiVal)}
        for name, struct in (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
                             ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t")):
            info_t = getattr(nv, struct, None)
            if info_t is None:
                continue
            info = info_t()
            _, err = self.call(where, row, name, handle, ctypes.byref(info))
            if err is None:
                row[name] = {"state": int(info.state), "status": int(info.status)}
            if err != FUNCTION_NOT_FOUND:
                break
        for link in range(18):  # NVML_NVLINK_MAX_LINKS
            state, err = self.call(where, row, "nvmlDeviceGetNvLinkState", handle, link, key=f"nvlink {link}")
            if err is not None:
                break
            if state:
                self.call(where, row, "nvmlDeviceGetNvLinkErrorCounter", handle, link, 0,
                          key=f"nvlink {link} errors 0")

    def events(self, count: int) -> dict[str, Any]:
        """What the serve Xid watcher does: one event set, every GPU registered, one short wait."""
        nv, row = self.nv, {}
        event_set, err = self.call("events", row, "nvmlEventSetCreate")
        if err is not None:
            return row
        try:
            for index in range(count):
                handle, err = self.call(f"GPU {index}", row, "nvmlDeviceGetHandleByIndex", index,
                                        key=f"handle {index}")
                if err is not None:
                    continue
                supported, err = self.call(f"GPU {index}", row, "nvmlDeviceGetSupportedEventTypes", handle,
                                           key=f"supported events {index}")
                wanted = (supported or 0) & (nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeSingleBitEccError
                                             | nv.nvmlEventTypeDoubleBitEccError)
                if wanted:
                    self.call(f"GPU {index}", row, "nvmlDeviceRegisterEvents", handle, wanted, event_set,
                              key=f"register {index}")
            data, _ = self.call("events", row, "nvmlEventSetWait_v2", event_set, 10)
            if data is not None:  # an event arrived within 10 ms: shown, not judged here
                row["nvmlEventSetWait_v2"] = {"type": int(data.eventType), "data": int(data.eventData)}
        finally:
            self.call("events", row, "nvmlEventSetFree", event_set)
        return row


def read_all() -> Reading:
    """Initialise NVML, make every call on every GPU, shut down. Raises if NVML cannot start."""
    import pynvml as nv

    nv.nvmlInit()
    reader = _Reader(nv)
    try:
        top: dict[str, Any] = {}
        driver, _ = reader.call("system", top, "nvmlSystemGetDriverVersion")
        count, _ = reader.call("system", top, "nvmlDeviceGetCount")
        gpus = [reader.gpu(i) for i in range(count or 0)]
        gpus.append({"events": reader.events(count or 0)})
    finally:
        nv.nvmlShutdown()
    return Reading(str(_shown(driver) or ""), int(count or 0), gpus, reader.problems)


def cuda_driver_version() -> tuple[int, int]:
    """The CUDA version the installed driver supports, as (major, minor): 12040 -> (12, 4)."""
    import pynvml as nv

    nv.nvmlInit()
    try:
        version = int(nv.nvmlSystemGetCudaDriverVersion())
    finally:
        nv.nvmlShutdown()
    return version // 1000, version % 1000 // 10


def main() -> int:
    try:
        reading = read_all()
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 1
    out: dict[str, Any] = reading._asdict()
    try:
        major, minor = cuda_driver_version()
        out["cuda_driver"] = f"{major}.{minor}"
    except Exception as exc:  # not in the fake library, nor in very old drivers
        out["cuda_driver"] = None
        out["cuda_driver_error"] = type(exc).__name__
    out["pid"] = os.getpid()
    print(json.dumps(out, sort_keys=True))
    return 1 if reading.problems else 0


if __name__ == "__main__":
    sys.exit(main())
