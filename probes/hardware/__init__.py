"""The hardware layer: nvidia-smi, NVML and the container's runtime (docs/architecture.md)."""
