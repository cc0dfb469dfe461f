"""nvidia-smi probe: the driver answers and at least HEALTHCHECK_GPU_COUNT GPUs are visible.

The exit codes (``EXIT_CODES``, read 2026-11-24) are nvidia-smi(1)'s, RETURN VALUE
(https://docs.nvidia.com/deploy/nvidia-smi/index.html: 0, 2-4, 6, 8-10, 12-15, 255), NVIDIA's words
as ``documented``, and 16-18, the NVML code of the failure (``nvmlReturn_t``,
https://docs.nvidia.com/deploy/nvml-api/; 18 is seen in github.com/mozilla/translations issue 1167).
The causes and remedies are ours. Command-line equivalent::

    nvidia-smi --query-gpu=index,name,uuid --format=csv,noheader,nounits
"""

from __future__ import annotations

from probes.context import Context
from probes.hardware import common as hw
from probes.record import Record
from probes.result import Result, passed, verdict
from probes.spec import Spec, cause
from probes.untrusted import clean, is_integer_text, squeeze

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from probes import proc
    from probes.spec import Cause

NAME = "nvidia-smi"
ARGV = ("nvidia-smi", "--query-gpu=index,name,uuid", "--format=csv,noheader,nounits")
MAX_OUTPUT = 512 * 1024  # the largest GPU count HEALTHCHECK_GPU_COUNT accepts (1024) at ~170 bytes a row
_LOST = r"Unable to determine the device handle for (?:GPU\s*)?([0-9A-Fa-f:.]*[0-9A-Fa-f])"

NOT_FOUND = cause("not-found", "nvidia-smi not on PATH", f"{hw.TOOLKIT} (NVIDIA Container Toolkit installed "
                  "on the host)", action="fix-config", actor="tenant")
CANNOT_START = cause("cannot-start", "nvidia-smi cannot be executed (not executable, or its `#!` interpreter "
                     "or loader is missing)", "check the file mounted by the NVIDIA Container Toolkit and "
                     "recreate the container", action="restart-container", actor="tenant")
KILLED = cause("killed", "killed by a signal (an exit status above 128 is an exit status: "
               "no shell runs nvidia-smi)", "the driver or the tool crashed; check `dmesg` for Xid errors",
               action="reset-gpu", actor="operator")
UNPARSEABLE = cause("unparseable", "output is not the expected CSV (quoted, short excerpt)",
                    "check the `nvidia-smi` on PATH is NVIDIA's and matches the driver", action="fix-config",
                    actor="tenant")
STUCK = cause("stuck", "still there after SIGKILL (uninterruptible sleep); while it exists, later runs do "
              "not start another and say so at once", hw.WEDGED, action="reset-gpu", actor="operator")


class Code(Record):
    documented: str  # NVIDIA's words for the code
    means: str  # what it means for a container: the message's detail
    cause: Cause


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
         "check the host's `dmesg` for the driver's interrupt messages; reboot the node; "
         "check the BIOS's PCIe/MSI settings if it returns", action="reboot-node", actor="operator"),
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
         "the container's device cgroup does not allow the GPU "
         "(lost after a host systemctl daemon-reload, or a runtime set to no-cgroups)",
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

# What nvidia-smi prints decides over its exit code (which varies between drivers), in this order.
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

SPEC = Spec(
    NAME, layer="hardware", module=__name__, toggle="ENABLE_GPU_CHECK", timeout=10.0,
    profiles=("startup", "readiness"), measurement="gpus", settings=hw.Expected.SETTINGS,
    about="the driver answers and at least `HEALTHCHECK_GPU_COUNT` GPUs are visible",
    causes=(NOT_FOUND, CANNOT_START, *dict.fromkeys([*(c.cause for c in EXIT_CODES.values()),
                                                     hw.UNKNOWN_ERROR]),
            KILLED, UNPARSEABLE, hw.GPU_COUNT_LOW, hw.DEADLINE, STUCK),
)


def gather(ctx: Context) -> proc.Completed:
    from probes import proc

    return proc.run(ARGV, deadline=ctx.deadline, state=ctx.state, key=NAME, max_output=MAX_OUTPUT)


def parse_rows(text: str) -> tuple[list[dict[str, Any]], str | None]:
    """GPUs (index, name, uuid) from the CSV rows, and the first line that is no row (lost GPUs aside)."""
    import re

    gpus: list[dict[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or re.search(_LOST, line):
            continue
        parts = [p.strip() for p in line.split(",")]
        if (len(parts) < 3 or not is_integer_text(parts[0]) or len(parts[0]) > 6
                or not re.match(r"(GPU|MIG)-[0-9A-Za-z-]+\Z", parts[-1])):
            return gpus, line
        # A GPU name never holds a comma today, but keep whatever lies between index and uuid.
        gpus.append({"index": int(parts[0]), "name": clean(", ".join(parts[1:-1]), 96),
                     "uuid": parts[-1]})  # 96: NVML_DEVICE_NAME_V2_BUFFER_SIZE
    return gpus, None


def judge(data: proc.Completed, ctx: Context) -> Result:
    import re

    from probes import childio, proc, runner

    expected = ctx.config.of(hw.Expected).gpu_count
    if childio.limited(data.spawn_error):  # its words name the limit to raise
        return verdict(NAME, runner.LIMIT, f"not checked: nvidia-smi {data.spawn_error}", remedy=False)
    for bad, c, detail in [
        (data.spawn_error == "not found", NOT_FOUND, "nvidia-smi not found on PATH"),
        (data.spawn_error == "interpreter missing", CANNOT_START, "nvidia-smi cannot start: its interpreter "
         "is missing (a script's #! line or a binary's loader names a file the container lacks)"),
        (data.spawn_error, CANNOT_START, f"nvidia-smi cannot start ({data.spawn_error})"),
        (data.held_by is not None, STUCK, f"an earlier nvidia-smi (pid {data.held_by}) is still stuck in the "
         "driver (uninterruptible sleep); not starting another"),
        (data.stuck, STUCK, "nvidia-smi survived SIGKILL (stuck in the driver, uninterruptible sleep)"),
        (data.timed_out, hw.DEADLINE,
         f"nvidia-smi gave no answer within {data.elapsed:.1f}s (deadline passed)")]:
        if bad:
            return verdict(NAME, c, detail)

    out = data.stdout.decode("utf-8", "replace")
    printed = f"{out}\n{data.stderr.decode('utf-8', 'replace')}"
    gpus, bad_line = parse_rows(out)
    counted: dict[str, Any] = {"observed": len(gpus), "unit": "gpus",
                               "facts": {"count": len(gpus), "gpus": gpus}}
    if lost := re.findall(_LOST, printed):
        others = f"{hw.plural(len(gpus))} still reported" if gpus else "no other GPU reported"
        return verdict(NAME, hw.GPU_LOST,
                       f"GPU {lost[0]} is lost (Unable to determine the device handle; {others})", **counted)
    if data.signal is not None:
        return verdict(NAME, KILLED, f"nvidia-smi was killed by {proc.signal_name(data.signal)}")
    if data.returncode or bad_line:  # what it printed decides, else the exit code
        said = next((text for text, _ in TEXTS if text in printed), None)
        code = dict(TEXTS)[said] if said is not None else EXIT_CODES.get(data.returncode or 0)
        if code is not None and code.cause is not EXIT_CODE:
            detail = (f"nvidia-smi: {said} (exit {data.returncode}): {code.means}" if said is not None
                      else f"{code.means} (nvidia-smi exit {data.returncode})")
            return verdict(NAME, code.cause, detail, **counted)
    if data.returncode != 0:
        said = squeeze(data.stderr or data.stdout, 100)
        return verdict(NAME, EXIT_CODE, f"nvidia-smi failed (exit {data.returncode}: {said or 'no output'})")
    if data.truncated:
        return verdict(NAME, UNPARSEABLE, "nvidia-smi output is too long to be a GPU list "
                       f"(over {MAX_OUTPUT} bytes, starts: {squeeze(data.stdout[:200], 60)!r})")
    if bad_line is not None:
        return verdict(NAME, UNPARSEABLE,
                       f"cannot parse nvidia-smi output ({squeeze(bad_line.encode(), 80)!r})")
    if len(gpus) < expected:
        return verdict(NAME, hw.GPU_COUNT_LOW,
                       f"{hw.plural(len(gpus))} visible (expected at least {expected})", **counted)
    names = sorted({g["name"] for g in gpus})
    summary = ", ".join(f"{n} x{sum(g['name'] == n for g in gpus)}" for n in names)
    return passed(NAME, f"{hw.plural(len(gpus))} visible ({summary or 'none expected'})", **counted)
