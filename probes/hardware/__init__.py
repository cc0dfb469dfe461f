"""The hardware layer's catalog (docs/architecture.md, "The rooms"): each probe's declaration, so
that a run reads it without importing the probe's module; the setting and causes they share, the
shape of a problem a judge found, and the nvml probe's facts as the probes above read them.

nvidia-smi's exit codes (``SMI_EXIT_CODES``, read 2026-11-24) are nvidia-smi(1)'s, section RETURN
VALUE (https://docs.nvidia.com/deploy/nvidia-smi/index.html: 0, 2-4, 6, 8-10, 12-15, 255; no other),
with NVIDIA's words as ``documented``, and 16-18: nvidia-smi exits with the NVML code of the failure
(``nvmlReturn_t``, https://docs.nvidia.com/deploy/nvml-api/), and 18 ("Failed to initialize NVML:
Driver/library version mismatch") is seen in github.com/mozilla/translations issue 1167. The causes
and remedies are ours, for a container started through the NVIDIA Container Toolkit.
"""

from __future__ import annotations

from probes.record import Record
from probes.result import verdict
from probes.spec import INTEGER, TEXT, Declared, Spec, cause, setting

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from probes.result import Result
    from probes.spec import Cause

NA = "N/A"  # a field the GPU or driver does not have, or could not be read: never judged


def none_requested(visible: str | None) -> bool:
    """``NVIDIA_VISIBLE_DEVICES`` set to ask for no GPU: empty, ``none`` or ``void``."""
    return visible is not None and visible.strip().lower() in ("", "none", "void")


def plural(n: int, what: str = "GPU") -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


class Expected(Declared):
    """What nvidia-smi and nvml read (``ctx.config.of(Expected)``); runtime's settings extend it."""

    gpu_count: int = setting("HEALTHCHECK_GPU_COUNT", INTEGER, 1, "minimum number of GPUs expected", low=0,
                             high=1024, low_inclusive=True)


# Remedies that several causes share, written once.
RESET = "reset the GPU (`nvidia-smi -r`) or reboot the node"
WEDGED = f"the driver may be wedged: check `dmesg` for Xid errors, {RESET}"
CHECK_DRIVER = "check the driver on the host (`nvidia-smi -q`, `dmesg`)"
TOOLKIT = "start the container with `--gpus all`"
COOLING = "check cooling and airflow"

# Causes that nvidia-smi and NVML report alike (the exit code is nvidia-smi's, the name NVML's).
DRIVER_NOT_LOADED = cause("driver-not-loaded", "exit 9 / NVML_ERROR_DRIVER_NOT_LOADED: the NVIDIA kernel "
                          "module is not loaded on the host",
                          "load the kernel module on the host (`modprobe nvidia`; check `nvidia-smi` there), "
                          "then restart the container", action="reboot-node", actor="operator")
NVML_NOT_FOUND = cause("nvml-not-found", "exit 12 / NVML library not found: libnvidia-ml.so.1 ships with the "
                       "driver and the NVIDIA Container Toolkit mounts it",
                       f"{TOOLKIT} (NVIDIA Container Toolkit, `NVIDIA_DRIVER_CAPABILITIES` with `utility`)",
                       action="fix-config", actor="tenant")
NO_PERMISSION = cause("no-permission", "exit 4 / NVML_ERROR_NO_PERMISSION: the container's user cannot open "
                      "the GPU's device files `/dev/nvidia*` "
                      "(rootless runtime, SELinux, device nodes mounted by hand)",
                      "start the container through the NVIDIA Container Toolkit (`--gpus all` or CDI) "
                      "or allow the devices in its cgroup; under SELinux allow `container_use_devices`",
                      action="fix-config", actor="tenant")
NVML_TOO_OLD = cause("nvml-too-old", "exit 13 / NVML_ERROR_FUNCTION_NOT_FOUND: the NVML the container loads "
                     "lacks a function (an image with its own driver libraries, or an old driver)",
                     "remove the driver libraries from the image so that the toolkit mounts the host's, "
                     "or update the NVIDIA driver on the host", action="fix-config", actor="tenant")
INFOROM = cause("inforom-corrupted", "exit 14 / NVML_ERROR_CORRUPTED_INFOROM: a GPU's InfoROM is corrupted",
                "drain the node and have the GPU serviced (RMA)", action="service-hardware", actor="operator")
GPU_LOST = cause("gpu-lost", "exit 15, \"Unable to determine the device handle\", NVML_ERROR_GPU_IS_LOST: "
                 "a GPU fell off the bus (Xid 79); the others are still reported",
                 f"{RESET}; check `dmesg` for Xid 79", action="reset-gpu", actor="operator")
RESET_REQUIRED = cause("reset-required", "exit 16 / NVML_ERROR_RESET_REQUIRED: a GPU needs a reset", RESET,
                       action="reset-gpu", actor="operator")
DRIVER_MISMATCH = cause("driver-mismatch", "the driver's user-space libraries do not match the loaded kernel "
                        "module: the host's driver was upgraded without reloading it (nvidia-smi exit 18, "
                        "NVML_ERROR_LIB_RM_VERSION_MISMATCH, CUDA error 803)",
                        "reboot the node, or reload the kernel module (stop what uses the GPUs, `rmmod` the "
                        "nvidia modules, `modprobe nvidia`); never ship libcuda or NVML in the image",
                        action="reboot-node", actor="operator")
UNKNOWN_ERROR = cause("nvml-unknown-error", "exit 255 / NVML init \"Unknown Error\": "
                      "device cgroup access lost after a host `systemctl daemon-reload`",
                      "recreate the container", action="restart-container", actor="operator")
GPU_COUNT_LOW = cause("gpu-count", "fewer GPUs than `HEALTHCHECK_GPU_COUNT`",
                      "start the container with more GPUs (`--gpus all`, `NVIDIA_VISIBLE_DEVICES`, "
                      "`nvidia.com/gpu` limit) or lower `HEALTHCHECK_GPU_COUNT`", action="fix-config",
                      actor="tenant")
DEADLINE = cause("deadline", "no answer by the deadline (driver wedged)",
                 f"{WEDGED}; enable persistence mode on the host (`nvidia-smi -pm 1`)", action="reset-gpu",
                 actor="operator")
STUCK = cause("stuck", "still there after SIGKILL (uninterruptible sleep); "
              "while it exists, later runs do not start another and say so at once", WEDGED,
              action="reset-gpu", actor="operator")

# NVML's own, raised by nvml_lib (which only a run that calls NVML imports).
BINDINGS_MISSING = cause("nvml-bindings-missing", "nvidia-ml-py not installed in the suite's environment",
                         "`pip install nvidia-ml-py`", action="fix-config", actor="tenant")
BINDINGS_SHADOWED = cause("nvml-bindings-shadowed", "the deprecated `pynvml` package shadows nvidia-ml-py",
                          "`pip uninstall pynvml && pip install --force-reinstall nvidia-ml-py`",
                          action="fix-config", actor="tenant")
NVML_TIMEOUT = cause("nvml-timeout", "NVML_ERROR_TIMEOUT", WEDGED, action="reset-gpu", actor="operator")
NVML_ERROR = cause("nvml-error", "another NVML error code", CHECK_DRIVER, action="reset-gpu",
                   actor="operator")


# nvidia-smi's declarations: its name, the causes only it reports, its Spec.
SMI_NAME = "nvidia-smi"
SMI_NOT_FOUND = cause("not-found", "nvidia-smi not on PATH",
                      f"{TOOLKIT} (NVIDIA Container Toolkit installed on the host)", action="fix-config",
                      actor="tenant")
SMI_CANNOT_START = cause("cannot-start", "nvidia-smi cannot be executed "
                         "(not executable, or its `#!` interpreter or loader is missing)",
                         "check the file mounted by the NVIDIA Container Toolkit and recreate the container",
                         action="restart-container", actor="tenant")
SMI_KILLED = cause("killed", "killed by a signal (an exit status above 128 is an exit status: "
                   "no shell runs nvidia-smi)",
                   "the driver or the tool crashed; check `dmesg` for Xid errors", action="reset-gpu",
                   actor="operator")
SMI_UNPARSEABLE = cause("unparseable", "output is not the expected CSV (quoted, short excerpt)",
                        "check the `nvidia-smi` on PATH is NVIDIA's and matches the driver",
                        action="fix-config", actor="tenant")


class SmiCode(Record):
    __slots__ = ("documented", "means", "cause")

    documented: str  # NVIDIA's words for the code
    means: str  # what it means for a container: the message's detail
    cause: Cause

    def __init__(self, documented: str, means: str, cause: Cause) -> None:
        self.documented = documented
        self.means = means
        self.cause = cause


def _smi_own(number: int, reason: str, documented: str, means: str, remedy: str, *, action: str, actor: str,
             more: str = "") -> tuple[int, SmiCode]:
    """An exit code whose cause only nvidia-smi reports: the cause's row quotes NVIDIA's words."""
    row = cause(reason, f'exit {number}, "{documented}": {means}{more}', remedy, action=action, actor=actor)
    return number, SmiCode(documented, means, row)


SMI_EXIT_CODES: dict[int, SmiCode] = dict((
    _smi_own(2, "bad-argument", "A supplied argument or flag is invalid",
             "this nvidia-smi does not know the probe's query (too old, or not NVIDIA's)",
             "use the nvidia-smi that the NVIDIA Container Toolkit mounts from the host's driver; remove any "
             "nvidia-smi the image ships", action="fix-config", actor="tenant"),
    _smi_own(3, "not-supported", "The requested operation is not available on target device",
             "the driver cannot answer the GPU query here",
             "check the driver on the host (`nvidia-smi -q`); update it to a data-center release",
             action="fix-config", actor="operator"),
    (4, SmiCode("The current user does not have permission to access this device or perform this operation",
                "the container's user cannot open the GPU's device files (rootless runtime, SELinux, device "
                "nodes mounted by hand)", NO_PERMISSION)),
    _smi_own(6, "no-devices", "A query to find an object was unsuccessful",
             "no GPU is visible in the container",
             f"{TOOLKIT} and check `NVIDIA_VISIBLE_DEVICES` / the `nvidia.com/gpu` resource request",
             action="fix-config", actor="tenant"),
    _smi_own(8, "insufficient-power", "A device's external power cables are not properly attached",
             "a GPU lacks its external power", "drain the node and have the GPU's power cables checked",
             action="service-hardware", actor="operator"),
    (9, SmiCode("NVIDIA driver is not loaded", "the host's kernel module is not loaded", DRIVER_NOT_LOADED)),
    _smi_own(10, "irq-issue", "NVIDIA Kernel detected an interrupt issue with a GPU",
             "the driver gets no interrupts from a GPU",
             "check the host's `dmesg` for the driver's interrupt messages; reboot the node; "
             "check the BIOS's PCIe/MSI settings if it returns", action="reboot-node", actor="operator"),
    (12, SmiCode("NVML Shared Library couldn't be found or loaded",
                 "libnvidia-ml.so.1 (it ships with the driver) is not in the container", NVML_NOT_FOUND)),
    (13, SmiCode("Local version of NVML doesn't implement this function",
                 "the libnvidia-ml the container loads is older than this nvidia-smi (an image with its own "
                 "driver libraries)", NVML_TOO_OLD)),
    (14, SmiCode("infoROM is corrupted", "a GPU's InfoROM is corrupted", INFOROM)),
    (15, SmiCode("The GPU has fallen off the bus or has otherwise become inaccessible",
                 "a GPU fell off the bus", GPU_LOST)),
    (16, SmiCode("The GPU requires a reset before it can be used again (NVML)", "a GPU needs a reset",
                 RESET_REQUIRED)),
    _smi_own(17, "blocked-by-os",
             "The GPU control device has been blocked by the operating system/cgroups (NVML)",
             "the container's device cgroup does not allow the GPU "
             "(lost after a host systemctl daemon-reload, or a runtime set to no-cgroups)",
             "recreate the container; "
             "let the toolkit manage the device rules (CDI) so a daemon-reload cannot drop them",
             action="restart-container", actor="operator"),
    (18, SmiCode("RM detects a driver/library version mismatch (NVML)",
                 "the host's driver was upgraded without reloading the kernel module", DRIVER_MISMATCH)),
    _smi_own(255, "exit-code", "Other error or internal driver error occurred", "nvidia-smi failed",
             "check the host's `dmesg` for Xid errors and run `nvidia-smi -q` there", action="reset-gpu",
             actor="operator", more=", or any exit status this table lacks (the message quotes its output)"),
))
SMI_EXIT_CODE = SMI_EXIT_CODES[255].cause  # a failure this table does not name
# The cause rows of docs/probes.md, one per reason, in the order of the table.
SMI_CAUSES: tuple[Cause, ...] = tuple(dict.fromkeys([*(c.cause for c in SMI_EXIT_CODES.values()),
                                                     UNKNOWN_ERROR]))


SMI_SPEC = Spec(
    SMI_NAME, layer="hardware", module="probes.hardware.nvidia_smi", toggle="ENABLE_GPU_CHECK", timeout=10.0,
    profiles=("startup", "readiness"), measurement="gpus", settings=Expected.SETTINGS,
    about="the driver answers and at least `HEALTHCHECK_GPU_COUNT` GPUs are visible",
    causes=(SMI_NOT_FOUND, SMI_CANNOT_START, *SMI_CAUSES, SMI_KILLED, SMI_UNPARSEABLE, GPU_COUNT_LOW,
            DEADLINE, STUCK),
)


# nvml's declarations: its name, the causes only it reports, its Spec.
NVML_NAME = "nvml"
NO_GPU_REQUESTED = cause("no-gpu-requested", "`NVIDIA_VISIBLE_DEVICES` is `void`/`none`/empty: "
                         "no GPU requested",
                         "start it with `--gpus all` or `NVIDIA_VISIBLE_DEVICES=all`", action="fix-config",
                         actor="tenant")
GPU_UNKNOWN = cause("gpu-unknown-error", "one GPU answers Unknown Error while others report",
                    f"the GPU is likely lost (check `dmesg` for Xid 79); {RESET}", action="reset-gpu",
                    actor="operator")
ECC = cause("ecc-uncorrectable", "volatile uncorrectable ECC errors",
            f"drain the workload and {RESET}; service the GPU if they recur", action="reset-gpu",
            actor="operator")
REMAP_FAILURE = cause("row-remap-failure", "row remapping failed",
                      "the GPU needs a reset (`nvidia-smi -r`) and likely service (RMA)",
                      action="service-hardware", actor="operator")
REMAP_PENDING = cause("row-remap-pending", "row remap pending", f"{RESET} when idle to apply it",
                      action="reset-gpu", actor="operator")
RETIREMENT_PENDING = cause("page-retirement-pending", "page retirement pending",
                           f"{RESET} when idle to retire the pages", action="reset-gpu", actor="operator")
NO_MEMORY = cause("no-memory", "NVML reports 0 MiB of memory on a GPU: the GPU is broken or the driver "
                  "misreports it (a GPU without memory of its own answers NOT_SUPPORTED, never 0); "
                  "no workload can run there",
                  f"check `nvidia-smi -q -d MEMORY` and `dmesg` for Xid, {RESET}", action="reset-gpu",
                  actor="operator")
THERMAL = cause("thermal-slowdown", "SW/HW thermal slowdown clock event", COOLING, "warn",
                action="service-hardware", actor="operator")
HW_SLOW = cause("hw-slowdown", "HW slowdown / power brake clock event", "check the power supply and cooling",
                "warn", action="service-hardware", actor="operator")
HOT = cause("temperature", "temperature at or above the slowdown threshold", COOLING, "warn",
            action="service-hardware", actor="operator")
FIELD_ERROR = cause("field-error", "NVML fails on a field the GPU supports (any code but NOT_SUPPORTED, "
                    "NO_PERMISSION or a lost GPU): fail closed; the message gives that code's remedy",
                    CHECK_DRIVER, action="reset-gpu", actor="operator")
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
             "busy (an idle GPU lowers its link by design)",
             "reseat the GPU or check the riser and slot; `nvidia-smi -q -d PCIE` on the host", "warn",
             action="service-hardware", actor="operator")
NVLINK_DOWN = cause("nvlink-down", "an NVLink link is down on a GPU with NVLink "
                    "(PCIe-only GPUs are not judged)",
                    "check `nvidia-smi nvlink -s`, reset the GPU or have the board serviced", "warn",
                    action="reset-gpu", actor="operator")
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

NVML_SPEC = Spec(
    NVML_NAME, layer="hardware", module="probes.hardware.nvml", toggle="ENABLE_GPU_CHECK", timeout=5.0,
    profiles=("startup", "readiness"), measurement="gpus",
    about="per-GPU state through NVML: lost GPU, uncorrectable ECC, pending retirement/remap or recovery "
          "action, fabric; slowdown, PCIe under load, NVLink (warn)", settings=Expected.SETTINGS,
    causes=(BINDINGS_MISSING, BINDINGS_SHADOWED, DRIVER_NOT_LOADED, NVML_NOT_FOUND, INFOROM, GPU_LOST,
            UNKNOWN_ERROR, NO_PERMISSION, DRIVER_MISMATCH, RESET_REQUIRED, NVML_TOO_OLD, NVML_TIMEOUT,
            NVML_ERROR, NO_GPU_REQUESTED, GPU_UNKNOWN, GPU_COUNT_LOW, ECC, REMAP_FAILURE, REMAP_PENDING,
            RETIREMENT_PENDING, NO_MEMORY, THERMAL, HW_SLOW, HOT, FIELD_ERROR, RECOVERY, FABRIC, MIG_DENIED,
            FIELD_DENIED, PCIE, NVLINK_DOWN, NVLINK_ERRORS, MIG_EMPTY, CUDA_VISIBLE, CUDA_VISIBLE_STOPS,
            NVIDIA_VISIBLE, DEADLINE),
)


# runtime's declarations: its name, the causes only it reports, its settings, its Spec.
RUNTIME_NAME = "runtime"


class RuntimeSettings(Expected):
    """What runtime reads: ``HEALTHCHECK_GPU_COUNT`` and its own."""

    shm_path: str = setting("HEALTHCHECK_SHM_PATH", TEXT, "/dev/shm",  # noqa: S108  (measured, not written)
                            "the shared-memory mount whose size is judged")
    shm_min_mib: int = setting("HEALTHCHECK_SHM_MIN_MIB", INTEGER, 1024,
                               "`/dev/shm` below this many MiB warns (NCCL, DataLoader workers)", low=0,
                               high=1 << 24, low_inclusive=True)
    dev_root: str = setting("HEALTHCHECK_DEV_ROOT", TEXT, "/dev",
                            "where the NVIDIA device nodes are looked for")


SHM_SMALL = cause("shm-small", "`/dev/shm` smaller than `HEALTHCHECK_SHM_MIN_MIB` "
                  "(Docker's default is 64 MiB): NCCL fails with \"unhandled system error\", "
                  "DataLoader workers die",
                  "`docker run --shm-size=8g` or `--ipc=host`, "
                  "in Kubernetes an `emptyDir` with `medium: Memory` at `/dev/shm`", "warn",
                  action="fix-config", actor="tenant")
SHM_MISSING = cause("shm-missing", "`/dev/shm` cannot be measured",
                    "mount a tmpfs at `/dev/shm` (`--shm-size`, `--ipc=host`, or a memory-backed `emptyDir`)",
                    "warn", action="fix-config", actor="tenant")
DEVICE_NODES = cause("device-nodes", "`/dev/nvidiactl`, `/dev/nvidia-uvm` or a `/dev/nvidiaN` "
                     "per expected GPU is missing although the container was given GPUs",
                     f"{TOOLKIT} (NVIDIA Container Toolkit); for `nvidia-uvm` "
                     "run `nvidia-modprobe -u -c=0` on the host, then recreate the container",
                     action="restart-container", actor="operator")
DEBUG_ENV_SET = cause("cuda-debug-env", "a variable that changes CUDA's behaviour for debugging is set "
                      "(`CUDA_LAUNCH_BLOCKING`, `CUDA_INJECTION64_PATH`, "
                      "`CUDA_ENABLE_COREDUMP_ON_EXCEPTION`, ...)",
                      "remove it from the image or deployment for production", "warn", action="fix-config",
                      actor="tenant")
PERSISTENCE_OFF = cause("persistence-off", "persistence mode off (startup only, from the nvml probe): "
                        "each NVML/CUDA start re-initialises the GPU",
                        "`nvidia-smi -pm 1` or run `nvidia-persistenced` on the host", "warn",
                        action="fix-config", actor="operator")

RUNTIME_SPEC = Spec(
    RUNTIME_NAME, layer="hardware", module="probes.hardware.runtime", toggle="ENABLE_RUNTIME_CHECK",
    timeout=2.0, profiles=("startup", "readiness"), requires=("nvml",), measurement="shm",
    about="container runtime limits: `/dev/shm` size, CUDA's device nodes, CUDA-debugging variables, "
          "persistence mode (startup)", settings=RuntimeSettings.SETTINGS,
    causes=(SHM_SMALL, SHM_MISSING, DEVICE_NODES, DEBUG_ENV_SET, PERSISTENCE_OFF),
)

SPECS = (SMI_SPEC, NVML_SPEC, RUNTIME_SPEC)


class Problem(Record):
    """What a judge found: the cause, and the detail it observed (the message is the detail and
    the cause's remedy; ``remedy=False`` where the detail already names what to do)."""

    __slots__ = ("cause", "detail", "remedy")

    cause: Cause
    detail: str
    remedy: bool

    def __init__(self, cause: Cause, detail: str, remedy: bool = True) -> None:
        self.cause = cause
        self.detail = detail
        self.remedy = remedy

    def result(self, name: str, **kw: Any) -> Result:
        return verdict(name, self.cause, self.detail, remedy=self.remedy, **kw)


def worst(name: str, problems: list[Problem], facts: dict[str, Any], **kw: Any) -> Result | None:
    """The result of the problems a judge found: the first failure, else the first warning,
    followed by how many more; each one's status and reason go into ``facts["problems"]``.
    None when there is none."""
    problems = sorted(problems, key=lambda p: p.cause.status != "fail")  # stable: the judge's order
    facts["problems"] = [{"status": p.cause.status, "reason": p.cause.reason} for p in problems]
    if not problems:
        return None
    first = problems[0].result(name, facts=facts, **kw)
    return first._replace(message=f"{first.message} (+{len(problems) - 1} more)") if problems[1:] else first


# ---------------------------------------------------------------------------
# The nvml probe's facts, as the probes above it read them
# ---------------------------------------------------------------------------

class SeenGpu(Record):
    __slots__ = ("index", "uuid", "compute_mode", "persistence", "processes")

    index: int | None
    uuid: str
    compute_mode: str
    persistence: bool | None
    processes: tuple[tuple[int, str, bool], ...]  # (pid, name, whether an MPS client)

    def __init__(self, index: int | None, uuid: str, compute_mode: str, persistence: bool | None,
                 processes: tuple[tuple[int, str, bool], ...]) -> None:
        self.index = index
        self.uuid = uuid
        self.compute_mode = compute_mode
        self.persistence = persistence
        self.processes = processes


class Seen(Record):
    """What the nvml probe of this run saw. ``Result.facts`` stays the JSON mapping (``-v``,
    health+json); :func:`seen` reads it once, and whatever does not have its type is left out."""

    __slots__ = ("ok", "count", "cuda_driver", "gpus")

    ok: bool  # the probe passed or warned
    count: int | None  # the devices CUDA enumerates (MIG devices for a GPU in MIG mode)
    cuda_driver: str | None  # the highest CUDA version the driver supports: "12.4"
    gpus: tuple[SeenGpu, ...]

    def __init__(self, ok: bool, count: int | None, cuda_driver: str | None,
                 gpus: tuple[SeenGpu, ...]) -> None:
        self.ok = ok
        self.count = count
        self.cuda_driver = cuda_driver
        self.gpus = gpus


def _int(value: Any, low: int = 0, high: int = 2**31) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and low <= value < high else None


def _gpu(g: Mapping[str, Any]) -> SeenGpu:
    procs = g.get("processes")
    processes = tuple((pid, p["name"] if isinstance(p.get("name"), str) else "?", p.get("mps") is True)
                      for p in (procs if isinstance(procs, list) else ()) if isinstance(p, dict)
                      if (pid := _int(p.get("pid"), 1, 2**22)) is not None)
    mode = g.get("compute_mode")
    return SeenGpu(_int(g.get("index")), g["uuid"] if isinstance(g.get("uuid"), str) else "",
                   mode if isinstance(mode, str) else NA,
                   g.get("persistence") if isinstance(g.get("persistence"), bool) else None, processes)


def seen(results: Mapping[str, Result]) -> Seen | None:
    """The nvml probe's facts in this run's results, checked once; None when it did not run."""
    nvml = results.get("nvml")
    if nvml is None:
        return None
    facts = nvml.facts
    gpus = facts.get("gpus")
    cuda = facts.get("cuda_driver")
    return Seen(nvml.ok, _int(facts.get("count")), cuda if isinstance(cuda, str) else None,
                tuple(_gpu(g) for g in (gpus if isinstance(gpus, list) else ()) if isinstance(g, dict)))
