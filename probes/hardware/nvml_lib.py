"""The one module that imports ``pynvml`` (nvidia-ml-py), on first use: a missing or shadowed one is
raised as :class:`NvmlUnavailable` when NVML is asked for. Also the nvml probe's field readers
(:func:`fields`) and serve's event watch (:func:`watch_events`, docs/serve.md)."""

from __future__ import annotations

import contextlib
import os
import time
from types import ModuleType

from probes.hardware import common as hw
from probes.hardware import nvidia_smi as smi
from probes.hardware.common import NA
from probes.record import Record
from probes.untrusted import MAX_TEXT, clean

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from collections.abc import Iterator
    from typing import Any, Callable, Literal

    from probes.spec import Cause

    EventKind = Literal["xid", "ecc-single", "ecc-double", "slowdown"]

# NVML return codes (nvml.h): callers need not import pynvml.
SUCCESS, INVALID_ARGUMENT, NOT_SUPPORTED, NO_PERMISSION, INSUFFICIENT_SIZE = 0, 2, 3, 4, 7
DRIVER_NOT_LOADED, TIMEOUT, LIBRARY_NOT_FOUND, FUNCTION_NOT_FOUND, CORRUPTED_INFOROM = 9, 10, 12, 13, 14
GPU_IS_LOST, RESET_REQUIRED, LIB_RM_VERSION_MISMATCH, UNKNOWN = 15, 16, 18, 999

# nvmlEventType bits, in the order an event is named by them; the clock event reasons sampled for
# "slowdown" events: HW slowdown and HW power brake.
EVENT_KINDS: tuple[tuple[int, EventKind], ...] = ((0x8, "xid"), (0x2, "ecc-double"), (0x1, "ecc-single"))
WATCHED_EVENTS = 0x8 | 0x2 | 0x1
SLOWDOWN_REASONS = 0x8 | 0x80


# code -> the catalog's cause, and what the code says: nvidia-smi exits with NVML's code, so its tables
# say it for most; 10 is a timeout here, an interrupt issue there.
_DESCRIPTIONS: dict[int, tuple[Cause, str]] = {
    **{code: (smi.EXIT_CODES[code].cause, smi.EXIT_CODES[code].means) for code in (4, 9, 13, 14, 15, 16, 18)},
    LIBRARY_NOT_FOUND: (hw.NVML_NOT_FOUND, "NVML library not found. "
                        "HINT: libnvidia-ml.so.1 ships with the NVIDIA driver"),
    UNKNOWN: (hw.UNKNOWN_ERROR, dict(smi.TEXTS)["Failed to initialize NVML: Unknown Error"].means),
    TIMEOUT: (hw.NVML_TIMEOUT, "NVML timed out"),
}


def describe(code: int | None) -> hw.Problem:
    return hw.Problem(*_DESCRIPTIONS.get(code or SUCCESS, (hw.NVML_ERROR, f"NVML error {code}")))


class NvmlUnavailable(Exception):
    """NVML cannot be used: ``reason`` and ``message`` (one safe line with the remedy) say why."""

    def __init__(self, problem: hw.Problem):
        self.problem = problem
        self.reason = problem.cause.reason
        self.message = problem.result("nvml").message
        super().__init__(self.message)


_loaded: ModuleType | NvmlUnavailable | None = None  # pynvml, or why it cannot be used


def bindings() -> ModuleType:
    global _loaded
    if _loaded is None:
        try:
            import pynvml
        except Exception:  # ImportError, or a broken install raising anything on import
            _loaded = NvmlUnavailable(hw.Problem(hw.BINDINGS_MISSING, "the nvidia-ml-py bindings are not "
                                                 "installed in the suite's environment"))
        else:  # gpustat's check: NVIDIA's bindings, not the deprecated pynvml distribution
            ours = all(hasattr(pynvml, a) for a in ("_nvmlGetFunctionPointer", "nvmlInitWithFlags",
                                                    "NVMLError"))
            _loaded = pynvml if ours else NvmlUnavailable(hw.Problem(
                hw.BINDINGS_SHADOWED, "the imported pynvml is not NVIDIA's nvidia-ml-py "
                "(the deprecated pynvml package shadows it)"))
    if isinstance(_loaded, NvmlUnavailable):
        raise _loaded
    return _loaded


def error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def init() -> ModuleType:
    nv = bindings()
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        raise NvmlUnavailable(describe(error_code(exc))) from None
    return nv


def shutdown() -> None:
    """nvmlShutdown, ignoring errors (NVML counts inits; a failed shutdown changes nothing we report)."""
    if isinstance(_loaded, ModuleType):
        with contextlib.suppress(_loaded.NVMLError):
            _loaded.nvmlShutdown()


def call(fn: Any, *args: Any) -> tuple[Any, int | None]:
    nv = bindings()
    try:
        return fn(*args), None
    except nv.NVMLError as exc:
        return None, error_code(exc) or UNKNOWN


def text(value: Any) -> str:
    """An NVML string (bytes from older bindings, str from newer ones), cleaned: it reaches output."""
    return clean(value, MAX_TEXT)


COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}
# In Gpu.pcie's order: current gen/width, max gen/width.
PCIE_CALLS = ("nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
              "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth")
MAX_NVLINKS = 18  # NVML_NVLINK_MAX_LINKS
NVLINK_COUNTERS = 4  # DL replay, DL recovery, CRC flit, CRC data


class _Lost(Exception):
    """A lost GPU (args[0]: the NVML code): its other fields are not read."""


def _check_lost(err: int | None) -> None:
    if err in (GPU_IS_LOST, UNKNOWN):
        raise _Lost(err)


class _Reader:
    """Reads one GPU's fields, keeping why one could not be: NOT_SUPPORTED (or a missing function) is
    not judged, NO_PERMISSION warns (a MIG slice's parent GPU), a lost GPU raises _Lost, and any other
    error is kept so that the judge fails closed."""

    def __init__(self) -> None:
        self.denied: dict[str, None] = {}  # field names, in order, once each
        self.unsupported: dict[str, None] = {}
        self.errors: list[tuple[str, int]] = []

    def __call__(self, field: str, fn: Callable[..., Any], *args: Any) -> Any:
        return self.judge(field, *call(fn, *args))

    def judge(self, field: str, value: Any, err: int | None) -> Any:  # call's answer
        if err is None:
            return value
        _check_lost(err)
        if err == NO_PERMISSION:
            self.denied[field] = None
        elif err in (NOT_SUPPORTED, FUNCTION_NOT_FOUND):
            self.unsupported[field] = None
        elif err != INSUFFICIENT_SIZE:  # the process list grew between two calls: no fault
            self.errors.append((field, err))
        return NA


def fields(nv: Any, handle: Any) -> tuple[dict[str, Any], int | None]:
    """One GPU's fields by ``nvml.Gpu``'s names, and None; or, lost midway, its name and uuid and the code."""
    fields: dict[str, Any] = {}
    q = _Reader()
    try:
        fields["name"] = text(q("name", nv.nvmlDeviceGetName, handle))
        fields["uuid"] = text(q("uuid", nv.nvmlDeviceGetUUID, handle))
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
        fields["remap_pending"], fields["remap_failure"] = (NA, NA) if remap == NA else map(bool, remap[2:4])
        fields["clocks_event_reasons"] = q.judge("clock event reasons", *clock_event_reasons(nv, handle))
        fields["temperature"] = q("temperature", nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)
        fields["slowdown_temperature"] = q(
            "temperature thresholds", nv.nvmlDeviceGetTemperatureThreshold, handle,
            nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        mode = q("compute mode", nv.nvmlDeviceGetComputeMode, handle)
        fields["compute_mode"] = COMPUTE_MODES.get(mode, NA)
        fields["processes"] = (_processes(nv, q("processes", nv.nvmlDeviceGetComputeRunningProcesses, handle))
                               + _processes(nv, q("processes", nv.nvmlDeviceGetMPSComputeRunningProcesses,
                                                  handle), mps=True))
        mig = q("MIG mode", nv.nvmlDeviceGetMigMode, handle)
        fields["mig_enabled"] = NA if mig == NA else bool(mig[0])
        fields["mig_devices"] = _mig_devices(nv, handle) if fields["mig_enabled"] is True else ()
        fields["recovery_action"] = _recovery_action(nv, handle, q)
        fields["fabric"] = _fabric(nv, handle, q)
        fields["persistence"] = q("persistence mode", nv.nvmlDeviceGetPersistenceMode, handle)
        fields["pcie"] = tuple(q("PCIe link", getattr(nv, f), handle) for f in PCIE_CALLS)
        util = q("utilization", nv.nvmlDeviceGetUtilizationRates, handle)
        fields["utilization"] = NA if util == NA else int(util.gpu)
        if links_before:
            after = _nvlink_errors(nv, handle, list(links_before))
            fields["nvlink_errors_rising"] = tuple(
                link for link, n in after.items() if link in links_before and n > links_before[link])
    except _Lost as lost:
        return {k: v for k, v in fields.items() if k in ("name", "uuid")}, lost.args[0]
    fields.update(denied=tuple(q.denied), field_errors=tuple(q.errors), unsupported=tuple(q.unsupported))
    return fields, None


def _processes(nv: Any, procs: Any, mps: bool = False) -> tuple[tuple[int, str, bool], ...]:
    named = []
    for p in () if procs == NA else procs:
        # Host pids may be unknown inside the container: the name is then empty.
        pname, _ = call(nv.nvmlSystemGetProcessName, p.pid)
        named.append((int(p.pid), os.path.basename(text(pname)) if pname else "", mps))
    return tuple(named)


def _recovery_action(nv: Any, handle: Any, q: _Reader) -> Any:
    field_id = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
    values: Any = NA if field_id is None else q("recovery action", nv.nvmlDeviceGetFieldValues, handle,
                                                [field_id])
    if values == NA:
        return NA
    code = int(values[0].nvmlReturn)
    if code in (INVALID_ARGUMENT, NOT_SUPPORTED):
        return NA  # a driver that predates the field answers INVALID_ARGUMENT for its id
    return q.judge("recovery action", None, code) if code != SUCCESS else int(values[0].value.uiVal)


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
        value, err = call(fn, handle, ctypes.byref(info))
        if err == FUNCTION_NOT_FOUND:
            continue
        if q.judge("fabric state", value, err) == NA or info.state == 0:  # fabric state 0: not supported
            return NA
        return (int(info.state), int(info.status))
    return q.judge("fabric state", None, FUNCTION_NOT_FOUND)


def _nvlinks(nv: Any, handle: Any) -> tuple[int, ...]:
    states = []
    for link in range(MAX_NVLINKS):
        value, err = call(nv.nvmlDeviceGetNvLinkState, handle, link)
        _check_lost(err)
        if err is not None:
            break  # past the last link (INVALID_ARGUMENT), or no NVLink at all (NOT_SUPPORTED)
        states.append(1 if value else 0)
    return tuple(states)


def _nvlink_errors(nv: Any, handle: Any, links: list[int]) -> dict[int, int]:
    """link -> the sum of its error counters; {} without NVLink."""
    out: dict[int, int] = {}
    for link in links:
        total = 0
        for counter in range(NVLINK_COUNTERS):
            value, err = call(nv.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter)
            _check_lost(err)
            if err is not None:
                return out
            total += int(value)
        out[link] = total
    return out


def _mig_devices(nv: Any, handle: Any) -> tuple[tuple[str, str], ...]:
    devices = []
    for slot in range(call(nv.nvmlDeviceGetMaxMigDeviceCount, handle)[0] or 0):
        mig, err = call(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if err is None:  # else an empty slot (NOT_FOUND)
            uuid, _ = call(nv.nvmlDeviceGetUUID, mig)
            name, _ = call(nv.nvmlDeviceGetName, mig)
            devices.append((text(uuid or ""), text(name or "")))
    return tuple(devices)


class Event(Record):
    gpu_index: int
    uuid: str
    kind: EventKind
    data: int  # the Xid number for "xid"; NVML's event data for ECC events; the reasons for "slowdown"


def clock_event_reasons(nv: ModuleType, handle: Any) -> tuple[Any, int | None]:
    """The GPU's clock event reasons, as call() answers, by the older throttle-reasons name too."""
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fn = getattr(nv, name, None)
        if fn is not None:
            value, err = call(fn, handle)
            if err != FUNCTION_NOT_FOUND:
                return value, err
    return None, FUNCTION_NOT_FOUND


def watch_events(stop: threading.Event, wait_ms: int = 500, sample_s: float = 0.0) -> Iterator[Event]:
    """Xid and ECC events until ``stop`` is set; with ``sample_s`` > 0 also a ``"slowdown"`` event
    each ``sample_s`` seconds a GPU has HW slowdown or power brake active."""
    events = _events(stop, wait_ms, sample_s)
    next(events)  # NVML starts and the GPUs register: a failure raises here
    return events  # type: ignore[return-value]  # only its first item was None


def _events(stop: threading.Event, wait_ms: int, sample_s: float) -> Iterator[Event | None]:
    nv = init()
    try:
        event_set = nv.nvmlEventSetCreate()
    except nv.NVMLError as exc:
        shutdown()
        raise _failed("cannot create an NVML event set", exc) from None
    registered: dict[int, tuple[int, str]] = {}  # handle address -> (index, uuid)
    sampled = []  # (index, uuid, handle) of each GPU that answers, with sample_s
    try:
        for index in range(call(nv.nvmlDeviceGetCount)[0] or 0):
            handle, err = call(nv.nvmlDeviceGetHandleByIndex, index)
            if err is not None:
                continue
            uuid = text(call(nv.nvmlDeviceGetUUID, handle)[0] or "")
            sampled += [(index, uuid, handle)] if sample_s > 0 else []
            wanted = (call(nv.nvmlDeviceGetSupportedEventTypes, handle)[0] or 0) & WATCHED_EVENTS
            if wanted and call(nv.nvmlDeviceRegisterEvents, handle, wanted, event_set)[1] is None:
                registered[_address(handle)] = (index, uuid)
        yield None
        next_sample = time.monotonic()
        while not stop.is_set():
            if sampled and time.monotonic() >= next_sample:
                next_sample = time.monotonic() + sample_s
                for index, uuid, handle in sampled:
                    reasons, err = clock_event_reasons(nv, handle)
                    if err is None and isinstance(reasons, int) and reasons & SLOWDOWN_REASONS:
                        yield Event(index, uuid, "slowdown", reasons & SLOWDOWN_REASONS)
            wait = max(1, min(wait_ms, int((next_sample - time.monotonic()) * 1000))) if sampled else wait_ms
            try:
                data = nv.nvmlEventSetWait_v2(event_set, wait)
            except nv.NVMLError as exc:
                if error_code(exc) == TIMEOUT:
                    continue
                raise _failed("waiting for NVML events failed", exc) from None
            kind = next((k for bit, k in EVENT_KINDS if int(data.eventType) & bit), None)
            if kind is not None:
                index, uuid = registered.get(_address(data.device), (-1, ""))
                yield Event(index, uuid, kind, int(data.eventData))
    finally:
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlEventSetFree(event_set)
        shutdown()


def _failed(what: str, exc: BaseException) -> NvmlUnavailable:
    problem = describe(error_code(exc))
    return NvmlUnavailable(problem._replace(detail=f"{what}: {problem.detail}"))


def _address(handle: Any) -> int:  # the same GPU gives the same pointer
    import ctypes

    return ctypes.cast(handle, ctypes.c_void_p).value or 0
