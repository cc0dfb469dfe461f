"""Layered health probes for PyTorch/CUDA container images (docs/architecture.md)."""

__version__ = "0.1.0"
