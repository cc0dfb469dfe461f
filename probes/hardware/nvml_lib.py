"""The one module that imports ``pynvml`` (NVIDIA's nvidia-ml-py bindings).

Importing this module never fails: a missing ``pynvml``, or the deprecated ``pynvml``
distribution shadowing NVIDIA's under the same import name, is stored and raised as
:class:`NvmlUnavailable` when a caller asks for NVML (:func:`bindings`, :func:`init`).
:func:`describe` maps an NVML return code to its cause in the catalog, for the probe and
serve's event watcher (:func:`watch_events`, docs/serve.md) alike.
"""

from __future__ import annotations

import _thread
import sys
from types import ModuleType

from probes import hardware as hw
from probes.record import Record
from probes.untrusted import MAX_TEXT, clean

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from collections.abc import Iterator
    from typing import Any, Literal

    from probes.spec import Cause

if TYPE_CHECKING:
    EventKind = Literal["xid", "ecc-single", "ecc-double", "slowdown"]

# NVML return codes (nvml.h); kept here so callers need not import pynvml.
SUCCESS = 0
INVALID_ARGUMENT = 2
INSUFFICIENT_SIZE = 7
NO_PERMISSION = 4
NOT_SUPPORTED = 3
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
CORRUPTED_INFOROM = 14
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18
UNKNOWN = 999

EVENT_SINGLE_ECC = 0x1
EVENT_DOUBLE_ECC = 0x2
EVENT_XID = 0x8
WATCHED_EVENTS = EVENT_XID | EVENT_SINGLE_ECC | EVENT_DOUBLE_ECC
# Clock event reasons sampled for "slowdown" events: HW slowdown and HW power brake.
SLOWDOWN_REASONS = 0x8 | 0x80


# code -> the catalog's cause, and what the code says
_DESCRIPTIONS: dict[int, tuple[Cause, str]] = {
    LIBRARY_NOT_FOUND: (hw.NVML_NOT_FOUND, "NVML library not found. "
                        "HINT: libnvidia-ml.so.1 ships with the NVIDIA driver"),
    DRIVER_NOT_LOADED: (hw.DRIVER_NOT_LOADED, "NVIDIA driver not loaded"),
    NO_PERMISSION: (hw.NO_PERMISSION, "no permission to use the GPU device nodes (/dev/nvidia*)"),
    LIB_RM_VERSION_MISMATCH: (hw.DRIVER_MISMATCH, "NVML and kernel driver versions differ (driver upgraded "
                              "without reload)"),
    UNKNOWN: (hw.UNKNOWN_ERROR, "NVML failed with Unknown Error: in a container this usually means "
              "the device cgroup access was lost after a host systemctl daemon-reload"),
    GPU_IS_LOST: (hw.GPU_LOST, "GPU is lost (fallen off the bus, Xid 79)"),
    CORRUPTED_INFOROM: (hw.INFOROM, "GPU InfoROM is corrupted"),
    RESET_REQUIRED: (hw.RESET_REQUIRED, "GPU requires a reset"),
    FUNCTION_NOT_FOUND: (hw.NVML_TOO_OLD, "the driver's NVML lacks a function this suite calls"),
    TIMEOUT: (hw.NVML_TIMEOUT, "NVML timed out"),
}


def describe(code: int | None) -> hw.Problem:
    """What an NVML return code means: the catalog's cause, and a detail that names it."""
    if code is not None and code in _DESCRIPTIONS:
        return hw.Problem(*_DESCRIPTIONS[code])
    return hw.Problem(hw.NVML_ERROR, f"NVML error {code}")


class NvmlUnavailable(Exception):
    """NVML cannot be used: ``problem`` (its cause and detail), ``code`` the NVML return code
    when there is one; ``reason`` and ``message`` (one safe line with the remedy) say it."""

    def __init__(self, problem: hw.Problem, code: int | None = None):
        self.problem = problem
        self.code = code
        self.reason = problem.cause.reason
        self.message = problem.result("nvml").message
        super().__init__(self.message)


_pynvml: ModuleType | None = None
_import_error: NvmlUnavailable | None = None
_import_lock = _thread.allocate_lock()  # one import at a time: it swaps a module in sys.modules


def _import_pynvml() -> ModuleType:
    """``import pynvml``, without the ``ctypes.util`` that it imports but does not use here.

    nvidia-ml-py imports ``find_library`` from ``ctypes.util`` (for Windows; on Linux it loads
    ``libnvidia-ml.so.1`` by name), and ``ctypes.util`` imports subprocess, tempfile, shutil,
    random and more: ~8 ms of every readiness run (make bench). So while pynvml is imported, a
    stand-in whose ``find_library`` imports the real module is in ``sys.modules``.
    """
    if "ctypes.util" in sys.modules:
        import pynvml

        return pynvml
    stand_in = ModuleType("ctypes.util", "find_library on first call (probes.hardware.nvml_lib)")

    def find_library(name: str) -> str | None:
        if sys.modules.get("ctypes.util") is stand_in:
            del sys.modules["ctypes.util"]
        from ctypes import util

        return util.find_library(name)

    stand_in.find_library = find_library  # type: ignore[attr-defined]
    sys.modules["ctypes.util"] = stand_in
    try:
        import pynvml

        return pynvml
    finally:
        if sys.modules.get("ctypes.util") is stand_in:
            del sys.modules["ctypes.util"]


def _import() -> None:
    """Import pynvml once, on first use: every run reads the probes' declarations, and the
    bindings cost ~20 ms that only a run of the nvml probe (or serve's watcher) needs."""
    global _pynvml, _import_error
    with _import_lock:
        if _pynvml is None and _import_error is None:
            _pynvml, _import_error = _checked_import()


def _checked_import() -> tuple[ModuleType | None, NvmlUnavailable | None]:
    try:
        candidate = _import_pynvml()
    except Exception:  # ImportError, or a broken install raising anything on import
        return None, NvmlUnavailable(hw.Problem(
            hw.BINDINGS_MISSING, "the nvidia-ml-py bindings are not installed in the suite's environment"))
    if all(hasattr(candidate, a) for a in ("_nvmlGetFunctionPointer", "nvmlInitWithFlags", "NVMLError")):
        return candidate, None
    return None, NvmlUnavailable(hw.Problem(
        hw.BINDINGS_SHADOWED, "the imported pynvml is not NVIDIA's nvidia-ml-py "
        "(the deprecated pynvml package shadows it)"))


def bindings() -> ModuleType:
    """The pynvml module, or raise the stored import failure."""
    _import()
    if _pynvml is None:
        assert _import_error is not None
        raise _import_error
    return _pynvml


def error_code(exc: BaseException) -> int | None:
    """The NVML return code carried by an NVMLError, else None."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def is_nvml_error(exc: BaseException) -> bool:
    return _pynvml is not None and isinstance(exc, _pynvml.NVMLError)


def init() -> ModuleType:
    """Initialise NVML; returns the bindings. Raises NvmlUnavailable with reason and remedy."""
    nv = bindings()
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        code = error_code(exc)
        raise NvmlUnavailable(describe(code), code) from None
    return nv


def shutdown() -> None:
    """nvmlShutdown, ignoring errors (NVML counts inits; a failed shutdown changes nothing we report)."""
    if _pynvml is None:
        return
    try:
        _pynvml.nvmlShutdown()
    except _pynvml.NVMLError:
        pass


def call(fn: Any, *args: Any) -> tuple[Any, int | None]:
    """Run one NVML query: (value, None) or (None, error code). Other exceptions propagate."""
    nv = bindings()
    try:
        return fn(*args), None
    except nv.NVMLError as exc:
        code = error_code(exc)
        return None, UNKNOWN if code is None else code


def text(value: Any) -> str:
    """An NVML string (bytes from older bindings, str from newer ones), cleaned: names and
    versions come from the driver and reach messages, JSON and Docker's health log."""
    return clean(value, MAX_TEXT)


class Event(Record):
    __slots__ = ("gpu_index", "uuid", "kind", "data")

    gpu_index: int
    uuid: str
    kind: EventKind
    data: int  # the Xid number for "xid"; NVML's event data for ECC events; the reasons for "slowdown"

    def __init__(self, gpu_index: int, uuid: str, kind: EventKind, data: int) -> None:
        self.gpu_index = gpu_index
        self.uuid = uuid
        self.kind = kind
        self.data = data


def _kind(event_type: int) -> EventKind | None:
    if event_type & EVENT_XID:
        return "xid"
    if event_type & EVENT_DOUBLE_ECC:
        return "ecc-double"
    if event_type & EVENT_SINGLE_ECC:
        return "ecc-single"
    return None


def watch_events(stop: threading.Event, wait_ms: int = 500, sample_s: float = 0.0) -> Iterator[Event]:
    """Yield Xid and ECC events from every GPU that supports them until ``stop`` is set, which is
    honoured within about ``wait_ms``; NVML is shut down when the iteration ends.

    With ``sample_s`` > 0 the clock event reasons of every GPU are also read about every
    ``sample_s`` seconds, and each reading with HW slowdown or power brake active yields a
    ``"slowdown"`` event (data: the reasons bitmask); serve judges their rate over a window.

    NVML is initialised and the event set registered at call time, so a failure raises
    NvmlUnavailable here, before the first event is asked for.
    """
    if wait_ms <= 0:
        raise ValueError(f"wait_ms must be greater than zero (specified: {wait_ms})")
    nv = init()
    try:
        event_set = nv.nvmlEventSetCreate()
    except nv.NVMLError as exc:
        shutdown()
        code = error_code(exc)
        raise NvmlUnavailable(_during("cannot create an NVML event set", code), code) from None
    sampled: list[tuple[int, str, Any]] = []
    try:
        gpus = _register_all(nv, event_set, sampled)
    except BaseException:
        _release(nv, event_set)
        raise
    return _events(nv, event_set, gpus, stop, wait_ms, sampled if sample_s > 0 else [], sample_s)


def _register_all(nv: ModuleType, event_set: Any,
                  handles: list[tuple[int, str, Any]]) -> dict[int, tuple[int, str]]:
    """Register every GPU that can be registered; handle address -> (index, uuid). ``handles``
    receives (index, uuid, handle) of every GPU that answers, registered or not."""
    by_address: dict[int, tuple[int, str]] = {}
    count, _ = call(nv.nvmlDeviceGetCount)
    for index in range(count or 0):
        handle, err = call(nv.nvmlDeviceGetHandleByIndex, index)
        if err is not None:
            continue  # a lost GPU cannot be registered; the nvml probe reports it
        uuid, _ = call(nv.nvmlDeviceGetUUID, handle)
        handles.append((index, text(uuid) if uuid is not None else "", handle))
        supported, err = call(nv.nvmlDeviceGetSupportedEventTypes, handle)
        wanted = (supported or 0) & WATCHED_EVENTS
        if err is not None or not wanted:
            continue
        _, err = call(nv.nvmlDeviceRegisterEvents, handle, wanted, event_set)
        if err is None:
            by_address[_address(handle)] = (index, text(uuid) if uuid is not None else "")
    return by_address


def clock_event_reasons(nv: ModuleType, handle: Any) -> tuple[Any, int | None]:
    """The GPU's clock event reasons, as call() answers: drivers (and bindings) before the
    rename have only the throttle-reasons name of the same query."""
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fn = getattr(nv, name, None)
        if fn is not None:
            value, err = call(fn, handle)
            if err != FUNCTION_NOT_FOUND:
                return value, err
    return None, FUNCTION_NOT_FOUND


def _slowdowns(nv: ModuleType, handles: list[tuple[int, str, Any]]) -> Iterator[Event]:
    for index, uuid, handle in handles:
        reasons, err = clock_event_reasons(nv, handle)
        if err is None and isinstance(reasons, int) and reasons & SLOWDOWN_REASONS:
            yield Event(index, uuid, "slowdown", reasons & SLOWDOWN_REASONS)


def _events(nv: ModuleType, event_set: Any, gpus: dict[int, tuple[int, str]], stop: threading.Event,
            wait_ms: int, sampled: list[tuple[int, str, Any]], sample_s: float) -> Iterator[Event]:
    import time

    next_sample = time.monotonic()
    try:
        while not stop.is_set():
            if sampled and time.monotonic() >= next_sample:
                next_sample = time.monotonic() + sample_s
                yield from _slowdowns(nv, sampled)
            left_ms = int((next_sample - time.monotonic()) * 1000)
            wait = wait_ms if not sampled else max(1, min(wait_ms, left_ms))
            try:
                data = nv.nvmlEventSetWait_v2(event_set, wait)
            except nv.NVMLError as exc:
                code = error_code(exc)
                if code == TIMEOUT:
                    continue
                raise NvmlUnavailable(_during("waiting for NVML events failed", code), code) from None
            kind = _kind(int(data.eventType))
            if kind is None:
                continue
            index, uuid = gpus.get(_address(data.device), (-1, ""))
            yield Event(index, uuid, kind, int(data.eventData))
    finally:
        _release(nv, event_set)


def _during(what: str, code: int | None) -> hw.Problem:
    problem = describe(code)
    return problem._replace(detail=f"{what}: {problem.detail}")


def _release(nv: ModuleType, event_set: Any) -> None:
    try:
        nv.nvmlEventSetFree(event_set)
    except nv.NVMLError:
        pass
    shutdown()


def _address(handle: Any) -> int:
    """A device handle's identity (a pointer): the same GPU gives the same address."""
    import ctypes

    return ctypes.cast(handle, ctypes.c_void_p).value or 0
