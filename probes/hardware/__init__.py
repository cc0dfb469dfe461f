"""The hardware layer: nvidia-smi, NVML and the container's runtime, one module per probe
(docs/architecture.md, "The rooms")."""

# Read through the package by code outside the layer (probes/services/jupyter_kernel.py,
# tests/core/test_config.py) until it reads probes.hardware.common.
from probes.hardware.common import Expected, seen

__all__ = ["Expected", "seen"]
