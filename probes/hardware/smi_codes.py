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

The causes and remedies are ours, for a container started through the NVIDIA Container Toolkit;
those NVML reports too are declared once in :mod:`probes.hardware`.
"""

from __future__ import annotations

from probes import hardware as hw
from probes.record import Record
from probes.spec import Cause, cause


class Code(Record):
    __slots__ = ("documented", "means", "cause")

    documented: str  # NVIDIA's words for the code
    means: str  # what it means for a container: the message's detail
    cause: Cause

    def __init__(self, documented: str, means: str, cause: Cause) -> None:
        self.documented = documented
        self.means = means
        self.cause = cause


def _own(number: int, reason: str, documented: str, means: str, remedy: str, *, action: str, actor: str,
         more: str = "") -> tuple[int, Code]:
    """An exit code whose cause only nvidia-smi reports: the cause's row quotes NVIDIA's words."""
    row = cause(reason, f'exit {number}, "{documented}": {means}{more}', remedy, action=action, actor=actor)
    return number, Code(documented, means, row)


EXIT_CODES: dict[int, Code] = dict((
    _own(2, "bad-argument", "A supplied argument or flag is invalid",
         "this nvidia-smi does not know the probe's query (too old, or not NVIDIA's)",
         "use the nvidia-smi that the NVIDIA Container Toolkit mounts from the host's driver; remove any "
         "nvidia-smi the image ships", action="fix-config", actor="tenant"),
    _own(3, "not-supported", "The requested operation is not available on target device",
         "the driver cannot answer the GPU query here",
         "check the driver on the host (`nvidia-smi -q`); update it to a data-center release",
         action="fix-config", actor="operator"),
    (4, Code("The current user does not have permission to access this device or perform this operation",
             "the container's user cannot open the GPU's device files (rootless runtime, SELinux, device "
             "nodes mounted by hand)", hw.NO_PERMISSION)),
    _own(6, "no-devices", "A query to find an object was unsuccessful", "no GPU is visible in the container",
         f"{hw.TOOLKIT} and check `NVIDIA_VISIBLE_DEVICES` / the `nvidia.com/gpu` resource request",
         action="fix-config", actor="tenant"),
    _own(8, "insufficient-power", "A device's external power cables are not properly attached",
         "a GPU lacks its external power", "drain the node and have the GPU's power cables checked",
         action="service-hardware", actor="operator"),
    (9, Code("NVIDIA driver is not loaded", "the host's kernel module is not loaded", hw.DRIVER_NOT_LOADED)),
    _own(10, "irq-issue", "NVIDIA Kernel detected an interrupt issue with a GPU",
         "the driver gets no interrupts from a GPU",
         "check the host's `dmesg` for the driver's interrupt messages; reboot the node; check the BIOS's "
         "PCIe/MSI settings if it returns", action="reboot-node", actor="operator"),
    (12, Code("NVML Shared Library couldn't be found or loaded",
              "libnvidia-ml.so.1 (it ships with the driver) is not in the container", hw.NVML_NOT_FOUND)),
    (13, Code("Local version of NVML doesn't implement this function",
              "the libnvidia-ml the container loads is older than this nvidia-smi (an image with its own "
              "driver libraries)", hw.NVML_TOO_OLD)),
    (14, Code("infoROM is corrupted", "a GPU's InfoROM is corrupted", hw.INFOROM)),
    (15, Code("The GPU has fallen off the bus or has otherwise become inaccessible", "a GPU fell off the bus",
              hw.GPU_LOST)),
    (16, Code("The GPU requires a reset before it can be used again (NVML)", "a GPU needs a reset",
              hw.RESET_REQUIRED)),
    _own(17, "blocked-by-os",
         "The GPU control device has been blocked by the operating system/cgroups (NVML)",
         "the container's device cgroup does not allow the GPU (lost after a host systemctl daemon-reload, "
         "or a runtime set to no-cgroups)",
         "recreate the container; "
         "let the toolkit manage the device rules (CDI) so a daemon-reload cannot drop them",
         action="restart-container", actor="operator"),
    (18, Code("RM detects a driver/library version mismatch (NVML)",
              "the host's driver was upgraded without reloading the kernel module", hw.DRIVER_MISMATCH)),
    _own(255, "exit-code", "Other error or internal driver error occurred", "nvidia-smi failed",
         "check the host's `dmesg` for Xid errors and run `nvidia-smi -q` there", action="reset-gpu",
         actor="operator", more=", or any exit status this table lacks (the message quotes its output)"),
))
EXIT_CODE = EXIT_CODES[255].cause  # a failure this table does not name

# What nvidia-smi prints, found anywhere in its output, decides over its exit code (which varies
# between driver versions for the same failure). Checked in this order.
TEXTS: tuple[tuple[str, Code], ...] = (
    ("Driver/library version mismatch", EXIT_CODES[18]),
    ("GPU access blocked by the operating system", EXIT_CODES[17]),
    ("Failed to initialize NVML: Insufficient Permissions", EXIT_CODES[4]),
    ("couldn't communicate with the NVIDIA driver", EXIT_CODES[9]),
    ("Failed to initialize NVML: Driver Not Loaded", EXIT_CODES[9]),
    ("couldn't find libnvidia-ml.so", EXIT_CODES[12]),
    ("No devices were found", EXIT_CODES[6]),
    ("infoROM is corrupted", EXIT_CODES[14]),
    ("Failed to initialize NVML: Unknown Error", Code(
        "Failed to initialize NVML: Unknown Error", "the container probably lost its device cgroup access "
        "after a host systemctl daemon-reload", hw.UNKNOWN_ERROR)),
)
# The cause rows of docs/probes.md, one per reason, in the order of the table.
CAUSES: tuple[Cause, ...] = tuple(dict.fromkeys([*(c.cause for c in EXIT_CODES.values()), hw.UNKNOWN_ERROR]))


def known(returncode: int | None, output: str) -> tuple[Code, str | None] | None:
    """The entry for what nvidia-smi printed (with the text found) or, failing that, for its exit code."""
    for text, code in TEXTS:
        if text in output:
            return code, text
    by_exit = EXIT_CODES.get(returncode) if returncode is not None else None
    return (by_exit, None) if by_exit is not None else None


def detail(code: Code, returncode: int | None, text: str | None = None) -> str:
    """What nvidia-smi said (or what its exit code means) and the exit code: the message's detail."""
    if text is not None:
        return f"nvidia-smi: {text} (exit {returncode}): {code.means}"
    return f"{code.means} (nvidia-smi exit {returncode})"
