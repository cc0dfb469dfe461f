"""The framework layer: PyTorch and CUDA in the image's own interpreter (docs/architecture.md)."""
