"""What the hardware probes share: the expected GPU count, the causes nvidia-smi and NVML both report,
a judge's problems folded into one result, and the nvml facts as the probes above read them."""

from __future__ import annotations

from probes.record import Record
from probes.result import verdict
from probes.spec import INTEGER, Declared, cause, setting

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from probes.result import Result
    from probes.spec import Cause

NA = "N/A"  # a field the GPU or driver does not have, or could not be read: never judged


def none_requested(visible: str | None) -> bool:  # NVIDIA_VISIBLE_DEVICES asks for no GPU
    return visible is not None and visible.strip().lower() in ("", "none", "void")


def plural(n: int, what: str = "GPU") -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


class Expected(Declared):
    gpu_count: int = setting("HEALTHCHECK_GPU_COUNT", INTEGER, 1, "minimum number of GPUs expected", low=0,
                             high=1024, low_inclusive=True)


RESET = "reset the GPU (`nvidia-smi -r`) or reboot the node"
WEDGED = f"the driver may be wedged: check `dmesg` for Xid errors, {RESET}"
CHECK_DRIVER = "check the driver on the host (`nvidia-smi -q`, `dmesg`)"
TOOLKIT = "start the container with `--gpus all`"

# The exit code is nvidia-smi's, the name NVML's.
DRIVER_NOT_LOADED = cause("driver-not-loaded", "exit 9 / NVML_ERROR_DRIVER_NOT_LOADED: the NVIDIA kernel "
                          "module is not loaded on the host",
                          "load the kernel module on the host (`modprobe nvidia`; check `nvidia-smi` there), "
                          "then restart the container", action="reboot-node", actor="operator")
NVML_NOT_FOUND = cause("nvml-not-found", "exit 12 / NVML library not found: libnvidia-ml.so.1 ships with the "
                       "driver and the NVIDIA Container Toolkit mounts it",
                       f"{TOOLKIT} (NVIDIA Container Toolkit, `NVIDIA_DRIVER_CAPABILITIES` with `utility`)",
                       action="fix-config", actor="tenant")
NO_PERMISSION = cause("no-permission", "exit 4 / NVML_ERROR_NO_PERMISSION: the container's user cannot open "
                      "the GPU's device files `/dev/nvidia*` (rootless runtime, SELinux, device nodes "
                      "mounted by hand)", "start the container through the NVIDIA Container Toolkit "
                      "(`--gpus all` or CDI) or allow the devices in its cgroup; under SELinux allow "
                      "`container_use_devices`", action="fix-config", actor="tenant")
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
GPU_COUNT_LOW = cause("gpu-count", "fewer GPUs than `HEALTHCHECK_GPU_COUNT`", "start the container with more "
                      "GPUs (`--gpus all`, `NVIDIA_VISIBLE_DEVICES`, `nvidia.com/gpu` limit) or lower "
                      "`HEALTHCHECK_GPU_COUNT`", action="fix-config", actor="tenant")
DEADLINE = cause("deadline", "no answer by the deadline (driver wedged)", f"{WEDGED}; enable persistence "
                 "mode on the host (`nvidia-smi -pm 1`)", action="reset-gpu", actor="operator")

# NVML's own, raised by nvml_lib (for the nvml probe, deep.survey and serve's event watcher).
BINDINGS_MISSING = cause("nvml-bindings-missing", "nvidia-ml-py not installed in the suite's environment",
                         "`pip install nvidia-ml-py`", action="fix-config", actor="tenant")
BINDINGS_SHADOWED = cause("nvml-bindings-shadowed", "the deprecated `pynvml` package shadows nvidia-ml-py",
                          "`pip uninstall pynvml && pip install --force-reinstall nvidia-ml-py`",
                          action="fix-config", actor="tenant")
NVML_TIMEOUT = cause("nvml-timeout", "NVML_ERROR_TIMEOUT", WEDGED, action="reset-gpu", actor="operator")
NVML_ERROR = cause("nvml-error", "another NVML error code", CHECK_DRIVER, action="reset-gpu",
                   actor="operator")


class Problem(Record):
    cause: Cause
    detail: str
    remedy: bool = True  # False where the detail already names what to do

    def result(self, name: str, **kw: Any) -> Result:
        return verdict(name, self.cause, self.detail, remedy=self.remedy, **kw)


def worst(name: str, problems: list[Problem], facts: dict[str, Any], **kw: Any) -> Result | None:
    """The first failure, else the first warning, with how many more (None: none); all go into facts."""
    problems = sorted(problems, key=lambda p: p.cause.status != "fail")  # stable: the judge's order
    facts["problems"] = [{"status": p.cause.status, "reason": p.cause.reason} for p in problems]
    if not problems:
        return None
    first = problems[0].result(name, facts=facts, **kw)
    return first._replace(message=f"{first.message} (+{len(problems) - 1} more)") if problems[1:] else first


class SeenGpu(Record):
    index: int | None
    uuid: str
    compute_mode: str
    persistence: bool | None
    processes: tuple[tuple[int, str, bool], ...]  # (pid, name, whether an MPS client)


class Seen(Record):
    ok: bool  # the probe passed or warned
    count: int | None  # the devices CUDA enumerates (MIG devices for a GPU in MIG mode)
    cuda_driver: str | None  # the highest CUDA version the driver supports: "12.4"
    gpus: tuple[SeenGpu, ...]


def _int(value: Any, low: int = 0, high: int = 2**31) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and low <= value < high else None


def _seen_gpu(g: Mapping[str, Any]) -> SeenGpu:
    procs = g.get("processes")
    processes = tuple((pid, p["name"] if isinstance(p.get("name"), str) else "?", p.get("mps") is True)
                      for p in (procs if isinstance(procs, list) else ()) if isinstance(p, dict)
                      if (pid := _int(p.get("pid"), 1, 2**22)) is not None)
    mode = g.get("compute_mode")
    return SeenGpu(_int(g.get("index")), g["uuid"] if isinstance(g.get("uuid"), str) else "",
                   mode if isinstance(mode, str) else NA,
                   g.get("persistence") if isinstance(g.get("persistence"), bool) else None, processes)


def seen(results: Mapping[str, Result]) -> Seen | None:
    """This run's nvml facts, checked once (what lacks its type is left out)."""
    nvml = results.get("nvml")
    if nvml is None:
        return None
    gpus, cuda = nvml.facts.get("gpus"), nvml.facts.get("cuda_driver")
    return Seen(nvml.ok, _int(nvml.facts.get("count")), cuda if isinstance(cuda, str) else None,
                tuple(_seen_gpu(g) for g in (gpus if isinstance(gpus, list) else ()) if isinstance(g, dict)))
