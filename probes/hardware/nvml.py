"""nvml probe: per-GPU state through NVML (the nvidia-ml-py bindings): at least HEALTHCHECK_GPU_COUNT
GPUs, none lost or with a fault that needs a reset, a reboot or service; slowdowns, a degraded PCIe link
under load and NVLink trouble warn (docs/probes.md). Command-line equivalent::

    nvidia-smi --query-gpu=index,uuid,ecc.errors.uncorrected.volatile.total,\
retired_pages.pending,clocks_event_reasons.active,temperature.gpu,compute_mode --format=csv
"""

from __future__ import annotations

import os

from probes.context import Context
from probes.hardware import common as hw
from probes.record import Record
from probes.result import Result, passed, verdict
from probes.spec import Spec, cause

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    Value = Any  # an int/bool/str reading, or NA

NAME = "nvml"
NA = hw.NA

# Clock event (throttle) reason bits, nvml.h.
HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x8, 0x20, 0x40, 0x80
# nvmlGpuFabricState_t
FABRIC_STATES = {1: "not started", 2: "in progress", 3: "completed"}
# NVML_GPU_RECOVERY_ACTION_*: the action -> (what it is, what to do: the message's remedy).
RECOVERY_ACTIONS = {
    1: ("GPU reset", "reset the GPU (nvidia-smi -r) when idle"),
    2: ("node reboot", "reboot the node"),
    3: ("drain P2P", "stop peer-to-peer traffic to this GPU (drain the workload), then reset the GPU"),
    4: ("drain and reset", "drain the workload, then reset the GPU (nvidia-smi -r)"),
}
BUSY_UTILIZATION = 80  # PCIe below its maximum is power saving on an idle GPU: judged from this busy on

COOLING = "check cooling and airflow"
NO_GPU_REQUESTED = cause("no-gpu-requested", "`NVIDIA_VISIBLE_DEVICES` is `void`/`none`/empty: no "
                         "GPU requested", "start it with `--gpus all` or `NVIDIA_VISIBLE_DEVICES=all`",
                         action="fix-config", actor="tenant")
GPU_UNKNOWN = cause("gpu-unknown-error", "one GPU answers Unknown Error while others report",
                    f"the GPU is likely lost (check `dmesg` for Xid 79); {hw.RESET}", action="reset-gpu",
                    actor="operator")
ECC = cause("ecc-uncorrectable", "volatile uncorrectable ECC errors", f"drain the workload and {hw.RESET}; "
            "service the GPU if they recur", action="reset-gpu", actor="operator")
REMAP_FAILURE = cause("row-remap-failure", "row remapping failed", "the GPU needs a reset (`nvidia-smi -r`) "
                      "and likely service (RMA)", action="service-hardware", actor="operator")
REMAP_PENDING = cause("row-remap-pending", "row remap pending", f"{hw.RESET} when idle to apply it",
                      action="reset-gpu", actor="operator")
RETIREMENT_PENDING = cause("page-retirement-pending", "page retirement pending",
                           f"{hw.RESET} when idle to retire the pages", action="reset-gpu", actor="operator")
NO_MEMORY = cause("no-memory", "NVML reports 0 MiB of memory on a GPU: the GPU is broken or the driver "
                  "misreports it (a GPU without memory of its own answers NOT_SUPPORTED, never 0); no "
                  "workload can run there", "check `nvidia-smi -q -d MEMORY` and `dmesg` for "
                  f"Xid, {hw.RESET}", action="reset-gpu", actor="operator")
THERMAL = cause("thermal-slowdown", "SW/HW thermal slowdown clock event", COOLING, "warn",
                action="service-hardware", actor="operator")
HW_SLOW = cause("hw-slowdown", "HW slowdown / power brake clock event", "check the power supply and cooling",
                "warn", action="service-hardware", actor="operator")
HOT = cause("temperature", "temperature at or above the slowdown threshold", COOLING, "warn",
            action="service-hardware", actor="operator")
FIELD_ERROR = cause("field-error", "NVML fails on a field the GPU supports (any code but NOT_SUPPORTED, "
                    "NO_PERMISSION or a lost GPU): fail closed; the message gives that code's remedy",
                    hw.CHECK_DRIVER, action="reset-gpu", actor="operator")
RECOVERY = cause("recovery-action", "the driver's GPU recovery action (NVML field values) is set: GPU reset, "
                 "node reboot, drain P2P or drain and reset; the message names it",
                 "the action itself: reset the GPU (`nvidia-smi -r`) when idle, reboot the node, "
                 "or drain the workload first", action="reset-gpu", actor="operator")
FABRIC = cause("fabric-manager", "NVSwitch fabric registration not completed with success (fabric manager "
               "not running or failed: CUDA reports error 802 'system not yet initialized')",
               "start `nvidia-fabricmanager` on the host", action="fix-config", actor="operator")
MIG_DENIED = cause("mig-no-permission", "NVML answers NO_PERMISSION for the parent GPU of a MIG slice",
                   "not checked, not a fault", "warn", action="none", actor="tenant")
FIELD_DENIED = cause("field-no-permission", "NVML answers NO_PERMISSION for a field",
                     "not checked, not a fault", "warn", action="none", actor="tenant")
PCIE = cause("pcie-degraded", "PCIe link generation or width below the maximum while the GPU is at least 80% "
             "busy (an idle GPU lowers its link by design)", "reseat the GPU or check the riser and slot; "
             "`nvidia-smi -q -d PCIE` on the host", "warn", action="service-hardware", actor="operator")
NVLINK_DOWN = cause("nvlink-down", "an NVLink link is down on a GPU with NVLink (PCIe-only GPUs "
                    "are not judged)", "check `nvidia-smi nvlink -s`, reset the GPU or have the "
                    "board serviced", "warn", action="reset-gpu", actor="operator")
NVLINK_ERRORS = cause("nvlink-errors", "NVLink error counters rose between two readings in one run",
                      "check `nvidia-smi nvlink -e`; a failing link or bridge needs service", "warn",
                      action="service-hardware", actor="operator")
MIG_EMPTY = cause("mig-no-instances", "GPU in MIG mode with no MIG device",
                  "create GPU and compute instances (`nvidia-smi mig -cgi ... -C`) or disable MIG", "warn",
                  action="fix-config", actor="operator")
CUDA_VISIBLE = cause("cuda-visible-devices", "`CUDA_VISIBLE_DEVICES` selects no GPU or fewer than expected",
                     "fix or unset `CUDA_VISIBLE_DEVICES`, or lower `HEALTHCHECK_GPU_COUNT`",
                     action="fix-config", actor="tenant")
CUDA_VISIBLE_STOPS = cause("cuda-visible-devices-partial",
                           "`CUDA_VISIBLE_DEVICES` names a device that does not exist: CUDA stops there",
                           "fix the list", "warn", action="fix-config", actor="tenant")
NVIDIA_VISIBLE = cause("nvidia-visible-devices", "`NVIDIA_VISIBLE_DEVICES` lists more GPUs than NVML sees: "
                       "a requested GPU is missing on the host or was not mounted",
                       "check `nvidia-smi` on the host", "warn", action="reset-gpu", actor="operator")

SPEC = Spec(
    NAME, layer="hardware", module=__name__, toggle="ENABLE_GPU_CHECK", timeout=5.0,
    profiles=("startup", "readiness"), measurement="gpus", settings=hw.Expected.SETTINGS,
    about="per-GPU state through NVML: lost GPU, uncorrectable ECC, pending retirement/remap or recovery "
          "action, fabric; slowdown, PCIe under load, NVLink (warn)",
    causes=(hw.BINDINGS_MISSING, hw.BINDINGS_SHADOWED, hw.DRIVER_NOT_LOADED, hw.NVML_NOT_FOUND, hw.INFOROM,
            hw.GPU_LOST, hw.UNKNOWN_ERROR, hw.NO_PERMISSION, hw.DRIVER_MISMATCH, hw.RESET_REQUIRED,
            hw.NVML_TOO_OLD, hw.NVML_TIMEOUT, hw.NVML_ERROR, NO_GPU_REQUESTED, GPU_UNKNOWN, hw.GPU_COUNT_LOW,
            ECC, REMAP_FAILURE, REMAP_PENDING, RETIREMENT_PENDING, NO_MEMORY, THERMAL, HW_SLOW, HOT,
            FIELD_ERROR, RECOVERY, FABRIC, MIG_DENIED, FIELD_DENIED, PCIE, NVLINK_DOWN, NVLINK_ERRORS,
            MIG_EMPTY, CUDA_VISIBLE, CUDA_VISIBLE_STOPS, NVIDIA_VISIBLE, hw.DEADLINE),
)


class Gpu(Record):
    index: int
    error: int | None = None  # set when the GPU cannot be queried at all
    name: str = ""
    uuid: str = ""
    memory_total_mib: Value = NA
    ecc_uncorrected_volatile: Value = NA
    retired_pending: Value = NA
    remap_pending: Value = NA
    remap_failure: Value = NA
    clocks_event_reasons: Value = NA
    temperature: Value = NA
    slowdown_temperature: Value = NA
    compute_mode: str = NA
    processes: tuple[tuple[int, str, bool], ...] = ()  # (pid, name, whether an MPS client)
    mig_enabled: Value = NA
    mig_devices: tuple[tuple[str, str], ...] = ()  # (uuid, name)
    denied: tuple[str, ...] = ()  # fields NVML refused (NO_PERMISSION): not checked
    unsupported: tuple[str, ...] = ()  # fields the GPU or driver does not have: not judged
    field_errors: tuple[tuple[str, int], ...] = ()  # (field, NVML code) of supported fields that failed
    recovery_action: Value = NA  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    fabric: Value = NA  # (state, status) on NVSwitch systems
    persistence: Value = NA
    pcie: tuple[Value, ...] = (NA, NA, NA, NA)  # current gen, current width, max gen, max width
    utilization: Value = NA  # percent
    nvlinks: tuple[int, ...] = ()  # 1 active / 0 down per link; () without NVLink
    nvlink_errors_rising: tuple[int, ...] = ()  # links whose error counters rose between two readings


class Gathered(Record):
    env: Mapping[str, str | None]
    unavailable: hw.Problem | None = None  # why NVML cannot be used
    driver: str = ""
    count: int = 0
    gpus: tuple[Gpu, ...] = ()
    cuda_driver: Value = NA  # nvmlSystemGetCudaDriverVersion: 12040 is CUDA 12.4


def gather(ctx: Context) -> Gathered:
    from probes.hardware import nvml_lib

    env = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")}
    try:
        nv = nvml_lib.init()
    except nvml_lib.NvmlUnavailable as exc:
        return Gathered(env, exc.problem)
    try:
        driver, _ = nvml_lib.call(nv.nvmlSystemGetDriverVersion)
        count, err = nvml_lib.call(nv.nvmlDeviceGetCount)
        if err is not None:
            return Gathered(env, nvml_lib.describe(err))
        cuda_driver, _ = nvml_lib.call(nv.nvmlSystemGetCudaDriverVersion)
        gpus = []
        for i in range(count):
            handle, err = nvml_lib.call(nv.nvmlDeviceGetHandleByIndex, i)
            fields, lost = nvml_lib.fields(nv, handle) if err is None else ({}, err)
            gpus.append(Gpu(i, error=lost, **fields))
        return Gathered(env, None, nvml_lib.text(driver) if driver is not None else "", count, tuple(gpus),
                        cuda_driver if isinstance(cuda_driver, int) else NA)
    finally:
        nvml_lib.shutdown()


def on_deadline(ctx: Context) -> Result:
    return verdict(NAME, hw.DEADLINE, "NVML gave no answer before the deadline")


def cuda_devices(gpus: tuple[Gpu, ...]) -> list[str]:
    """UUIDs of the devices CUDA enumerates, in order: a GPU in MIG mode gives its MIG devices instead."""
    return [uuid for g in gpus if g.error is None
            for uuid in ([u for u, _ in g.mig_devices] if g.mig_enabled is True else [g.uuid])]


def cuda_visible(var: str, devices: list[str]) -> tuple[list[str], str | None]:
    """The devices CUDA_VISIBLE_DEVICES selects, and the entry where CUDA stopped reading (or None): CUDA
    ignores the list from an entry that names no device, reads an ordinal as strtoul does (its leading
    digits), and selects nothing when an entry repeats."""
    import re

    selected: list[str] = []
    entries = [e.strip() for e in var.split(",")]
    by_uuid = entries[0].startswith(("GPU-", "MIG-"))
    for entry in entries:
        if by_uuid:
            matches = [d for d in devices if entry and d.startswith(entry)]
            device = matches[0] if len(matches) == 1 else None
        else:
            digits = re.match(r"[+-]?[0-9]+", entry)
            ordinal = int(digits[0]) if digits else -1
            device = devices[ordinal] if 0 <= ordinal < len(devices) else None
        if device is None:
            return selected, entry
        if device in selected:
            return [], entry
        selected.append(device)
    return selected, None


def _gpu_problems(g: Gpu, reporting: int) -> list[hw.Problem]:
    from probes.hardware import nvml_lib

    i = g.index
    if g.error is not None:
        verb = "reports" if reporting == 1 else "report"
        others = (f"while {hw.plural(reporting, 'other GPU')} still {verb}" if reporting
                  else "and no other GPU reports")
        if g.error == nvml_lib.GPU_IS_LOST:
            return [hw.Problem(hw.GPU_LOST, f"GPU {i} is lost (NVML: GPU is lost, fallen off the bus) "
                               f"{others}")]
        if g.error == nvml_lib.UNKNOWN:
            return [hw.Problem(GPU_UNKNOWN, f"GPU {i} answers Unknown Error {others}")]
        problem = nvml_lib.describe(g.error)
        return [problem._replace(detail=f"GPU {i} cannot be queried {others}: {problem.detail}")]
    ecc, t, limit = g.ecc_uncorrected_volatile, g.temperature, g.slowdown_temperature
    reasons = g.clocks_event_reasons if isinstance(g.clocks_event_reasons, int) else 0
    out = [hw.Problem(c, f"GPU {i} {detail}") for bad, c, detail in [
        (isinstance(ecc, int) and ecc > 0, ECC, f"has {ecc} volatile uncorrectable ECC error(s)"),
        (g.remap_failure is True, REMAP_FAILURE, "row remapping failed"),
        (g.remap_pending is True, REMAP_PENDING, "has a row remap pending"),
        (g.retired_pending is True, RETIREMENT_PENDING, "has page retirements pending"),
        (g.memory_total_mib == 0, NO_MEMORY, "reports 0 MiB of memory (NVML): the GPU is broken or the "
         "driver misreports it, and no workload can run there"),
        (reasons & (SW_THERMAL | HW_THERMAL), THERMAL, "clocks are slowed for heat (thermal slowdown)"),
        (not reasons & (SW_THERMAL | HW_THERMAL) and reasons & (HW_SLOWDOWN | HW_POWER_BRAKE), HW_SLOW,
         "clocks are slowed by hardware (HW slowdown or power brake)"),
        (isinstance(t, int) and isinstance(limit, int) and 0 < limit <= t, HOT,
         f"is at {t} C, at or above its slowdown threshold {limit} C")] if bad]
    for field, code in g.field_errors:  # that code's own remedy says more than the generic one
        why = nvml_lib.describe(code)
        out.append(hw.Problem(FIELD_ERROR, f"GPU {i}: NVML failed reading its {field} "
                              f"({why.cause.reason}, code {code}) although the GPU supports it: "
                              f"{why.result(NAME).message}", remedy=False))
    action = g.recovery_action
    if isinstance(action, int) and action != 0:
        what, remedy = RECOVERY_ACTIONS.get(action, (f"action {action}", "see the driver's documentation "
                                                     "for this recovery action; check dmesg for Xid"))
        out.append(hw.Problem(RECOVERY, f"GPU {i} has a pending recovery action ({what}): {remedy}",
                              remedy=False))
    state, status = g.fabric if isinstance(g.fabric, tuple) else (3, nvml_lib.SUCCESS)
    shown = FABRIC_STATES.get(state, f"state {state}") + (
        f", {nvml_lib.describe(status).cause.reason}" if status != nvml_lib.SUCCESS else "")
    cur_gen, cur_width, max_gen, max_width = g.pcie
    busy = isinstance(g.utilization, int) and g.utilization >= BUSY_UTILIZATION
    down = [link for link, up in enumerate(g.nvlinks) if not up]
    denied = ", ".join(g.denied[:4]) + (f" and {len(g.denied) - 4} more" if len(g.denied) > 4 else "")
    mig = g.mig_enabled is True or "MIG mode" in g.denied
    return out + [hw.Problem(c, detail) for bad, c, detail in [
        (state != 3 or status != nvml_lib.SUCCESS, FABRIC, f"GPU {i} NVSwitch fabric registration {shown}: "
         "fabric manager not running or failed: CUDA will report error 802 'system not yet initialized'"),
        (busy and all(isinstance(v, int) and v > 0 for v in g.pcie) and (cur_gen < max_gen or
                                                                          cur_width < max_width),
         PCIE, f"GPU {i} PCIe link runs at gen {cur_gen} x{cur_width} (max gen {max_gen} x{max_width}) "
         f"while {g.utilization}% busy"),
        (down, NVLINK_DOWN, f"GPU {i} NVLink link(s) {', '.join(map(str, down[:6]))} down of "
         f"{len(g.nvlinks)}: peer-to-peer traffic falls back to PCIe or fails"),
        (g.nvlink_errors_rising, NVLINK_ERRORS, f"GPU {i} NVLink error counters rising on link(s) "
         f"{', '.join(map(str, g.nvlink_errors_rising[:6]))}"),
        (g.denied and mig, MIG_DENIED, f"GPU {i}: NVML denies {denied} on the parent GPU (NO_PERMISSION), "
         "as it does inside a MIG slice"),
        (g.denied and not mig, FIELD_DENIED, f"GPU {i}: NVML denies {denied} (NO_PERMISSION)"),
        (g.mig_enabled is True and not g.mig_devices, MIG_EMPTY,
         f"GPU {i} is in MIG mode with no MIG device: CUDA cannot use it")] if bad]


def _env_problems(data: Gathered, expected: int) -> list[hw.Problem]:
    from probes.hardware import nvml_lib

    nvd, cvd = data.env.get("NVIDIA_VISIBLE_DEVICES"), data.env.get("CUDA_VISIBLE_DEVICES")
    listed = (0 if nvd is None or hw.none_requested(nvd) or nvd.strip().lower() == "all"
              else len([e for e in nvd.split(",") if e.strip()]))
    devices = cuda_devices(data.gpus)
    selected, stop = cuda_visible(cvd, devices) if cvd is not None else ([], None)
    shown = nvml_lib.text(cvd or "")[:60]
    why = "it is empty" if stop == "" else f"{stop!r} names no device or repeats one"
    return [hw.Problem(c, detail) for bad, c, detail in [
        (data.count < listed, NVIDIA_VISIBLE, f"NVIDIA_VISIBLE_DEVICES lists {hw.plural(listed)} but NVML "
         f"sees {data.count}: a requested GPU is missing on the host or was not mounted"),
        (cvd is not None and not selected and devices, CUDA_VISIBLE, f"CUDA_VISIBLE_DEVICES={shown!r} "
         f"selects no GPU ({why}; NVML sees {hw.plural(len(devices), 'CUDA device')}): CUDA sees no GPU"),
        (selected and len(selected) < expected, CUDA_VISIBLE, f"CUDA_VISIBLE_DEVICES={shown!r} leaves "
         f"{hw.plural(len(selected))} visible to CUDA (expected at least {expected})"),
        (selected and len(selected) >= expected and stop is not None, CUDA_VISIBLE_STOPS,
         f"CUDA_VISIBLE_DEVICES={shown!r}: CUDA stops at {stop!r} (no such device among {len(devices)}) "
         f"and uses only {hw.plural(len(selected), 'device')}")] if bad]


def _facts(data: Gathered) -> dict[str, Any]:
    from probes.hardware import nvml_lib

    gpus = []
    for g in data.gpus:
        entry: dict[str, Any] = {
            "index": g.index, "name": g.name, "uuid": g.uuid, "compute_mode": g.compute_mode,
            "processes": [{"pid": pid, "name": name, **({"mps": True} if mps else {})}
                          for pid, name, mps in g.processes],
        }
        if g.persistence != NA:
            entry["persistence"] = bool(g.persistence)
        if g.unsupported or g.denied:  # what was not judged, and why: in --json without a warning for each
            entry["not_judged"] = {**{f: "not supported" for f in g.unsupported},
                                   **{f: "no permission" for f in g.denied}}
        if g.error is not None:
            entry["error"] = (nvml_lib.describe(g.error).cause.reason if g.error != nvml_lib.UNKNOWN
                              else GPU_UNKNOWN.reason)
        if g.mig_enabled is True:
            entry["mig_devices"] = [{"uuid": u, "name": n} for u, n in g.mig_devices]
        gpus.append(entry)
    mig = any(g.mig_enabled is True for g in data.gpus)
    # "count": what CUDA enumerates before CUDA_VISIBLE_DEVICES; "cuda_driver": 12040 -> "12.4".
    return {"count": len(cuda_devices(data.gpus)) if mig else data.count, "physical_count": data.count,
            "driver": data.driver, "gpus": gpus,
            "cuda_driver": (f"{data.cuda_driver // 1000}.{data.cuda_driver % 1000 // 10}"
                            if isinstance(data.cuda_driver, int) and data.cuda_driver > 0 else None)}


def judge(data: Gathered, ctx: Context) -> Result:
    expected = ctx.config.of(hw.Expected).gpu_count
    nvd = data.env.get("NVIDIA_VISIBLE_DEVICES")
    if data.unavailable is not None:
        if hw.none_requested(nvd):
            if expected == 0:
                return passed(NAME, f"no GPU requested (NVIDIA_VISIBLE_DEVICES={nvd!r}) and none expected",
                              observed=0, unit="gpus", facts={"count": 0, "gpus": []})
            return verdict(NAME, NO_GPU_REQUESTED, f"no GPU was requested for this container "
                           f"(NVIDIA_VISIBLE_DEVICES={nvd!r}) so NVML cannot start")
        return data.unavailable.result(NAME)

    reporting = sum(1 for g in data.gpus if g.error is None)
    problems: list[hw.Problem] = []
    if data.count < expected:
        hint = f" (NVIDIA_VISIBLE_DEVICES={nvd!r}: no GPU was requested)" if hw.none_requested(nvd) else ""
        problems.append(hw.Problem(hw.GPU_COUNT_LOW, f"NVML sees {hw.plural(data.count)} (expected at least "
                                   f"{expected}){hint}"))
    for g in data.gpus:
        problems.extend(_gpu_problems(g, reporting - (1 if g.error is None else 0)))
    problems.extend(_env_problems(data, expected))
    kw: dict[str, Any] = {"observed": data.count, "unit": "gpus", "facts": _facts(data)}
    if found := hw.worst(NAME, problems, **kw):
        return found
    names = sorted({g.name for g in data.gpus})
    summary = ", ".join(f"{n} x{sum(g.name == n for g in data.gpus)}" for n in names)
    migs = [f"GPU {g.index}: {hw.plural(len(g.mig_devices), 'MIG device')}" for g in data.gpus
            if g.mig_enabled is True]
    detail = "; ".join(x for x in (f"driver {data.driver}" if data.driver else "", summary, *migs) if x)
    return passed(NAME, f"{hw.plural(data.count)} healthy ({detail or 'none expected'})", **kw)
