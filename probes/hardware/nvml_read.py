"""The nvml probe's field readers: what NVML says about one GPU, field by field, with why a field
could not be read. Imported only when the probe runs; ``nvml`` judges."""

from __future__ import annotations

import os

from probes.hardware import nvml_lib
from probes.hardware.common import NA

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}
# In Gpu.pcie's order: current gen/width, max gen/width.
PCIE_CALLS = ("nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
              "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth")
MAX_NVLINKS = 18  # NVML_NVLINK_MAX_LINKS
NVLINK_COUNTERS = 4  # DL replay, DL recovery, CRC flit, CRC data


class _Lost(Exception):
    """A lost GPU (args[0]: the NVML code): its other fields are not read."""


def _check_lost(err: int | None) -> None:
    if err is not None and err in (nvml_lib.GPU_IS_LOST, nvml_lib.UNKNOWN):
        raise _Lost(err)


class _Reader:
    """Reads one GPU's fields, keeping why one could not be: NOT_SUPPORTED (or a missing function) is
    not judged, NO_PERMISSION warns (a MIG slice's parent GPU), a lost GPU raises _Lost, and any other
    error is kept so that the judge fails closed."""

    def __init__(self) -> None:
        self.denied: dict[str, None] = {}  # field names, in order, once each
        self.unsupported: dict[str, None] = {}
        self.errors: list[tuple[str, int]] = []

    def __call__(self, field: str, fn: Callable[..., Any] | None, *args: Any) -> Any:
        return NA if fn is None else self.judge(field, *nvml_lib.call(fn, *args))

    def judge(self, field: str, value: Any, err: int | None) -> Any:
        """The value of a query already made (``nvml_lib.call``'s answer), its error judged as above."""
        if err is None:
            return value
        _check_lost(err)
        if err == nvml_lib.NO_PERMISSION:
            self.denied[field] = None
        elif err in (nvml_lib.NOT_SUPPORTED, nvml_lib.FUNCTION_NOT_FOUND):
            self.unsupported[field] = None
        elif err != nvml_lib.INSUFFICIENT_SIZE:  # the process list grew between two calls: no fault
            self.errors.append((field, err))
        return NA


def fields(nv: Any, handle: Any) -> tuple[dict[str, Any], int | None]:
    """One GPU's fields by ``nvml.Gpu``'s names, and None; or, lost midway, its name and uuid and the code."""
    fields: dict[str, Any] = {}
    q = _Reader()
    try:
        fields["name"] = nvml_lib.text(q("name", nv.nvmlDeviceGetName, handle))
        fields["uuid"] = nvml_lib.text(q("uuid", nv.nvmlDeviceGetUUID, handle))
        # NVLink first: its error counters are read again at the end, the longest interval we have.
        fields["nvlinks"] = links = _nvlinks(nv, handle)
        links_before = _nvlink_errors(nv, handle, [link for link, up in enumerate(links) if up])
        mem = q("memory", nv.nvmlDeviceGetMemoryInfo, handle)
        fields["memory_total_mib"] = NA if mem == NA else int(mem.total) >> 20
        fields["ecc_uncorrected_volatile"] = q(
            "ecc", nv.nvmlDeviceGetTotalEccErrors, handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nv.NVML_VOLATILE_ECC)
        pending = q("retired pages", nv.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        fields["retired_pending"] = NA if pending == NA else bool(pending)
        remap = q("row remap", nv.nvmlDeviceGetRemappedRows, handle)
        if remap != NA:
            fields["remap_pending"], fields["remap_failure"] = bool(remap[2]), bool(remap[3])
        reasons = nvml_lib.clock_event_reasons(nv, handle)
        fields["clocks_event_reasons"] = q.judge("clock event reasons", *reasons)
        fields["temperature"] = q("temperature", nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)
        fields["slowdown_temperature"] = q(
            "temperature thresholds", nv.nvmlDeviceGetTemperatureThreshold, handle,
            nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        mode = q("compute mode", nv.nvmlDeviceGetComputeMode, handle)
        fields["compute_mode"] = COMPUTE_MODES.get(mode, NA) if mode != NA else NA
        fields["processes"] = _processes(nv, q("processes", nv.nvmlDeviceGetComputeRunningProcesses, handle))
        fields["mps_processes"] = _processes(
            nv, q("processes", getattr(nv, "nvmlDeviceGetMPSComputeRunningProcesses", None), handle))
        mig = q("MIG mode", nv.nvmlDeviceGetMigMode, handle)
        if mig != NA:
            fields["mig_enabled"] = bool(mig[0])
            if mig[0]:
                fields["mig_devices"] = _mig_devices(nv, handle)
        fields["recovery_action"] = _recovery_action(nv, handle, q)
        fields["fabric"] = _fabric(nv, handle, q)
        fields["persistence"] = q("persistence mode", getattr(nv, "nvmlDeviceGetPersistenceMode", None),
                                  handle)
        fields["pcie"] = tuple(q("PCIe link", getattr(nv, f, None), handle) for f in PCIE_CALLS)
        util = q("utilization", getattr(nv, "nvmlDeviceGetUtilizationRates", None), handle)
        fields["utilization"] = NA if util == NA else int(util.gpu)
        if links_before:
            after = _nvlink_errors(nv, handle, list(links_before))
            fields["nvlink_errors_rising"] = tuple(
                link for link, n in after.items() if link in links_before and n > links_before[link])
    except _Lost as lost:
        return {k: v for k, v in fields.items() if k in ("name", "uuid")}, lost.args[0]
    fields.update(denied=tuple(q.denied), field_errors=tuple(q.errors), unsupported=tuple(q.unsupported))
    return fields, None


def _processes(nv: Any, procs: Any) -> tuple[tuple[int, str], ...]:
    named = []
    for p in () if procs == NA else procs:
        # Host pids may be unknown inside the container: the name is then empty.
        pname, _ = nvml_lib.call(nv.nvmlSystemGetProcessName, p.pid)
        named.append((int(p.pid), os.path.basename(nvml_lib.text(pname)) if pname else ""))
    return tuple(named)


def _recovery_action(nv: Any, handle: Any, q: _Reader) -> Any:
    """The driver's pending recovery action (field values API), NA where the driver has no such field."""
    field_id = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
    fn = getattr(nv, "nvmlDeviceGetFieldValues", None)
    values: Any = NA if field_id is None else q("recovery action", fn, handle, [field_id])
    if values == NA:
        return NA
    code = int(values[0].nvmlReturn)
    if code in (nvml_lib.INVALID_ARGUMENT, nvml_lib.NOT_SUPPORTED):
        return NA  # a driver that predates the field answers INVALID_ARGUMENT for its id
    return q.judge("recovery action", None, code) if code != nvml_lib.SUCCESS else int(values[0].value.uiVal)


def _fabric(nv: Any, handle: Any, q: _Reader) -> Any:
    """(state, status) of the GPU's NVSwitch fabric registration, NA on GPUs without fabric support."""
    import ctypes

    # The versioned call first (newer drivers), then the original one (535-era drivers).
    for name, struct in (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
                         ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t")):
        fn, info_t = getattr(nv, name, None), getattr(nv, struct, None)
        if fn is None or info_t is None:
            continue
        info = info_t()
        value, err = nvml_lib.call(fn, handle, ctypes.byref(info))
        if err == nvml_lib.FUNCTION_NOT_FOUND:
            continue
        if q.judge("fabric state", value, err) == NA or info.state == 0:  # fabric state 0: not supported
            return NA
        return (int(info.state), int(info.status))
    return q.judge("fabric state", None, nvml_lib.FUNCTION_NOT_FOUND)


def _nvlinks(nv: Any, handle: Any) -> tuple[int, ...]:
    """1 (active) or 0 (down) per NVLink link; () on a PCIe-only GPU."""
    fn = getattr(nv, "nvmlDeviceGetNvLinkState", None)
    states = []
    for link in range(MAX_NVLINKS if fn is not None else 0):
        value, err = nvml_lib.call(fn, handle, link)
        _check_lost(err)
        if err is not None:
            break  # past the last link (INVALID_ARGUMENT), or no NVLink at all (NOT_SUPPORTED)
        states.append(1 if value else 0)
    return tuple(states)


def _nvlink_errors(nv: Any, handle: Any, links: list[int]) -> dict[int, int]:
    """link -> the sum of its error counters, for the given (active) links; {} without NVLink."""
    fn = getattr(nv, "nvmlDeviceGetNvLinkErrorCounter", None)
    out: dict[int, int] = {}
    for link in links if fn is not None else ():
        total = 0
        for counter in range(NVLINK_COUNTERS):
            value, err = nvml_lib.call(fn, handle, link, counter)
            _check_lost(err)
            if err is not None:
                return out
            total += int(value)
        out[link] = total
    return out


def _mig_devices(nv: Any, handle: Any) -> tuple[tuple[str, str], ...]:
    devices = []
    slots, err = nvml_lib.call(nv.nvmlDeviceGetMaxMigDeviceCount, handle)
    for slot in range(slots if err is None else 0):
        mig, err = nvml_lib.call(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if err is None:  # else an empty slot (NOT_FOUND)
            uuid, _ = nvml_lib.call(nv.nvmlDeviceGetUUID, mig)
            name, _ = nvml_lib.call(nv.nvmlDeviceGetName, mig)
            devices.append((nvml_lib.text(uuid or ""), nvml_lib.text(name or "")))
    return tuple(devices)
