"""Layered health probes for PyTorch/CUDA container images.

The package never imports torch in its own process: the framework probe runs a
worker in the image's interpreter. Heavy modules (psutil, pynvml, http.client)
are imported only by the probes that run.
"""

__version__ = "0.1.0"
