"""runtime probe: the container's limits that break CUDA work without a GPU fault, without a GPU call:
``/dev/shm``'s size, CUDA's device nodes, CUDA-debugging variables, and in startup persistence mode
from the nvml probe's facts (docs/probes.md, "The runtime probe"). Command-line equivalent::

    df -h /dev/shm; ls -l /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia[0-9]*; env | grep ^CUDA_
"""

from __future__ import annotations

import os
import stat

from probes.context import Context
from probes.hardware import common as hw
from probes.record import Record
from probes.result import Result, passed
from probes.spec import INTEGER, TEXT, Spec, cause, setting
from probes.untrusted import clean

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

NAME = "runtime"

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


class Settings(hw.Expected):
    shm_path: str = setting("HEALTHCHECK_SHM_PATH", TEXT, "/dev/shm",  # noqa: S108  (measured, not written)
                            "the shared-memory mount whose size is judged")
    shm_min_mib: int = setting("HEALTHCHECK_SHM_MIN_MIB", INTEGER, 1024, "`/dev/shm` below this many MiB "
                               "warns (NCCL, DataLoader workers)", low=0, high=1 << 24, low_inclusive=True)
    dev_root: str = setting("HEALTHCHECK_DEV_ROOT", TEXT, "/dev",
                            "where the NVIDIA device nodes are looked for")


SHM_SMALL = cause("shm-small", "`/dev/shm` smaller than `HEALTHCHECK_SHM_MIN_MIB` (Docker's default is 64 "
                  "MiB): NCCL fails with \"unhandled system error\", DataLoader workers die",
                  "`docker run --shm-size=8g` or `--ipc=host`, in Kubernetes an `emptyDir` with "
                  "`medium: Memory` at `/dev/shm`", "warn", action="fix-config", actor="tenant")
SHM_MISSING = cause("shm-missing", "`/dev/shm` cannot be measured",
                    "mount a tmpfs at `/dev/shm` (`--shm-size`, `--ipc=host`, or a memory-backed `emptyDir`)",
                    "warn", action="fix-config", actor="tenant")
DEVICE_NODES = cause("device-nodes", "`/dev/nvidiactl`, `/dev/nvidia-uvm` or a `/dev/nvidiaN` per expected "
                     "GPU is missing although the container was given GPUs", f"{hw.TOOLKIT} (NVIDIA "
                     "Container Toolkit); for `nvidia-uvm` run `nvidia-modprobe -u -c=0` on the host, then "
                     "recreate the container", action="restart-container", actor="operator")
DEBUG_ENV_SET = cause("cuda-debug-env", "a variable that changes CUDA's behaviour for debugging is set "
                      "(`CUDA_LAUNCH_BLOCKING`, `CUDA_INJECTION64_PATH`, "
                      "`CUDA_ENABLE_COREDUMP_ON_EXCEPTION`, ...)", "remove it from the image or deployment "
                      "for production", "warn", action="fix-config", actor="tenant")
PERSISTENCE_OFF = cause("persistence-off", "persistence mode off (startup only, from the nvml probe): each "
                        "NVML/CUDA start re-initialises the GPU", "`nvidia-smi -pm 1` or run "
                        "`nvidia-persistenced` on the host", "warn", action="fix-config", actor="operator")

SPEC = Spec(
    NAME, layer="hardware", module=__name__, toggle="ENABLE_RUNTIME_CHECK", timeout=2.0,
    profiles=("startup", "readiness"), requires=("nvml",), measurement="shm",
    about="container runtime limits: `/dev/shm` size, CUDA's device nodes, CUDA-debugging variables, "
          "persistence mode (startup)", settings=Settings.SETTINGS,
    causes=(SHM_SMALL, SHM_MISSING, DEVICE_NODES, DEBUG_ENV_SET, PERSISTENCE_OFF),
)


class Gathered(Record):
    shm_bytes: int | None
    shm_error: str | None
    nodes: frozenset[str]  # NVIDIA character devices under the dev root (names)
    other_nodes: frozenset[str]  # NVIDIA entries that exist but are not character devices
    env: Mapping[str, str]  # the debugging variables that are set
    visible: str | None  # NVIDIA_VISIBLE_DEVICES


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
            for entry in (e for e in it if e.name.startswith("nvidia")):
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
    """In startup, after the nvml probe: persistence mode comes from its facts."""
    return SPEC.requires if config.profile_rules.once else ()


def judge(data: Gathered, ctx: Context) -> Result:
    import re

    own = ctx.config.of(Settings)
    asked = data.visible is not None and not hw.none_requested(data.visible)
    given = asked or bool(data.nodes | data.other_nodes)
    gpus = len([n for n in data.nodes if re.fullmatch(r"nvidia\d+", n)])
    root, path = clean(own.dev_root, 60), clean(own.shm_path, 60)
    missing = [f"{root}/{n}" for n in ("nvidiactl", "nvidia-uvm") if n not in data.nodes]
    if gpus < own.gpu_count:
        missing.append(f"nvidiaN for {own.gpu_count - gpus} more GPU(s) ({gpus} of {own.gpu_count})")
    odd = (f" ({', '.join(sorted(data.other_nodes)[:3])} exist but are not device nodes)"
           if data.other_nodes else "")
    shm_mib = None if data.shm_bytes is None else data.shm_bytes >> 20
    seen = hw.seen(ctx.results) if ctx.config.profile_rules.once else None
    off = [str(g.index) for g in seen.gpus if g.persistence is False] if seen is not None else []
    problems = [hw.Problem(c, detail) for bad, c, detail in [
        # The device nodes are judged only when the container was given GPUs.
        (own.gpu_count and given and missing, DEVICE_NODES,
         f"CUDA's device nodes are missing: {', '.join(missing)}{odd}"),
        (shm_mib is None, SHM_MISSING, f"{path} cannot be measured ({data.shm_error})"),
        (shm_mib is not None and shm_mib < own.shm_min_mib, SHM_SMALL,
         f"{path} is {shm_mib} MiB (below {own.shm_min_mib} MiB): NCCL and DataLoader workers fail"),
        *[(True, DEBUG_ENV_SET, f"{var}={clean(data.env[var], 40)!r} is set: it {DEBUG_ENV[var]}")
          for var in sorted(data.env)],
        (off, PERSISTENCE_OFF, f"persistence mode is off on GPU {', '.join(off)}: each NVML or CUDA start "
         "re-initialises the GPU (slow probes, first-call latency)")] if bad]
    facts: dict[str, Any] = {"shm_mib": shm_mib, "nodes": sorted(data.nodes), "debug_env": sorted(data.env)}
    kw: dict[str, Any] = {"observed": shm_mib, "unit": "MiB", "facts": facts}
    if found := hw.worst(NAME, problems, **kw):
        return found
    nodes = (f"device nodes present ({gpus} GPU(s))" if given and own.gpu_count
             else "no GPU given (device nodes not judged)")
    return passed(NAME, f"{path} {shm_mib} MiB; {nodes}; no CUDA-debugging variables", **kw)
