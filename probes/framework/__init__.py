"""The framework layer: PyTorch and CUDA in the image's own interpreter, one module per probe; the
deep checks' shared machinery is deep.py, the workers run by file path (docs/architecture.md)."""
