"""The framework layer: checkpoint, torch-cuda, model and nccl. Their declarations (``Spec``, causes,
settings; ``SPECS``) live here, so that a run reads them without importing a probe's module, which
is imported only to run it; so do the causes several share and those of the CUDA error table."""

from __future__ import annotations

from probes.hardware import DRIVER_MISMATCH  # 803: the hardware probes' driver/library version mismatch
from probes.spec import ALL_PROFILES, CHOICE, INTEGER, NUMBER, TEXT, Cause, Declared, Spec, cause, setting

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


# checkpoint's declaration
CHECKPOINTED = cause("checkpointed", "a process here holding a CUDA context is LOCKED or CHECKPOINTED "
                     "(readiness only; liveness passes, nothing latches; "
                     "torch-cuda, nccl and model start no GPU work)",
                     "none while it is paused on purpose: traffic resumes when it is restored "
                     "(`cuda-checkpoint --toggle --pid N`)", action="none", actor="tenant")
CHECKPOINT_FAILED = cause("checkpoint-failed", "the driver reports a process's checkpoint or restore FAILED",
                          "restore it again (`cuda-checkpoint --toggle --pid N`) or restart that process; "
                          "if that fails, restart the container", action="restart-app", actor="tenant")
CHECKPOINT_HANG = cause("query-hang", "the driver's state query gave no answer by the deadline "
                        "(it blocks while a peer process is locked)",
                        "check `cuda-checkpoint --get-state` on each process; wait for the restore",
                        action="retry", actor="tenant")
CHECKPOINT_NO_API = cause("no-checkpoint-api", "driver without `cuCheckpointProcessGetState` (before 555) "
                          "or no `libcuda.so.1`: not judged "
                          "(a pass, so the GPU probes that wait for this one still run)", "none", "pass",
                          action="none", actor="tenant")
CHECKPOINT_QUERY_FAILED = cause(
    "query-failed", "the child could not ask the driver (`cuInit` failed, or unreadable output)",
    "check `nvidia-smi`; details in the log", action="fix-config", actor="operator")

CHECKPOINT_SPEC = Spec(
    "checkpoint", layer="framework", module="probes.framework.checkpoint",
    toggle="ENABLE_CHECKPOINT_CHECK", timeout=5.0, profiles=("startup", "readiness"), requires=("nvml",),
    measurement="processes", default_on=False,
    about="no CUDA process here is locked or checkpointed by CUDA checkpoint (opt-in; driver 555+)",
    causes=(CHECKPOINTED, CHECKPOINT_FAILED, CHECKPOINT_HANG, CHECKPOINT_NO_API, CHECKPOINT_QUERY_FAILED),
)


# torch-cuda's declaration, and the HEALTHCHECK_TORCH_* settings model, nccl and jupyter-kernel read too
MIN_FREE = "HEALTHCHECK_TORCH_MIN_FREE_MIB"


class Torch(Declared):
    """The ``HEALTHCHECK_TORCH_*`` settings: torch-cuda declares them; torch-cuda, model, nccl,
    jupyter-kernel and deep.py read them (``ctx.config.of(Torch)``)."""

    torch_device: str = setting("HEALTHCHECK_TORCH_DEVICE", CHOICE, "cuda",
                                "`cuda` (every visible GPU) or `cpu` (CPU-only images)",
                                choices=("cuda", "cpu"))
    torch_python: str = setting("HEALTHCHECK_TORCH_PYTHON", TEXT, "python3",
                                "the interpreter that owns torch (the image's)",
                                shown_default="`python3` on `PATH`")
    torch_ttl: float = setting("HEALTHCHECK_TORCH_TTL", NUMBER, 300.0,
                               "seconds a passing torch-cuda result is reused by readiness", low=0,
                               high=86400, low_inclusive=True)
    torch_min_free_mib: int = setting(
        MIN_FREE, INTEGER, 1024, "free memory (MiB, from NVML) a GPU needs before torch-cuda, model or nccl "
        "start CUDA work on it; below it the GPU is not checked (a warning); `0` turns the check off", low=0,
        high=2**20, low_inclusive=True)


TORCH_NOT_EXECUTABLE = cause("interpreter-not-executable", "interpreter not executable",
                             "set `HEALTHCHECK_TORCH_PYTHON` to an executable Python that has torch",
                             action="fix-config", actor="tenant")
TORCH_MISSING = cause("torch-missing", "torch not installed in that interpreter", SET_PYTHON,
                      action="fix-config", actor="tenant")
TORCH_IMPORT_FAILED = cause(
    "torch-import-failed", "`import torch` fails (missing module or library; details in the log)",
    "reinstall torch in the image or fix its libraries", action="fix-config", actor="tenant")
TORCH_MEMORY_LIMIT = cause(
    "memory-limit", "the worker ran out of host memory: the address-space limit "
    "(RLIMIT_AS, `ulimit -v`) or the container's memory is too small for torch "
    "(MemoryError, \"failed to map segment from shared object\", \"Cannot allocate memory\", std::bad_alloc)",
    "raise the limit the message names: the container's memory, or its address space (`ulimit -v`)",
    action="fix-config", actor="tenant")
TORCH_CPU_ONLY = cause("cpu-only-build", "CPU-only torch build with `HEALTHCHECK_TORCH_DEVICE=cuda`",
                       "install a CUDA build of torch in the image, "
                       "or set `HEALTHCHECK_TORCH_DEVICE=cpu` for a CPU-only image",
                       action="fix-config", actor="tenant")
TORCH_COUNT_MISMATCH = cause("count-mismatch", "torch sees a different GPU count than NVML",
                             "a GPU is not usable by CUDA; check `nvidia-smi`, dmesg for Xid errors and "
                             "`NVIDIA_VISIBLE_DEVICES`", action="reset-gpu", actor="operator")
TORCH_WRONG_RESULT = cause(
    "wrong-result", "GPU result differs from the CPU reference", "silent data corruption; drain the node "
    "and run the GPU diagnostics (`dcgmi diag`)", action="service-hardware", actor="operator")
TORCH_LATCHED = cause("latched", "latch in force from an earlier fatal error (or a critical Xid seen by "
                      "`healthcheck serve`): no worker started, the hardware probes are skipped too",
                      "restart the container (a new PID 1 clears it)", action="restart-container",
                      actor="operator")
TORCH_DEADLINE = cause("deadline", "worker gave no result by the deadline (killed while in `import`: "
                       "a slow disk or a wedged driver), or another costly check held the lock until then",
                       "the GPU driver may be wedged: check `nvidia-smi` and dmesg for Xid errors; "
                       "raise `HEALTHCHECK_TIMEOUT` if the image is slow to import torch",
                       action="retry", actor="operator")
TORCH_STUCK = cause("stuck", "worker survived SIGKILL (uninterruptible sleep): the driver is wedged; "
                    "while it exists, later runs start no other worker and say so at once",
                    "check dmesg for Xid errors, the node may need a reboot", action="reboot-node",
                    actor="operator")
TORCH_LINGERED = cause("lingered", "worker printed its result but did not exit within 1.0 s "
                       "(a wrapper script as `HEALTHCHECK_TORCH_PYTHON` that keeps running, "
                       "or a hang at exit); nothing from it is cached or shared",
                       "point `HEALTHCHECK_TORCH_PYTHON` at the Python interpreter itself "
                       "and check dmesg for Xid errors", action="fix-config", actor="tenant")
TORCH_ERROR = cause("torch-error", "other torch error", LOGGED, action="fix-config", actor="tenant")

TORCH_SPEC = Spec(
    "torch-cuda", layer="framework", module="probes.framework.torch_cuda", toggle="ENABLE_TORCH_CHECK",
    timeout=45.0, profiles=ALL_PROFILES, requires=("nvidia-smi", "nvml"), measurement="devices",
    settings=Torch.SETTINGS,
    about="the image's own Python imports torch and runs a verified matmul on every GPU",
    causes=(INTERPRETER_NOT_FOUND, TORCH_NOT_EXECUTABLE, TORCH_MISSING, TORCH_IMPORT_FAILED,
            TORCH_MEMORY_LIMIT, TORCH_CPU_ONLY, TORCH_COUNT_MISMATCH, *CUDA_CAUSES, TORCH_WRONG_RESULT,
            TORCH_LATCHED, TORCH_DEADLINE, TORCH_STUCK, KILLED, TORCH_LINGERED, BAD_OUTPUT, WORKLOAD_MEMORY,
            HELD_BACK, TORCH_ERROR),
)


# model's declaration


def model_input(text: str) -> str:
    """HEALTHCHECK_MODEL_INPUT, read by the worker's own grammar when the settings are read; a
    ValueError says what is wrong and what is accepted."""
    from probes.framework import model_worker

    try:
        model_worker.parse_input(text)
    except model_worker.Failure as exc:
        raise ValueError(f"is not SHAPE:DTYPE[:zeros|seeded] ({exc}; accepted: e.g. 1x3x224x224:float16, "
                         f"dtypes {', '.join(model_worker.INPUT_DTYPES)})") from None
    return text


class ModelSettings(Declared):
    """The settings model reads (``ctx.config.of(ModelSettings)``); torch-cuda's are ``Torch``."""

    model_path: str | None = setting(
        "HEALTHCHECK_MODEL_PATH", TEXT, None, "the model file to load (TorchScript archive, safetensors, or "
        "a `torch.save` state dict); setting it turns the `model` probe on")
    model_input: str | None = setting(
        "HEALTHCHECK_MODEL_INPUT", TEXT, None, "one forward pass of a TorchScript model on this input, "
        "`SHAPE:DTYPE[:zeros|seeded]` (e.g. `1x3x224x224:float16`: at most 8 dimensions of ASCII digits, "
        "none 0; zero-filled unless `seeded`, which is `torch.randn(shape, "
        "generator=torch.Generator().manual_seed(20240601), dtype=torch.float64).to(dtype)`)",
        parse=model_input)
    model_expect: str | None = setting("HEALTHCHECK_MODEL_EXPECT", TEXT, None,
                                       "a tensor saved with `torch.save`: the forward pass's expected output")
    model_tolerance: float = setting("HEALTHCHECK_MODEL_TOLERANCE", NUMBER, 1e-3,
                                     "largest accepted max(abs(output - expected)) / max(abs(expected))",
                                     low=0, high=1)
    model_max_bytes: int | None = setting(
        "HEALTHCHECK_MODEL_MAX_BYTES", INTEGER, None, "the most bytes the model may take (besides the free "
        "GPU memory or available RAM, whichever is smaller)", low=0, high=2**62)
    model_ttl: float = setting("HEALTHCHECK_MODEL_TTL", NUMBER, 3600.0,
                               "seconds a passing model result is reused by readiness", low=0, high=86400,
                               low_inclusive=True)


def _model_fix(reason: str, what: str, remedy: str) -> Cause:
    """A cause the model's owner fixes: the file, or a setting."""
    return cause(reason, what, remedy, action="fix-config", actor="tenant")


MODEL_MISSING = _model_fix("model-missing", "`HEALTHCHECK_MODEL_PATH` is not set or names no file",
                           "mount the model or fix `HEALTHCHECK_MODEL_PATH`")
MODEL_UNREADABLE = _model_fix("model-unreadable", "the model file cannot be read (permissions, a directory; "
                              "a FIFO, socket or device is refused at once, never opened and waited on)",
                              "make it a regular file readable by the probe's user")
MODEL_UNSUPPORTED = _model_fix("unsupported-format", "not a TorchScript archive, safetensors file or "
                               "`torch.save` state dict (or a torch without `weights_only` loading)",
                               "save it with `torch.jit.save`, safetensors "
                               "or `torch.save(model.state_dict())`")
MODEL_UNSAFE = _model_fix("unsafe-pickle", "the file is a pickle that needs code to load: "
                          "refused, never executed",
                          "re-save only the weights (`torch.save(model.state_dict())` or safetensors)")
MODEL_CORRUPT = _model_fix("model-corrupt", "the file is damaged or truncated",
                           "copy the model file again and check its checksum")
MODEL_TOO_BIG = _model_fix("would-not-fit", "the model's bytes exceed the free GPU memory "
                           "(or available RAM, or `HEALTHCHECK_MODEL_MAX_BYTES`), "
                           "or every GPU's whole memory; said before loading",
                           "free memory, use a larger GPU, or raise the limit")
MODEL_MISMATCH = _model_fix("output-mismatch", "the forward pass differs from `HEALTHCHECK_MODEL_EXPECT` "
                            "beyond the tolerance (or in shape)", "check the GPU (torch-cuda, `dcgmi diag`) "
                            "and that the expected file fits this model and input")
MODEL_EXPECT = _model_fix("expect-unreadable", "the expected-output file is missing, not a regular file "
                          "(said before the model loads), too large for the memory, or not a saved tensor",
                          "save a tensor with `torch.save(tensor, path)`")
MODEL_BAD_INPUT = _model_fix("bad-input", "`HEALTHCHECK_MODEL_INPUT` is not `SHAPE:DTYPE[:zeros|seeded]`, "
                             "or the model is not TorchScript",
                             "fix the setting (a forward pass needs a TorchScript model)")
MODEL_FORWARD = _model_fix("forward-failed", "the forward pass raised", LOGGED)
MODEL_LOAD = _model_fix("load-failed", "loading raised another error", LOGGED)
MODEL_TORCH_MISSING = _model_fix("torch-missing", "torch cannot be imported, or CUDA is not available to it",
                                 "see the `torch-cuda` probe")
MODEL_DEADLINE = cause("deadline", "no result by the deadline (a large model on a slow disk, or a wedged "
                       "driver), or another costly check held the lock until then",
                       "raise `HEALTHCHECK_TIMEOUT` for large models; check `nvidia-smi` and dmesg",
                       action="retry", actor="tenant")

MODEL_SPEC = Spec(
    "model", layer="framework", module="probes.framework.model", toggle="ENABLE_MODEL_CHECK", timeout=60.0,
    profiles=("startup", "readiness"), requires=("checkpoint", "torch-cuda"), measurement="load",
    about="the image's model file loads onto the device without running pickled code (opt-in)",
    default_on=False, on_with="model_path", settings=ModelSettings.SETTINGS,
    causes=(MODEL_MISSING, MODEL_UNREADABLE, MODEL_UNSUPPORTED, MODEL_UNSAFE, MODEL_CORRUPT, MODEL_TOO_BIG,
            OOM, WORKLOAD_MEMORY, DEVICE_BUSY, CUDA_FATAL, CUDA_ERROR, MODEL_MISMATCH, MODEL_EXPECT,
            MODEL_BAD_INPUT, MODEL_FORWARD, MODEL_LOAD, HELD_BACK, INTERPRETER_NOT_FOUND, MODEL_TORCH_MISSING,
            MODEL_DEADLINE, KILLED, BAD_OUTPUT),
)


# nccl's declaration
NCCL_P2P_REMEDY = ("confirm with `NCCL_P2P_DISABLE=1` (if that passes, P2P is the problem), then fix the "
                   "host's IOMMU/ACS settings (ACS off on the PCIe switches, iommu=pt) or keep P2P disabled")


class NcclSettings(Declared):
    """The settings nccl reads (``ctx.config.of(NcclSettings)``); torch-cuda's are ``Torch``."""

    nccl_ttl: float = setting("HEALTHCHECK_NCCL_TTL", NUMBER, 300.0,
                              "seconds a passing nccl result is reused by readiness", low=0, high=86400,
                              low_inclusive=True)
    nccl_min_shm_mib: int = setting("HEALTHCHECK_NCCL_MIN_SHM_MIB", INTEGER, 256,
                                    "`/dev/shm` smaller than this (MiB) fails the nccl probe before it runs",
                                    low=0, high=2**30, low_inclusive=True)


NCCL_SHM_SMALL = cause("shm-too-small", "`/dev/shm` smaller than `HEALTHCHECK_NCCL_MIN_SHM_MIB` "
                       "(checked first), or NCCL warns it could not extend a shared memory segment "
                       "(no space left on device)", "start the container with `--shm-size=1g` "
                       "(or `--ipc=host`; Kubernetes: an emptyDir medium Memory)",
                       action="fix-config", actor="tenant")
NCCL_OWN_SHM = cause("nccl-shm", "NCCL could not open or attach its own shared memory segment "
                     "(\"No such file or directory\"): not the size of `/dev/shm`",
                     "NCCL lost a shared memory segment another of its threads had made "
                     "(a known regression of some NCCL releases, or something else clearing /dev/shm): "
                     "try another NCCL (torch) release, keep /dev/shm private to the container, "
                     "and confirm with `NCCL_SHM_DISABLE=1`", action="fix-config", actor="tenant")
NCCL_P2P = cause("p2p", "NCCL warns that peer-to-peer access is not supported or failed", NCCL_P2P_REMEDY,
                 action="fix-config", actor="operator")
NCCL_HANG = cause("nccl-hang", "the collective did not finish by the deadline "
                  "(P2P hanging with IOMMU/ACS on is the usual cause)", NCCL_P2P_REMEDY,
                  action="fix-config", actor="operator")
NO_NCCL = cause("no-nccl", "this torch build has no NCCL (a CPU-only or ROCm-less build)",
                "install a CUDA build of torch, or leave `ENABLE_NCCL_CHECK` off", action="fix-config",
                actor="tenant")
NCCL_WRONG_SUM = cause("wrong-result", "the all-reduce gave a wrong sum on some GPU",
                       "drain the node; run `nccl-tests` and `dcgmi diag`", action="service-hardware",
                       actor="operator")
NCCL_ERROR = cause(
    "nccl-error", "the collective raised another NCCL or CUDA error (NCCL's warning is in the message)",
    "read NCCL's warning; rerun with `NCCL_DEBUG=INFO` by hand", action="fix-config", actor="tenant")
NCCL_ON_CPU = cause("device-cpu", "`HEALTHCHECK_TORCH_DEVICE=cpu`: NCCL is not judged", "none", "skip",
                    action="none", actor="tenant")
NCCL_DEADLINE = cause("deadline", "no result by the deadline before the collective started, or another "
                      "costly check held the lock until then",
                      "check `nvidia-smi`; raise `HEALTHCHECK_TIMEOUT` if torch is slow to import",
                      action="retry", actor="operator")

NCCL_SPEC = Spec(
    "nccl", layer="framework", module="probes.framework.nccl", toggle="ENABLE_NCCL_CHECK", timeout=45.0,
    profiles=("startup", "readiness"), requires=("checkpoint", "torch-cuda"), measurement="allreduce",
    default_on=False, about="an NCCL all-reduce across every visible GPU gives the exact sum (opt-in)",
    settings=NcclSettings.SETTINGS,
    causes=(NCCL_SHM_SMALL, NCCL_OWN_SHM, NCCL_P2P, NCCL_HANG, NO_NCCL, NCCL_WRONG_SUM, NCCL_ERROR,
            CUDA_UNAVAILABLE, CUDA_FATAL, CUDA_ERROR, OOM, DEVICE_BUSY, WORKLOAD_MEMORY, NCCL_ON_CPU,
            HELD_BACK, INTERPRETER_NOT_FOUND, NCCL_DEADLINE, KILLED, BAD_OUTPUT),
)

# The layer's probes, in the order a run lists them.
SPECS = (CHECKPOINT_SPEC, TORCH_SPEC, MODEL_SPEC, NCCL_SPEC)
