"""Do no harm: before a CUDA worker starts, NVML says which GPUs have room for it; the worker sees only
those, by UUID (docs/probes.md, "Do no harm"). Command-line equivalent:
``nvidia-smi --query-gpu=index,uuid,memory.free --format=csv``."""

from __future__ import annotations

from probes import untrusted
from probes.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

MAX_GPUS = 1024
MAX_MIB = 2**44  # NVML gives bytes as an unsigned 64-bit number: every MiB count it can give is below


class Gpu(Record):
    index: int  # NVML's index, as nvidia-smi shows it
    uuid: str
    free_mib: int | None  # None: NVML did not say
    total_mib: int | None


class Room(Record):
    need_mib: int
    allowed: tuple[Gpu, ...] = ()  # the GPUs the worker may use
    full: tuple[Gpu, ...] = ()  # not checked: the workload holds the memory
    unknown: str | None = None  # why NVML could not say, when it could not (then nothing is held back)

    @property
    def visible(self) -> str | None:
        """The worker's CUDA_VISIBLE_DEVICES, or None to leave the caller's as it is."""
        return ",".join(g.uuid for g in self.allowed) if self.full else None

    @property
    def none_left(self) -> bool:
        return bool(self.full) and not self.allowed

    def facts(self) -> dict[str, Any]:
        full = [{"index": g.index, "free_mib": g.free_mib, "total_mib": g.total_mib} for g in self.full]
        return {"need_mib": self.need_mib, "unknown": self.unknown, "full": full}


def survey(need_mib: int, env: Mapping[str, str]) -> Room:
    """Which of the GPUs the worker would see (``CUDA_VISIBLE_DEVICES`` in ``env``) have ``need_mib``
    MiB free; a lost GPU is left out (the nvml probe reports it)."""
    from probes.hardware import nvml, nvml_lib

    if need_mib <= 0:
        return Room(need_mib, unknown="off (HEALTHCHECK_TORCH_MIN_FREE_MIB=0)")
    try:
        nv = nvml_lib.init()
    except nvml_lib.NvmlUnavailable as exc:
        return Room(need_mib, unknown=f"NVML unavailable ({exc.reason})")
    gpus: list[Gpu] = []
    try:
        count, err = nvml_lib.call(nv.nvmlDeviceGetCount)
        if err is not None:
            return Room(need_mib, unknown=f"NVML error {err}")
        for index in range(min(count, MAX_GPUS)):
            handle, err = nvml_lib.call(nv.nvmlDeviceGetHandleByIndex, index)
            mig, _ = nvml_lib.call(nv.nvmlDeviceGetMigMode, handle) if err is None else (None, None)
            if mig is not None and mig[0]:
                return Room(need_mib, unknown="MIG mode (a MIG device's own memory is not read)")
            uuid, err = nvml_lib.call(nv.nvmlDeviceGetUUID, handle) if err is None else (None, err)
            if err is None:
                mem, err = nvml_lib.call(nv.nvmlDeviceGetMemoryInfo, handle)
                free, total = (None, None) if err is not None else (int(mem.free) >> 20, int(mem.total) >> 20)
                gpus.append(Gpu(index, nvml_lib.text(uuid), free, total))
    finally:
        nvml_lib.shutdown()
    wanted = env.get("CUDA_VISIBLE_DEVICES")
    if wanted is not None:
        selected, _ = nvml.cuda_visible(wanted, [g.uuid for g in gpus])
        gpus = [g for u in selected for g in gpus if g.uuid == u]
    full = tuple(g for g in gpus if g.free_mib is not None and g.total_mib != 0 and g.free_mib < need_mib)
    silent = [str(g.index) for g in gpus if g.free_mib is None]
    zero = [str(g.index) for g in gpus if g.total_mib == 0]
    whys = ([f"NVML gives no free memory for GPU {', '.join(silent)}"] if silent else []) + (
        [f"NVML reports 0 MiB of memory for GPU {', '.join(zero)} (misreported)"] if zero else [])
    return Room(need_mib, tuple(g for g in gpus if g not in full), full, "; ".join(whys) or None)


def read(value: Any) -> dict[str, Any] | None:
    """A room's facts from a worker run's data (a cache entry included) if they are well formed."""
    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_MIB

    if not isinstance(value, dict) or set(value) != {"need_mib", "unknown", "full"}:
        return None
    full = value["full"]
    if not count(value["need_mib"]) or not isinstance(full, list) or len(full) > MAX_GPUS:
        return None
    for g in full:
        if not (isinstance(g, dict) and set(g) == {"index", "free_mib", "total_mib"} and count(g["index"])
                and count(g["free_mib"]) and (g["total_mib"] is None or count(g["total_mib"]))):
            return None
    unknown = value["unknown"]
    return {**value, "unknown": None if unknown is None else untrusted.clean(unknown, 120)}


def not_checked(facts: dict[str, Any], what: str) -> str:
    full = facts["full"]
    shown = [f"GPU {g['index']} ({g['free_mib']} MiB free"
             + (f" of {g['total_mib']} MiB)" if g["total_mib"] is not None else ")") for g in full[:4]]
    more = f" and {len(full) - 4} more" if len(full) > 4 else ""
    return (f"not checked: the workload holds the memory on {', '.join(shown)}{more}; the probe needs "
            f"{facts['need_mib']} MiB ({what}), so nothing was started there")
