"""The hardware layer: nvidia-smi, NVML and the container's runtime, one module per probe
(docs/architecture.md, "The rooms")."""
