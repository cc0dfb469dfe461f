"""The one module that imports ``pynvml`` (NVIDIA's nvidia-ml-py bindings), on first use: importing
it never fails, a missing or shadowed ``pynvml`` is raised as :class:`NvmlUnavailable` when NVML is
asked for. Also serve's event watch (:func:`watch_events`, docs/serve.md)."""

from __future__ import annotations

from types import ModuleType

from probes.hardware import common as hw
from probes.record import Record
from probes.untrusted import MAX_TEXT, clean

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from collections.abc import Iterator
    from typing import Any, Literal

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


# code -> the catalog's cause, and what the code says
_DESCRIPTIONS: dict[int, tuple[Cause, str]] = {
    LIBRARY_NOT_FOUND: (hw.NVML_NOT_FOUND, "NVML library not found. "
                        "HINT: libnvidia-ml.so.1 ships with the NVIDIA driver"),
    DRIVER_NOT_LOADED: (hw.DRIVER_NOT_LOADED, "NVIDIA driver not loaded"),
    NO_PERMISSION: (hw.NO_PERMISSION, "no permission to use the GPU device nodes (/dev/nvidia*)"),
    LIB_RM_VERSION_MISMATCH: (hw.DRIVER_MISMATCH,
                              "NVML and kernel driver versions differ (driver upgraded without reload)"),
    UNKNOWN: (hw.UNKNOWN_ERROR, "NVML failed with Unknown Error: in a container this usually means "
              "the device cgroup access was lost after a host systemctl daemon-reload"),
    GPU_IS_LOST: (hw.GPU_LOST, "GPU is lost (fallen off the bus, Xid 79)"),
    CORRUPTED_INFOROM: (hw.INFOROM, "GPU InfoROM is corrupted"),
    RESET_REQUIRED: (hw.RESET_REQUIRED, "GPU requires a reset"),
    FUNCTION_NOT_FOUND: (hw.NVML_TOO_OLD, "the driver's NVML lacks a function this suite calls"),
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
    """The pynvml module, imported on first use; or raise why it cannot be used."""
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


def is_nvml_error(exc: BaseException) -> bool:
    return isinstance(_loaded, ModuleType) and isinstance(exc, _loaded.NVMLError)


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
        try:
            _loaded.nvmlShutdown()
        except _loaded.NVMLError:
            pass


def call(fn: Any, *args: Any) -> tuple[Any, int | None]:
    """One NVML query: (value, None) or (None, error code)."""
    nv = bindings()
    try:
        return fn(*args), None
    except nv.NVMLError as exc:
        code = error_code(exc)
        return None, UNKNOWN if code is None else code


def text(value: Any) -> str:
    """An NVML string (bytes from older bindings, str from newer ones), cleaned: it reaches output."""
    return clean(value, MAX_TEXT)


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
    """Xid and ECC events from every GPU that supports them until ``stop`` is set; with ``sample_s``
    > 0 also a ``"slowdown"`` event for each reading, about every ``sample_s`` seconds, with HW
    slowdown or power brake active. NVML starts and the GPUs register before this returns, so a
    failure raises NvmlUnavailable before the first event."""
    nv = init()
    try:
        event_set = nv.nvmlEventSetCreate()
    except nv.NVMLError as exc:
        shutdown()
        raise _failed("cannot create an NVML event set", exc) from None
    registered: dict[int, tuple[int, str]] = {}  # handle address -> (index, uuid)
    handles = []  # (index, uuid, handle) of each GPU that answers
    try:
        count, _ = call(nv.nvmlDeviceGetCount)
        for index in range(count or 0):
            handle, err = call(nv.nvmlDeviceGetHandleByIndex, index)
            if err is not None:
                continue
            uuid = text(call(nv.nvmlDeviceGetUUID, handle)[0] or "")
            handles.append((index, uuid, handle))
            supported, err = call(nv.nvmlDeviceGetSupportedEventTypes, handle)
            wanted = (supported or 0) & WATCHED_EVENTS
            if (err is None and wanted
                    and call(nv.nvmlDeviceRegisterEvents, handle, wanted, event_set)[1] is None):
                registered[_address(handle)] = (index, uuid)
    except BaseException:
        _release(nv, event_set)
        raise
    return _events(nv, event_set, registered, stop, wait_ms, handles if sample_s > 0 else [], sample_s)


def _events(nv: ModuleType, event_set: Any, gpus: dict[int, tuple[int, str]], stop: threading.Event,
            wait_ms: int, sampled: list[tuple[int, str, Any]], sample_s: float) -> Iterator[Event]:
    import time

    next_sample = time.monotonic()
    try:
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
                index, uuid = gpus.get(_address(data.device), (-1, ""))
                yield Event(index, uuid, kind, int(data.eventData))
    finally:
        _release(nv, event_set)


def _failed(what: str, exc: BaseException) -> NvmlUnavailable:
    problem = describe(error_code(exc))
    return NvmlUnavailable(problem._replace(detail=f"{what}: {problem.detail}"))


def _release(nv: ModuleType, event_set: Any) -> None:
    try:
        nv.nvmlEventSetFree(event_set)
    except nv.NVMLError:
        pass
    shutdown()


def _address(handle: Any) -> int:
    """A device handle's identity: the same GPU gives the same pointer."""
    import ctypes

    return ctypes.cast(handle, ctypes.c_void_p).value or 0
