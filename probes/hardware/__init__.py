"""The hardware layer: nvidia-smi and NVML. What both probes read and say lives here."""

from __future__ import annotations

from probes.record import Record
from probes.spec import INTEGER, Cause, Setting

NA = "N/A"  # a field the GPU or driver does not have, or could not be read: never judged


def none_requested(visible: str | None) -> bool:
    """``NVIDIA_VISIBLE_DEVICES`` set to ask for no GPU: empty, ``none`` or ``void``."""
    return visible is not None and visible.strip().lower() in ("", "none", "void")


GPU_COUNT = Setting("HEALTHCHECK_GPU_COUNT", "gpu_count", INTEGER, 1, "minimum number of GPUs expected",
                    low=0, high=1024, low_inclusive=True)


class Expected(Record):
    """``HEALTHCHECK_GPU_COUNT``, typed: what nvidia-smi and nvml read (their ``Settings``)."""

    __slots__ = ("gpu_count",)

    gpu_count: int

    def __init__(self, gpu_count: int) -> None:
        self.gpu_count = gpu_count


# Causes that nvidia-smi and NVML report alike.
DRIVER_NOT_LOADED = Cause("driver-not-loaded", "fail", "exit 9 / NVML_ERROR_DRIVER_NOT_LOADED: driver not "
                                                       "loaded",
                          "load the kernel module on the host (`modprobe nvidia`), restart the container")
NVML_NOT_FOUND = Cause("nvml-not-found", "fail", "exit 12 / NVML library not found",
                       "libnvidia-ml.so.1 ships with the driver: start with `--gpus all`, "
                       "`NVIDIA_DRIVER_CAPABILITIES` including `utility`")
INFOROM = Cause("inforom-corrupted", "fail", "exit 14 / corrupted InfoROM",
                "drain the node, have the GPU serviced (RMA)")
GPU_LOST = Cause("gpu-lost", "fail", "exit 15, \"Unable to determine the device handle\", "
                                     "NVML_ERROR_GPU_IS_LOST: "
                 "GPU fallen off the bus (Xid 79), others still reported",
                 "reset the GPU (`nvidia-smi -r`) or reboot the node; check `dmesg` for Xid")
UNKNOWN_ERROR = Cause("nvml-unknown-error", "fail", "exit 255 / NVML init \"Unknown Error\": device cgroup "
                                                    "access "
                      "lost after a host `systemctl daemon-reload`", "recreate the container")
GPU_COUNT_LOW = Cause("gpu-count", "fail", "fewer GPUs than `HEALTHCHECK_GPU_COUNT`",
                      "start with more GPUs (`--gpus all`, `NVIDIA_VISIBLE_DEVICES`, `nvidia.com/gpu`) or "
                      "lower "
                      "`HEALTHCHECK_GPU_COUNT`")
DEADLINE = Cause("deadline", "fail", "no answer by the deadline (driver wedged)",
                 "check `dmesg` for Xid, reset the GPU (`nvidia-smi -r`) or reboot the node; enable "
                 "persistence "
                 "mode (`nvidia-smi -pm 1`)")
