"""nvidia-smi probe: the driver answers and at least HEALTHCHECK_GPU_COUNT GPUs are visible.

Command-line equivalent::

    nvidia-smi --query-gpu=index,name,uuid --format=csv,noheader,nounits

``judge`` turns nvidia-smi's documented exit codes and messages into a cause.
"""

from __future__ import annotations

from probes import hardware as hw
from probes.context import Context
from probes.numbers import is_integer_text
from probes.record import Record
from probes.result import Result, passed, verdict
from probes.untrusted import clean, squeeze

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from probes import proc


UNIT = "gpus"
SPEC = hw.SMI_SPEC
ARGV = ("nvidia-smi", "--query-gpu=index,name,uuid", "--format=csv,noheader,nounits")

# Room for the largest GPU count HEALTHCHECK_GPU_COUNT accepts (1024) at ~170 bytes a row.
MAX_OUTPUT = 512 * 1024
MAX_NAME = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE

_LOST = r"Unable to determine the device handle for (?:GPU\s*)?([0-9A-Fa-f:.]*[0-9A-Fa-f])"
_UUID = r"^(GPU|MIG)-[0-9A-Za-z-]+$"

# What nvidia-smi prints, found anywhere in its output, decides over its exit code (which varies
# between driver versions for the same failure). Checked in this order.
TEXTS: tuple[tuple[str, hw.SmiCode], ...] = (
    ("Driver/library version mismatch", hw.SMI_EXIT_CODES[18]),
    ("GPU access blocked by the operating system", hw.SMI_EXIT_CODES[17]),
    ("Failed to initialize NVML: Insufficient Permissions", hw.SMI_EXIT_CODES[4]),
    ("couldn't communicate with the NVIDIA driver", hw.SMI_EXIT_CODES[9]),
    ("Failed to initialize NVML: Driver Not Loaded", hw.SMI_EXIT_CODES[9]),
    ("couldn't find libnvidia-ml.so", hw.SMI_EXIT_CODES[12]),
    ("No devices were found", hw.SMI_EXIT_CODES[6]),
    ("infoROM is corrupted", hw.SMI_EXIT_CODES[14]),
    ("Failed to initialize NVML: Unknown Error", hw.SmiCode(
        "Failed to initialize NVML: Unknown Error", "the container probably lost its device cgroup access "
        "after a host systemctl daemon-reload", hw.UNKNOWN_ERROR)),
)


class Gpu(Record):
    __slots__ = ("index", "name", "uuid")

    index: int  # type: ignore[assignment]  # a field, shadowing tuple.index() on purpose
    name: str
    uuid: str

    def __init__(self, index: int, name: str, uuid: str) -> None:
        self.index = index
        self.name = name
        self.uuid = uuid


def gather(ctx: Context) -> proc.Completed:
    from probes import proc

    return proc.run(ARGV, deadline=ctx.deadline, state=ctx.state, key=hw.SMI_NAME, max_output=MAX_OUTPUT)


def parse_rows(text: str) -> tuple[list[Gpu], str | None]:
    """GPUs from the CSV rows; the first line that is not a row (None if all are rows).

    Lines about a lost GPU are skipped here: ``judge`` reports them on their own.
    """
    import re

    gpus: list[Gpu] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or re.search(_LOST, line):
            continue
        parts = [p.strip() for p in line.split(",")]
        # is_integer_text, not isdigit(): that accepts '\u00b2', which int() refuses.
        if (len(parts) < 3 or not is_integer_text(parts[0]) or len(parts[0]) > 6
                or not re.match(_UUID, parts[-1])):
            return gpus, line
        # A GPU name never holds a comma today, but keep whatever lies between index and uuid.
        gpus.append(Gpu(int(parts[0]), clean(", ".join(parts[1:-1]), MAX_NAME), parts[-1]))
    return gpus, None


def known(returncode: int | None, output: str) -> tuple[hw.SmiCode, str | None] | None:
    """The entry for what nvidia-smi printed (with the text found) or, failing that, for its exit code."""
    for text, code in TEXTS:
        if text in output:
            return code, text
    by_exit = hw.SMI_EXIT_CODES.get(returncode) if returncode is not None else None
    return (by_exit, None) if by_exit is not None else None


def detail(code: hw.SmiCode, returncode: int | None, text: str | None = None) -> str:
    """What nvidia-smi said (or what its exit code means) and the exit code: the message's detail."""
    if text is not None:
        return f"nvidia-smi: {text} (exit {returncode}): {code.means}"
    return f"{code.means} (nvidia-smi exit {returncode})"


def _facts(gpus: list[Gpu]) -> dict[str, object]:
    return {"count": len(gpus), "gpus": [g._asdict() for g in gpus]}


def judge(data: proc.Completed, ctx: Context) -> Result:
    import re

    from probes import childio, proc, runner

    expected = ctx.config.of(hw.Expected).gpu_count
    if data.spawn_error == "not found":
        return verdict(hw.SMI_NAME, hw.SMI_NOT_FOUND, "nvidia-smi not found on PATH")
    if data.spawn_error == "interpreter missing":
        return verdict(hw.SMI_NAME, hw.SMI_CANNOT_START,
                       "nvidia-smi cannot start: its interpreter is missing "
                       "(a script's #! line or a binary's loader names a file the container lacks)")
    if childio.limited(data.spawn_error):  # its words name the limit to raise
        return verdict(hw.SMI_NAME, runner.LIMIT, f"not checked: nvidia-smi {data.spawn_error}", remedy=False)
    if data.spawn_error:
        return verdict(hw.SMI_NAME, hw.SMI_CANNOT_START, f"nvidia-smi cannot start ({data.spawn_error})")
    if data.held_by is not None:
        return verdict(hw.SMI_NAME, hw.STUCK, f"an earlier nvidia-smi (pid {data.held_by}) is still stuck "
                       "in the driver (uninterruptible sleep); not starting another")
    if data.stuck:
        return verdict(hw.SMI_NAME, hw.STUCK, "nvidia-smi survived SIGKILL "
                       "(stuck in the driver, uninterruptible sleep)")
    if data.timed_out:
        return verdict(hw.SMI_NAME, hw.DEADLINE, f"nvidia-smi gave no answer within {data.elapsed:.1f}s "
                       "(deadline passed)")

    out = data.stdout.decode("utf-8", "replace")
    err = data.stderr.decode("utf-8", "replace")
    gpus, bad_line = parse_rows(out)
    counted: dict[str, Any] = {"observed": len(gpus), "unit": UNIT, "facts": _facts(gpus)}
    lost = re.findall(_LOST, out + "\n" + err)
    if lost:
        others = f"{hw.plural(len(gpus))} still reported" if gpus else "no other GPU reported"
        return verdict(hw.SMI_NAME, hw.GPU_LOST, f"GPU {lost[0]} is lost "
                       f"(Unable to determine the device handle; {others})", **counted)
    # Not run through a shell: a signal is Completed.signal, and an exit of 129-254 is a plain exit.
    if data.signal is not None:
        return verdict(hw.SMI_NAME, hw.SMI_KILLED,
                       f"nvidia-smi was killed by {proc.signal_name(data.signal)}")
    entry = known(data.returncode, out + "\n" + err) if data.returncode or bad_line else None
    if entry is not None and entry[0].cause is not hw.SMI_EXIT_CODE:
        code, text = entry
        return verdict(hw.SMI_NAME, code.cause, detail(code, data.returncode, text), **counted)
    if data.returncode != 0:
        said = squeeze(data.stderr or data.stdout, 100)
        return verdict(hw.SMI_NAME, hw.SMI_EXIT_CODE, f"nvidia-smi failed (exit {data.returncode}: "
                       f"{said or 'no output'})")
    if data.truncated:
        return verdict(hw.SMI_NAME, hw.SMI_UNPARSEABLE, "nvidia-smi output is too long to be a GPU list "
                       f"(over {MAX_OUTPUT} bytes, starts: {squeeze(data.stdout[:200], 60)!r})")
    if bad_line is not None:
        return verdict(hw.SMI_NAME, hw.SMI_UNPARSEABLE, "cannot parse nvidia-smi output "
                       f"({squeeze(bad_line.encode(), 80)!r})")
    names = sorted({g.name for g in gpus})
    summary = ", ".join(f"{n} x{sum(g.name == n for g in gpus)}" for n in names)
    if len(gpus) < expected:
        return verdict(hw.SMI_NAME, hw.GPU_COUNT_LOW,
                       f"{hw.plural(len(gpus))} visible (expected at least {expected})", **counted)
    return passed(hw.SMI_NAME, f"{hw.plural(len(gpus))} visible ({summary or 'none expected'})", **counted)
