"""What nvidia-smi's exit codes and NVML's initialisation errors mean, and what to do about each.

Sources, read 2026-11-24:

- nvidia-smi(1), section RETURN VALUE (https://docs.nvidia.com/deploy/nvidia-smi/index.html):
  0, 2, 3, 4, 6, 8, 9, 10, 12, 13, 14, 15 and 255, each with its one-line cause, quoted in
  :data:`EXIT_CODES` as ``documented``. The page lists no other code.
- NVML's ``nvmlReturn_t`` (https://docs.nvidia.com/deploy/nvml-api/): nvidia-smi exits with the
  NVML code of the failure, so drivers since the page was written also exit 16 (reset
  required), 17 (blocked by the operating system) and 18 (driver/library version mismatch,
  seen as "nvidia-smi failed with return code 18" with "Failed to initialize NVML:
  Driver/library version mismatch", github.com/mozilla/translations issue 1167).
- The texts nvidia-smi prints for them (:data:`TEXTS`) are NVML's error strings after "Failed to
  initialize NVML: ", and nvidia-smi's own lines for a missing driver or library.

The causes and remedies are ours, for a container started through the NVIDIA Container Toolkit.
"""

from __future__ import annotations

from probes.record import Record
from probes.spec import Cause


class Code(Record):
    __slots__ = ("reason", "documented", "cause", "remedy")

    reason: str  # the probe's reason code
    documented: str  # NVIDIA's words for the code
    cause: str  # what it means for a container
    remedy: str

    def __init__(self, reason: str, documented: str, cause: str, remedy: str) -> None:
        self.reason = reason
        self.documented = documented
        self.cause = cause
        self.remedy = remedy


RESET_OR_REBOOT = "reset the GPU (nvidia-smi -r) or reboot the node"

EXIT_CODES: dict[int, Code] = {
    2: Code(
        "bad-argument",
        "A supplied argument or flag is invalid",
        "this nvidia-smi does not know the probe's query (too old, or not NVIDIA's)",
        "use the nvidia-smi that the NVIDIA Container Toolkit mounts from the host's driver; remove any "
        "nvidia-smi the image ships"),
    3: Code(
        "not-supported",
        "The requested operation is not available on target device",
        "the driver cannot answer the GPU query here",
        "check the driver on the host (nvidia-smi -q); update it to a data-center release"),
    4: Code(
        "no-permission",
        "The current user does not have permission to access this device or perform this operation",
        "the container's user cannot open the GPU's device files (rootless runtime, SELinux, device nodes "
        "mounted by hand)",
        "start the container through the NVIDIA Container Toolkit (--gpus all or CDI); under SELinux allow "
        "container_use_devices"),
    6: Code(
        "no-devices",
        "A query to find an object was unsuccessful",
        "no GPU is visible in the container",
        "start the container with --gpus all and check NVIDIA_VISIBLE_DEVICES / the nvidia.com/gpu resource "
        "request"),
    8: Code(
        "insufficient-power",
        "A device's external power cables are not properly attached",
        "a GPU lacks its external power",
        "drain the node and have the GPU's power cables checked"),
    9: Code(
        "driver-not-loaded",
        "NVIDIA driver is not loaded",
        "the host's kernel module is not loaded",
        "load the kernel module on the host (modprobe nvidia), then restart the container"),
    10: Code(
        "irq-issue",
        "NVIDIA Kernel detected an interrupt issue with a GPU",
        "the driver gets no interrupts from a GPU",
        "check the host's dmesg for the driver's interrupt messages; reboot the node; check the BIOS's "
        "PCIe/MSI settings if it returns"),
    12: Code(
        "nvml-not-found",
        "NVML Shared Library couldn't be found or loaded",
        "libnvidia-ml.so.1 (it ships with the driver) is not in the container",
        "start the container with --gpus all (NVIDIA Container Toolkit, NVIDIA_DRIVER_CAPABILITIES with "
        "utility)"),
    13: Code(
        "nvml-too-old",
        "Local version of NVML doesn't implement this function",
        "the libnvidia-ml the container loads is older than this nvidia-smi (an image with its own driver "
        "libraries)",
        "remove the driver libraries from the image so that the toolkit mounts the host's"),
    14: Code(
        "inforom-corrupted",
        "infoROM is corrupted",
        "a GPU's InfoROM is corrupted",
        "drain the node and have the GPU serviced (RMA)"),
    15: Code(
        "gpu-lost",
        "The GPU has fallen off the bus or has otherwise become inaccessible",
        'a GPU fell off the bus (also "Unable to determine the device handle" for one GPU, at any exit)',
        "reset the GPU (nvidia-smi -r) or reboot the node; check dmesg for Xid 79"),
    16: Code(
        "reset-required",
        "The GPU requires a reset before it can be used again (NVML)",
        "a GPU needs a reset",
        "reset the GPU (nvidia-smi -r) or reboot the node"),
    17: Code(
        "blocked-by-os",
        "The GPU control device has been blocked by the operating system/cgroups (NVML)",
        "the container's device cgroup does not allow the GPU (lost after a host systemctl daemon-reload, "
        "or a runtime set to no-cgroups)",
        "recreate the container; let the toolkit manage the device rules (CDI) so a daemon-reload cannot "
        "drop them"),
    18: Code(
        "driver-mismatch",
        "RM detects a driver/library version mismatch (NVML)",
        "the host's driver was upgraded without reloading the kernel module",
        "reboot the node, or reload the kernel module (stop what uses the GPUs, rmmod the nvidia modules, "
        "modprobe nvidia)"),
    255: Code(
        "exit-code",
        "Other error or internal driver error occurred",
        "nvidia-smi failed",
        "check the host's dmesg for Xid errors and run nvidia-smi -q there"),
}

# What nvidia-smi prints, found anywhere in its output, decides over its exit code (which varies
# between driver versions for the same failure). Checked in this order.
UNKNOWN_ERROR = Code("nvml-unknown-error", "Failed to initialize NVML: Unknown Error",
                     "the container probably lost its device cgroup access after a host systemctl "
                     "daemon-reload", "recreate the container")
TEXTS: tuple[tuple[str, Code], ...] = (
    ("Driver/library version mismatch", EXIT_CODES[18]),
    ("GPU access blocked by the operating system", EXIT_CODES[17]),
    ("Failed to initialize NVML: Insufficient Permissions", EXIT_CODES[4]),
    ("couldn't communicate with the NVIDIA driver", EXIT_CODES[9]),
    ("Failed to initialize NVML: Driver Not Loaded", EXIT_CODES[9]),
    ("couldn't find libnvidia-ml.so", EXIT_CODES[12]),
    ("No devices were found", EXIT_CODES[6]),
    ("infoROM is corrupted", EXIT_CODES[14]),
    ("Failed to initialize NVML: Unknown Error", UNKNOWN_ERROR),
)


def known(returncode: int | None, output: str) -> tuple[Code, str | None] | None:
    """The entry for what nvidia-smi printed (with the text found) or, failing that, for its exit code."""
    for text, code in TEXTS:
        if text in output:
            return code, text
    by_exit = EXIT_CODES.get(returncode) if returncode is not None else None
    return (by_exit, None) if by_exit is not None else None


def message(code: Code, returncode: int | None, text: str | None = None) -> str:
    """One line: what nvidia-smi said (or what its exit code means), the exit code, the remedy."""
    if text is not None:
        return f"nvidia-smi: {text} (exit {returncode}): {code.cause}; {code.remedy}"
    return f"{code.cause} (nvidia-smi exit {returncode}): {code.remedy}"


def causes() -> tuple[Cause, ...]:
    """The cause rows of docs/probes.md, one per reason, in the order of the table."""
    rows: dict[str, Cause] = {}
    for number, code in EXIT_CODES.items():
        said = f'exit {number}, "{code.documented}": {code.cause}'
        if code.reason == "exit-code":
            said += ", or any exit status this table lacks (the message quotes its output)"
        prior = rows.get(code.reason)
        cause = f"{prior.cause}; {said}" if prior else said
        rows[code.reason] = Cause(code.reason, "fail", cause, code.remedy)
    rows[UNKNOWN_ERROR.reason] = Cause(UNKNOWN_ERROR.reason, "fail", f'"{UNKNOWN_ERROR.documented}": '
                                       f"{UNKNOWN_ERROR.cause}", UNKNOWN_ERROR.remedy)
    return tuple(rows.values())
