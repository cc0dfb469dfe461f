"""The probes, their layers, toggles, profiles and default deadlines.

Each probe lives in its own module, imported only when it runs. A probe module
defines ``NAME``, ``MEASUREMENT`` (the JSON key is ``NAME:MEASUREMENT``),
``gather(ctx)`` (the only part that touches hardware, subprocesses or sockets;
it must return by ``ctx.deadline``) and ``judge(data, ctx) -> Result`` (pure).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import NamedTuple

ALL_PROFILES = ("startup", "readiness", "liveness")
LAYERS = ("hardware", "framework", "services")


class Spec(NamedTuple):
    name: str
    layer: str
    module: str
    toggle: str  # the ENABLE_* variable that switches it on or off
    timeout: float  # default per-probe deadline in seconds (capped by the run's)
    profiles: tuple[str, ...]
    # Probes whose failure skips this one. For torch-cuda the hardware layer is
    # only a prerequisite when the device is cuda (see requirements()).
    requires: tuple[str, ...] = ()

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)


PROBES: tuple[Spec, ...] = (
    Spec("nvidia-smi", "hardware", "probes.hardware.nvidia_smi", "ENABLE_GPU_CHECK", 10.0,
         ("startup", "readiness")),
    Spec("nvml", "hardware", "probes.hardware.nvml", "ENABLE_GPU_CHECK", 5.0,
         ("startup", "readiness")),
    # In liveness, torch-cuda only reads the sticky CUDA-fatal latch: no worker, no GPU.
    Spec("torch-cuda", "framework", "probes.framework.torch_cuda", "ENABLE_TORCH_CHECK", 45.0,
         ALL_PROFILES, requires=("nvidia-smi", "nvml")),
    Spec("jupyter", "services", "probes.services.jupyter", "ENABLE_JUPYTER_CHECK", 3.0,
         ALL_PROFILES),
    Spec("ssh", "services", "probes.services.ssh", "ENABLE_SSH_CHECK", 3.0, ALL_PROFILES),
)

BY_NAME = {s.name: s for s in PROBES}
NAMES = tuple(BY_NAME)
TOGGLES = ("ENABLE_GPU_CHECK", "ENABLE_TORCH_CHECK", "ENABLE_JUPYTER_CHECK", "ENABLE_SSH_CHECK")


def requirements(spec: Spec, torch_device: str) -> tuple[str, ...]:
    if spec.name == "torch-cuda" and torch_device == "cpu":
        return ()
    return spec.requires
