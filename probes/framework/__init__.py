"""The framework layer: torch-cuda, model, nccl and checkpoint. The causes several of them report,
and those the CUDA error table (cuda_errors.py) gives, are declared here once."""

from __future__ import annotations

from probes.hardware import DRIVER_MISMATCH
from probes.spec import cause

OWN_REMEDY = "the error's own remedy, in the message (see \"CUDA errors\")"
LOGGED = "details in the log"
SET_PYTHON = ("set `HEALTHCHECK_TORCH_PYTHON` to the image's Python that has torch "
              "(e.g. `/opt/conda/bin/python`)")
INTERPRETER_NOT_FOUND = cause("interpreter-not-found", "the `HEALTHCHECK_TORCH_PYTHON` interpreter is not "
                              "found or cannot be run", SET_PYTHON, action="fix-config", actor="tenant")
BAD_OUTPUT = cause("bad-output", "worker output unreadable (no or several result lines, not strict JSON, "
                   "a number no float can hold such as 1e999, a field of the wrong type)",
                   "the interpreter is not a working Python with torch; check `HEALTHCHECK_TORCH_PYTHON`",
                   action="fix-config", actor="tenant")
KILLED = cause("killed", "worker killed by a signal",
               "check the container's memory limit (SIGKILL: out of memory?), "
               "dmesg and the torch install (SIGSEGV, SIGBUS, SIGABRT: a crash in torch or the driver)",
               action="fix-config", actor="tenant")
WORKLOAD_MEMORY = cause("workload-memory", "NVML says a GPU has less free memory than the probe needs "
                        "(`HEALTHCHECK_TORCH_MIN_FREE_MIB`, plus the model's size for model, "
                        "plus 256 MiB of NCCL's buffers for nccl): not checked, nothing started there; "
                        "the other GPUs are checked", "none: the workload holds the memory; not a fault",
                        "warn", action="none", actor="tenant")
HELD_BACK = cause("checkpointed", "a CUDA process here is locked or checkpointed "
                  "(the checkpoint probe, or its marker from an earlier run): no GPU work is started",
                  "none: it runs again once the process is restored", "skip", action="none", actor="tenant")

# The causes of CUDA errors (cuda_errors.py maps each class of its table, and some rows, to one).
CUDA_FATAL = cause("cuda-fatal", "sticky CUDA error, one NVIDIA's runtime documentation says leaves the "
                   "process unusable (illegal address, launch failure or timeout, device-side assert, "
                   "misaligned address, ...), or an uncorrectable ECC or NVLink error; "
                   "latches (see \"CUDA errors\")", "restart the container; check dmesg for Xid errors "
                   "(each error's own remedy is in the message)", action="restart-container",
                   actor="operator")
CUDA_ERROR = cause("cuda-error", "another CUDA error (no kernel image for this GPU, invalid device ordinal, "
                   "invalid configuration, a cuBLAS/cuDNN status, ...): fails, never latches",
                   OWN_REMEDY, action="fix-config", actor="tenant")
OOM = cause("oom", "out of memory for the probe's own context, tensors or buffers "
            "(CUDA's, or cuBLAS's or cuDNN's `*_ALLOC_FAILED`)",
            "the workload is using the memory; not checked, not a fault", "warn", action="none",
            actor="tenant")
DEVICE_BUSY = cause("device-busy", "GPU held by the workload in EXCLUSIVE_PROCESS mode "
                    "(\"busy or unavailable\"); the message names the holding PID",
                    "the workload holds the GPU, so the probe cannot open a context there; not a fault",
                    "warn", action="none", actor="tenant")
MPS_BUSY = cause("mps-busy", "GPU shared through MPS: the probe cannot open its own context; the message "
                 "names the MPS clients", "the GPU is shared through MPS and the probe cannot open its own "
                 "context there; not checked, not a fault", "warn", action="none", actor="tenant")
CUDA_UNAVAILABLE = cause("cuda-unavailable", "`torch.cuda.is_available()` false / no GPU visible",
                         "start the container with `--gpus all` (NVIDIA Container Toolkit) and check the "
                         "host driver with `nvidia-smi`", action="fix-config", actor="tenant")
DRIVER_TOO_OLD = cause("driver-too-old", "the driver's CUDA version (NVML `nvmlSystemGetCudaDriverVersion`, "
                       "or torch's own message) older than `torch.version.cuda`; the message gives both",
                       "install a newer NVIDIA driver on the host, or the CUDA forward-compatibility package "
                       "(`cuda-compat`) on data-center GPUs, or use an image built for an older CUDA",
                       action="fix-config", actor="operator")
FABRIC_MANAGER = cause("fabric-manager", "CUDA error 802 at start (system not yet initialized): NVIDIA "
                       "Fabric Manager is not running on an NVSwitch system",
                       "start `nvidia-fabricmanager` on the host (the driver's version) and wait for the "
                       "fabric state Completed", action="fix-config", actor="operator")
# The same mismatch the hardware probes report (NVML's driver/library version mismatch): the driver's
# user-space library no longer matches the loaded kernel module.
FORWARD_COMPAT = cause("forward-compat", "CUDA error 804 at start: the forward-compatibility package "
                       "(`cuda-compat`) on a GPU that does not support it", "remove `cuda-compat` from the "
                       "image's library path, or upgrade the host driver", action="fix-config",
                       actor="tenant")
CUDA_UNKNOWN = cause("cuda-unknown", "CUDA's unknown error (999)", "check `nvidia-smi` and dmesg for Xid "
                     "errors; in a container after a host `systemctl daemon-reload`, recreate the container",
                     action="restart-container", actor="operator")
CUDA_INIT = cause("cuda-init", "CUDA cannot start for another reason (initialization error, a stub libcuda, "
                  "no vGPU license, MPS daemon unreachable, ...)", OWN_REMEDY, action="fix-config",
                  actor="operator")
CUDA_CAUSES = (CUDA_UNAVAILABLE, DRIVER_TOO_OLD, DEVICE_BUSY, MPS_BUSY, OOM, CUDA_FATAL, CUDA_ERROR,
               FABRIC_MANAGER, DRIVER_MISMATCH, FORWARD_COMPAT, CUDA_UNKNOWN, CUDA_INIT)
