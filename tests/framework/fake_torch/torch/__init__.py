"""A tiny stand-in for torch, the boundary the torch-cuda worker talks to.

Put its parent folder first on PYTHONPATH and pick a behaviour with FAKE_TORCH_MODE:
ok, wrong, nan, busy, busy-one, oom, fatal, fatal-init, old-driver, unavailable, cpu-build,
missing-dep, hang-import, ignore-term, segv, print-noise, control-chars (NUL, ESC, BEL and
a newline in the version and the device names). FAKE_TORCH_COUNT sets the
number of GPUs (default 1; CUDA_VISIBLE_DEVICES lowers it to the number of entries listed there),
FAKE_TORCH_SLEEP delays the import (seconds), after creating the file FAKE_TORCH_READY names if set
(a test then knows the worker is in its import, past everything it writes before it).

A "tensor" is a single number standing for a whole matrix: the worker's arithmetic
(matmul, difference, abs, max, item) works on it, so a mode can make the GPU result
differ from the reference by a chosen amount.
"""

import os
import signal
import sys
import time
import types
import warnings

MODE = os.environ.get("FAKE_TORCH_MODE", "ok")
COUNT = int(os.environ.get("FAKE_TORCH_COUNT", "1"))
if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:  # as CUDA: only the devices listed there
    COUNT = min(COUNT, len([d for d in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]))
if os.environ.get("FAKE_TORCH_READY"):
    open(os.environ["FAKE_TORCH_READY"], "w").close()
time.sleep(float(os.environ.get("FAKE_TORCH_SLEEP", "0")))

if MODE == "hang-import":
    time.sleep(3600)
if MODE == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(3600)
if MODE == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)
if MODE == "missing-dep":
    raise ModuleNotFoundError("No module named 'numpy'", name="numpy")
if MODE == "print-noise":
    print("HEALTHCHECK-TORCH-RESULT {\"forged\": true}")  # must not reach the result channel

__version__ = "2.3.0+fake\x00\x1b[31mred\x07\nnext" if MODE == "control-chars" else "2.3.0+fake"
NAME = "Fake\x00GPU\x1b]0;owned\x07\n{}" if MODE == "control-chars" else "Fake GPU {}"
version = types.SimpleNamespace(cuda=None if MODE == "cpu-build" else "12.1")
float32, float64 = "float32", "float64"


class OutOfMemoryError(RuntimeError):
    pass


class device:
    def __init__(self, type, index=None):
        self.type, self.index = type, index


class Generator:
    def manual_seed(self, seed):
        return self


def _fail_on(dev):
    if dev.type != "cuda":
        return
    if MODE == "busy" or (MODE == "busy-one" and dev.index == 1):
        raise RuntimeError("CUDA error: CUDA-capable device(s) is/are busy or unavailable\n"
                           "CUDA kernel errors might be asynchronously reported")
    if MODE == "oom":
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 MiB. GPU 0 has a total "
                               "capacity of 79.10 GiB of which 1.56 MiB is free.")


class Tensor:
    def __init__(self, value, dev=None):
        self.value = float(value)
        self.device = dev or device("cpu")

    def to(self, dev):
        _fail_on(dev)
        return Tensor(self.value, dev)

    def cpu(self):
        return Tensor(self.value)

    def double(self):
        return Tensor(self.value, self.device)

    def abs(self):
        return Tensor(abs(self.value), self.device)

    def max(self):
        return self

    def item(self):
        return self.value

    def __sub__(self, other):
        return Tensor(self.value - other.value, self.device)


def randn(*shape, generator=None, dtype=None):
    return Tensor(1.0)


def matmul(a, b):
    value = 100.0 * a.value * b.value
    if a.device.type == "cuda":
        value += 5.0 if MODE == "wrong" else float("nan") if MODE == "nan" else 1e-5
    return Tensor(value, a.device)


class _Cuda(types.SimpleNamespace):
    pass


def _available():
    if MODE in ("old-driver", "unavailable", "cpu-build", "fatal-init"):
        warnings.warn("CUDA initialization: something is wrong (see init())", UserWarning, stacklevel=2)
        return False
    return True


def _init():
    if MODE == "cpu-build":
        raise AssertionError("Torch not compiled with CUDA enabled")
    if MODE == "old-driver":
        raise RuntimeError("The NVIDIA driver on your system is too old (found version 11040). Please "
                           "update your GPU driver by downloading and installing a new version")
    if MODE == "unavailable":
        raise RuntimeError("Found no NVIDIA driver on your system. Please check that you have an NVIDIA "
                           "GPU and installed a driver from http://www.nvidia.com/Download/index.aspx")
    if MODE == "fatal-init":
        raise RuntimeError("CUDA unknown error - this may be due to an incorrectly set up environment")


def _synchronize(dev=None):
    if MODE == "fatal":
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors "
                           "might be asynchronously reported at some other API call")


def _props(index):
    return types.SimpleNamespace(uuid=f"58b5a2e2-0000-0000-0000-00000000000{index}")


cuda = _Cuda(
    is_available=_available, init=_init, device_count=lambda: COUNT,
    get_device_name=NAME.format, get_device_properties=_props,
    synchronize=_synchronize, mem_get_info=lambda dev=None: (70 * 2**30, 80 * 2**30),
    OutOfMemoryError=OutOfMemoryError,
)
backends = types.SimpleNamespace(
    cuda=types.SimpleNamespace(is_built=lambda: MODE != "cpu-build",
                               matmul=types.SimpleNamespace(allow_tf32=True)),
    cudnn=types.SimpleNamespace(allow_tf32=True),
)
sys.modules[__name__ + ".cuda"] = cuda  # type: ignore[assignment]
