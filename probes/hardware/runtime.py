"""runtime probe: the container's runtime limits that break CUDA work without any GPU fault.

Cheap and without a GPU call. It proves that

- ``/dev/shm`` is large enough for NCCL and DataLoader workers (Docker's default 64 MiB
  fails NCCL with "unhandled system error" and DataLoader workers with a bus error): below
  ``HEALTHCHECK_SHM_MIN_MIB`` (1024) it warns with the fix;
- the device nodes CUDA needs are there: ``/dev/nvidiactl``, ``/dev/nvidia-uvm`` (without it
  NVML and nvidia-smi work while CUDA fails) and one ``/dev/nvidiaN`` per expected GPU. They
  are judged only when the container was given GPUs (``NVIDIA_VISIBLE_DEVICES`` names some,
  or an NVIDIA node exists): a container without GPUs is the nvml probe's to judge;
- no environment variable that changes CUDA's behaviour for debugging is set
  (``CUDA_LAUNCH_BLOCKING``, ``CUDA_INJECTION64_PATH``, core dumps on exception, ...): each
  warns, naming the variable. The probe sees the image's configured environment, which is
  what the workload inherits unless its entrypoint changes it;
- in the startup profile only, persistence mode is on (read from the nvml probe's facts, so
  no second NVML session; not judged when nvml did not run): off is an informational warning.

Command-line equivalent::

    df -h /dev/shm; ls -l /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia[0-9]*; env | grep ^CUDA_
"""

from __future__ import annotations

import os
import stat

from probes import hardware as hw
from probes.context import Context
from probes.record import Record
from probes.result import Result, Status, failed, passed, warned
from probes.spec import INTEGER, TEXT, Cause, Setting, Spec
from probes.untrusted import clean

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

NAME = "runtime"
MEASUREMENT = "shm"
UNIT = "MiB"
MIB = 1 << 20

SPEC = Spec(
    NAME, "hardware", __name__, "ENABLE_RUNTIME_CHECK", 2.0, ("startup", "readiness"), requires=("nvml",),
    measurement=MEASUREMENT,
    about="container runtime limits: `/dev/shm` size, CUDA's device nodes, CUDA-debugging variables, "
          "persistence mode (startup)",
    settings=(
        hw.GPU_COUNT,
        Setting("HEALTHCHECK_SHM_PATH", "shm_path", TEXT, "/dev/shm",  # noqa: S108  (measured, not written)
                "the shared-memory mount whose size is judged"),
        Setting("HEALTHCHECK_SHM_MIN_MIB", "shm_min_mib", INTEGER, 1024,
                "`/dev/shm` below this many MiB warns (NCCL, DataLoader workers)", low=0, high=1 << 24,
                low_inclusive=True),
        Setting("HEALTHCHECK_DEV_ROOT", "dev_root", TEXT, "/dev",
                "where the NVIDIA device nodes are looked for"),
    ),
    causes=(
        Cause("shm-small", "warn", "`/dev/shm` smaller than `HEALTHCHECK_SHM_MIN_MIB` (Docker's default is "
              "64 MiB): NCCL fails with \"unhandled system error\", DataLoader workers die",
              "`docker run --shm-size=8g` or `--ipc=host`; in Kubernetes mount an `emptyDir` with "
              "`medium: Memory` at `/dev/shm`"),
        Cause("shm-missing", "warn", "`/dev/shm` cannot be measured", "mount a tmpfs at `/dev/shm`"),
        Cause("device-nodes", "fail", "`/dev/nvidiactl`, `/dev/nvidia-uvm` or a `/dev/nvidiaN` per expected "
              "GPU is missing although the container was given GPUs",
              "start with `--gpus all` (NVIDIA Container Toolkit); for `nvidia-uvm` run "
              "`nvidia-modprobe -u -c=0` on the host, then recreate the container"),
        Cause("cuda-debug-env", "warn", "a variable that changes CUDA's behaviour for debugging is set "
              "(`CUDA_LAUNCH_BLOCKING`, `CUDA_INJECTION64_PATH`, `CUDA_ENABLE_COREDUMP_ON_EXCEPTION`, ...)",
              "remove it from the image or deployment for production"),
        Cause("persistence-off", "warn", "persistence mode off (startup only, from the nvml probe): each "
              "NVML/CUDA start re-initialises the GPU", "`nvidia-smi -pm 1` or run `nvidia-persistenced` on "
              "the host"),
    ),
)


class Settings(Record):
    """The settings runtime reads, typed (``ctx.config.of(Settings)``)."""

    __slots__ = ("gpu_count", "shm_path", "shm_min_mib", "dev_root")

    gpu_count: int
    shm_path: str
    shm_min_mib: int
    dev_root: str

    def __init__(self, gpu_count: int, shm_path: str, shm_min_mib: int, dev_root: str) -> None:
        self.gpu_count = gpu_count
        self.shm_path = shm_path
        self.shm_min_mib = shm_min_mib
        self.dev_root = dev_root


# Variables that change CUDA's (or torch's allocator's) behaviour and do not belong in production.
DEBUG_ENV: Mapping[str, str] = {
    "CUDA_LAUNCH_BLOCKING": "serialises every kernel launch (slow)",
    "CUDA_INJECTION64_PATH": "injects a tool library into every CUDA process",
    "CUDA_ENABLE_COREDUMP_ON_EXCEPTION": "writes a GPU core dump on every exception",
    "CUDA_ENABLE_CPU_COREDUMP_ON_EXCEPTION": "writes a CPU core dump on every GPU exception",
    "CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "lets a pipe trigger GPU core dumps",
    "CUDA_DEVICE_WAITS_ON_EXCEPTION": "makes a faulting GPU wait for a debugger",
    "CUDA_MEMCHECK_PATCH_MODULE": "patches modules for the memory checker",
    "PYTORCH_NO_CUDA_MEMORY_CACHING": "turns torch's CUDA caching allocator off (slow)",
}
_OFF = ("", "0", "false", "no", "off")
_GPU_NODE = r"nvidia(\d+)\Z"


class Gathered(Record):
    __slots__ = ("shm_bytes", "shm_error", "nodes", "other_nodes", "env", "visible")

    shm_bytes: int | None
    shm_error: str | None
    nodes: frozenset[str]  # NVIDIA character devices under the dev root (names)
    other_nodes: frozenset[str]  # NVIDIA entries that exist but are not character devices
    env: Mapping[str, str]  # the debugging variables that are set
    visible: str | None  # NVIDIA_VISIBLE_DEVICES

    def __init__(self, shm_bytes: int | None, shm_error: str | None, nodes: frozenset[str],
                 other_nodes: frozenset[str], env: Mapping[str, str], visible: str | None) -> None:
        self.shm_bytes = shm_bytes
        self.shm_error = shm_error
        self.nodes = nodes
        self.other_nodes = other_nodes
        self.env = env
        self.visible = visible


def gather(ctx: Context) -> Gathered:
    cfg = ctx.config.of(Settings)
    try:
        st = os.statvfs(cfg.shm_path)
        shm, shm_error = st.f_frsize * st.f_blocks, None
    except OSError as exc:
        shm, shm_error = None, os.strerror(exc.errno or 0)
    nodes: set[str] = set()
    other: set[str] = set()
    try:
        with os.scandir(cfg.dev_root) as it:
            for entry in it:
                if not entry.name.startswith("nvidia"):
                    continue
                try:
                    mode = entry.stat(follow_symlinks=False).st_mode
                except OSError:
                    continue
                (nodes if stat.S_ISCHR(mode) else other).add(entry.name)
    except OSError:
        pass
    env = {k: os.environ[k] for k in DEBUG_ENV if os.environ.get(k, "").strip().lower() not in _OFF}
    return Gathered(shm, shm_error, frozenset(nodes), frozenset(other), env,
                    os.environ.get("NVIDIA_VISIBLE_DEVICES"))


def requirements(config: Any) -> tuple[str, ...]:
    """Persistence mode comes from the nvml probe's facts: in startup, run after it."""
    if config.profile == "startup":
        return SPEC.requires
    return ()


class Problem(Record):
    __slots__ = ("status", "reason", "message")

    status: Status
    reason: str
    message: str

    def __init__(self, status: Status, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message


def _given_gpus(data: Gathered) -> bool:
    asked = data.visible is not None and not hw.none_requested(data.visible)
    return asked or bool(data.nodes | data.other_nodes)


def _node_problems(data: Gathered, ctx: Context) -> list[Problem]:
    import re

    expected = ctx.config.of(Settings).gpu_count
    if expected == 0 or not _given_gpus(data):
        return []
    missing = [n for n in ("nvidiactl", "nvidia-uvm") if n not in data.nodes]
    gpus = sorted(int(m[1]) for n in data.nodes if (m := re.match(_GPU_NODE, n)))
    if len(gpus) < expected:
        missing.append(f"nvidiaN for {expected - len(gpus)} more GPU(s) ({len(gpus)} of {expected})")
    if not missing:
        return []
    root = clean(ctx.config.of(Settings).dev_root, 60)
    shown = ", ".join(f"{root}/{m}" if not m.startswith("nvidiaN") else m for m in missing)
    odd = (f" ({', '.join(sorted(data.other_nodes)[:3])} exist but are not device nodes)" if data.other_nodes
           else "")
    return [Problem(Status.FAIL, "device-nodes", f"CUDA's device nodes are missing: {shown}{odd}: start the "
                    "container with --gpus all (NVIDIA Container Toolkit); for nvidia-uvm run "
                    "nvidia-modprobe -u -c=0 on the host, then recreate the container")]


def _persistence(ctx: Context) -> list[Problem]:
    if ctx.config.profile != "startup":
        return []
    nvml = ctx.results.get("nvml")
    gpus = nvml.facts.get("gpus") if nvml is not None else None
    off = [g.get("index") for g in gpus or () if isinstance(g, dict) and g.get("persistence") is False]
    if not off:
        return []
    shown = ", ".join(map(str, off))
    return [Problem(Status.WARN, "persistence-off", f"persistence mode is off on GPU {shown}: each NVML or "
                    "CUDA start re-initialises the GPU (slow probes, first-call latency): "
                    "nvidia-smi -pm 1 or nvidia-persistenced on the host")]


def judge(data: Gathered, ctx: Context) -> Result:
    import re

    problems = _node_problems(data, ctx)
    shm_mib = None if data.shm_bytes is None else data.shm_bytes // MIB
    own = ctx.config.of(Settings)
    limit = own.shm_min_mib
    path = clean(own.shm_path, 60)
    if shm_mib is None:
        problems.append(Problem(Status.WARN, "shm-missing", f"{path} cannot be measured ({data.shm_error}): "
                                "mount a tmpfs at /dev/shm (--shm-size, --ipc=host, or a memory-backed "
                                "emptyDir)"))
    elif shm_mib < limit:
        problems.append(Problem(Status.WARN, "shm-small", f"{path} is {shm_mib} MiB (below {limit} MiB): "
                                "NCCL and DataLoader workers fail; docker run --shm-size=8g or --ipc=host, "
                                "in Kubernetes an emptyDir with medium: Memory at /dev/shm"))
    for var in sorted(data.env):
        problems.append(Problem(Status.WARN, "cuda-debug-env", f"{var}={clean(data.env[var], 40)!r} is set: "
                                f"it {DEBUG_ENV[var]}; remove it for production"))
    problems.extend(_persistence(ctx))
    problems.sort(key=lambda p: p.status is not Status.FAIL)
    facts: dict[str, Any] = {"shm_mib": shm_mib, "nodes": sorted(data.nodes), "debug_env": sorted(data.env),
                             "problems": [{"status": p.status.value, "reason": p.reason} for p in problems]}
    kw: dict[str, Any] = {"observed": shm_mib, "unit": UNIT, "facts": facts}
    if problems:
        first = problems[0]
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        make = failed if first.status is Status.FAIL else warned
        return make(NAME, first.message + more, reason=first.reason, **kw)
    gpus = len([n for n in data.nodes if re.match(_GPU_NODE, n)])
    nodes = (f"device nodes present ({gpus} GPU(s))" if _given_gpus(data) and own.gpu_count
             else "no GPU given (device nodes not judged)")
    return passed(NAME, f"{path} {shm_mib} MiB; {nodes}; no CUDA-debugging variables", **kw)
