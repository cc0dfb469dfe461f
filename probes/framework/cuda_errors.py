"""The CUDA runtime's errors, as data: sticky (the GPU unusable), "could not check", the environment
at start, or plain failures; the source, the classes and our decisions: docs/probes.md ("CUDA errors")."""

from __future__ import annotations

import re

from probes import result
from probes.framework import deep
from probes.hardware.common import DRIVER_MISMATCH
from probes.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from probes.result import Result
    from probes.spec import Cause

STICKY, NOT_CHECKED, ENVIRONMENT, OTHER = "sticky", "could-not-check", "environment", "other"

# Remedies shared by many rows.
PROGRAM = ("a CUDA call failed without harming the GPU: an error in the code that made it (details in "
            "the log); not sticky, nothing latched")
_STICKY = ("the CUDA context is unusable until the process ends; check dmesg for Xid errors and run the GPU "
           "diagnostics (dcgmi diag) if it repeats")
_JIT = ("the driver could not compile the code's PTX for this GPU: update the host driver to one at least as "
        "new as the CUDA that built the code, or install a build with kernels for this GPU")
_IMAGE = ("this build has no kernels for the GPU's architecture (compute capability): install a torch built "
          "for it (new GPUs need a newer CUDA build, e.g. cu128 for Blackwell)")
_MPS = ("the GPU is shared through MPS and the MPS server cannot take this client now: none, not a fault; "
        "check the MPS server if it lasts")
_INIT = ("CUDA could not start: check the host driver with nvidia-smi and the container's /dev/nvidia* "
         "devices (start it with --gpus all); a process forked after CUDA started gets this too")


class CudaError(Record):
    code: int | None  # cudaError_t; None for a cuBLAS/cuDNN status or a torch wording
    name: str  # cudaErrorIllegalAddress, or CUBLAS_STATUS_ALLOC_FAILED
    text: str  # what cudaGetErrorString returns ("" where no text is known)
    category: str  # STICKY, NOT_CHECKED, ENVIRONMENT or OTHER
    cause: Cause  # the catalog's cause (probes/framework/deep.py): reason, status, who acts and how
    remedy: str  # this error's own remedy, said in the message instead of the cause's
    aliases: tuple[str, ...] = ()  # other wordings and the driver API's name

    @property
    def reason(self) -> str:
        return self.cause.reason

    @property
    def label(self) -> str:
        """``cudaErrorIllegalAddress 700: an illegal memory access ...``"""
        number = f" {self.code}" if self.code is not None else ""
        return f"{self.name}{number}: {self.text}" if self.text else f"{self.name}{number}"

    def verdict(self, name: str, detail: str, cause: Cause | None = None, **kw: Any) -> Result:
        """Its cause's verdict (or ``cause``'s, a probe that says less) with this error's own remedy."""
        return result.verdict(name, (cause or self.cause)._replace(remedy=self.remedy), detail, **kw)


# Each class's cause and remedy unless a row says (a could-not-check row always names its own).
_CAUSES = {STICKY: deep.CUDA_FATAL, ENVIRONMENT: deep.CUDA_INIT, OTHER: deep.CUDA_ERROR}
_REMEDIES = {STICKY: _STICKY, ENVIRONMENT: _INIT, OTHER: PROGRAM}


def _e(code: int, name: str, text: str, category: str = OTHER, cause: Cause | None = None, remedy: str = "",
       aliases: tuple[str, ...] = ()) -> CudaError:
    return CudaError(code, "cudaError" + name, text, category, cause or _CAUSES[category],
                     remedy or (cause.remedy if cause else _REMEDIES[category]), aliases)


# enum cudaError (cudaSuccess, 0, is no error and not listed).
TABLE: tuple[CudaError, ...] = (
    _e(1, "InvalidValue", "invalid argument", aliases=("CUDA_ERROR_INVALID_VALUE",)),
    _e(2, "MemoryAllocation", "out of memory", NOT_CHECKED, deep.OOM,
       "none: the workload uses the GPU's memory; not checked, not a fault",
       ("CUDA_ERROR_OUT_OF_MEMORY", "CUDA out of memory")),
    _e(3, "InitializationError", "initialization error", ENVIRONMENT,
       aliases=("CUDA_ERROR_NOT_INITIALIZED", "CUDA driver initialization failed")),
    _e(4, "CudartUnloading", "driver shutting down", aliases=("CUDA_ERROR_DEINITIALIZED",)),
    _e(5, "ProfilerDisabled", "profiler disabled while using external profiling tool"),
    _e(6, "ProfilerNotInitialized", "profiler not initialized: call cudaProfilerInitialize()"),
    _e(7, "ProfilerAlreadyStarted", "profiler already started"),
    _e(8, "ProfilerAlreadyStopped", "profiler already stopped"),
    _e(9, "InvalidConfiguration", "invalid configuration argument",
       remedy="a kernel launch asked for more threads, blocks or shared memory than the GPU allows: an error "
              "in the code that launched it, not the GPU; nothing latched"),
    _e(12, "InvalidPitchValue", "invalid pitch argument"),
    _e(13, "InvalidSymbol", "invalid device symbol"),
    _e(16, "InvalidHostPointer", "invalid host pointer"),
    _e(17, "InvalidDevicePointer", "invalid device pointer"),
    _e(18, "InvalidTexture", "invalid texture reference"),
    _e(19, "InvalidTextureBinding", "texture is not bound to a pointer"),
    _e(20, "InvalidChannelDescriptor", "invalid channel descriptor"),
    _e(21, "InvalidMemcpyDirection", "invalid copy direction for memcpy"),
    _e(22, "AddressOfConstant", "invalid address of constant"),
    _e(23, "TextureFetchFailed", "fetch from texture failed"),
    _e(24, "TextureNotBound", "cannot fetch from a texture that is not bound"),
    _e(25, "SynchronizationError", "incorrect use of __syncthreads()"),
    _e(26, "InvalidFilterSetting", "linear filtering not supported for non-float type"),
    _e(27, "InvalidNormSetting", "read as normalized float not supported for 32-bit non float type"),
    _e(28, "MixedDeviceExecution", "device emulation mode and device execution mode cannot be mixed"),
    _e(31, "NotYetImplemented", "feature not yet implemented"),
    _e(32, "MemoryValueTooLarge", "memory size or pointer value too large to fit in 32 bit"),
    _e(34, "StubLibrary", "CUDA driver is a stub library", ENVIRONMENT,
       remedy="the CUDA driver library loaded is the toolkit's stub (a stubs/ directory on LD_LIBRARY_PATH): "
              "remove it from the path; the NVIDIA Container Toolkit mounts the real libcuda.so.1",
       aliases=("CUDA_ERROR_STUB_LIBRARY",)),
    _e(35, "InsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version", ENVIRONMENT,
       deep.DRIVER_TOO_OLD, aliases=("The NVIDIA driver on your system is too old",)),
    _e(36, "CallRequiresNewerDriver", "API call is not supported in the installed CUDA driver", ENVIRONMENT,
       deep.DRIVER_TOO_OLD, "install a newer host NVIDIA driver"),
    _e(37, "InvalidSurface", "invalid surface reference"),
    _e(43, "DuplicateVariableName", "duplicate global variable looked up by string name"),
    _e(44, "DuplicateTextureName", "duplicate texture looked up by string name"),
    _e(45, "DuplicateSurfaceName", "duplicate surface looked up by string name"),
    _e(46, "DevicesUnavailable", "CUDA-capable device(s) is/are busy or unavailable", NOT_CHECKED,
       deep.DEVICE_BUSY, "none: the workload holds the GPU (exclusive or prohibited compute mode, or a full "
       "GPU); not a fault",
       ("all CUDA-capable devices are busy or unavailable", "CUDA_ERROR_DEVICE_UNAVAILABLE")),
    _e(49, "IncompatibleDriverContext", "incompatible driver context"),
    _e(52, "MissingConfiguration", "__global__ function call is not configured"),
    _e(53, "PriorLaunchFailure", "unspecified launch failure in prior launch"),
    _e(65, "LaunchMaxDepthExceeded", "launch would exceed maximum depth of nested launches"),
    _e(66, "LaunchFileScopedTex", "launch failed because kernel uses unsupported, file-scoped textures "
                                  "(texture objects are supported)"),
    _e(67, "LaunchFileScopedSurf", "launch failed because kernel uses unsupported, file-scoped surfaces "
                                   "(surface objects are supported)"),
    _e(68, "SyncDepthExceeded", "cudaDeviceSynchronize failed because caller's grid depth exceeds "
                                "cudaLimitDevRuntimeSyncDepth"),
    _e(69, "LaunchPendingCountExceeded", "launch failed because launch would exceed "
                                         "cudaLimitDevRuntimePendingLaunchCount"),
    _e(98, "InvalidDeviceFunction", "invalid device function", remedy=_IMAGE),
    _e(100, "NoDevice", "no CUDA-capable device is detected", ENVIRONMENT, deep.CUDA_UNAVAILABLE,
       "no GPU is visible: start the container with --gpus all (NVIDIA Container Toolkit) and check the host "
       "driver with nvidia-smi", ("CUDA_ERROR_NO_DEVICE", "No CUDA GPUs are available",
                                  "Found no NVIDIA driver on your system")),
    _e(101, "InvalidDevice", "invalid device ordinal",
       remedy="the code asked for a GPU that is not visible: check CUDA_VISIBLE_DEVICES and the device "
              "index; not a GPU fault, nothing latched", aliases=("CUDA_ERROR_INVALID_DEVICE",)),
    _e(102, "DeviceNotLicensed", "device doesn't have valid Grid license", ENVIRONMENT,
       remedy="the vGPU has no valid license: check the license server and the guest's licensing settings"),
    _e(103, "SoftwareValidityNotEstablished", "integrity checks failed", ENVIRONMENT,
       remedy="CUDA's self-tests of the runtime and driver failed: "
              "reinstall the host driver and the image's CUDA runtime"),
    _e(127, "StartupFailure", "startup failure in cuda runtime", ENVIRONMENT),
    _e(200, "InvalidKernelImage", "device kernel image is invalid", remedy=_IMAGE),
    _e(201, "DeviceUninitialized", "invalid device context"),
    _e(205, "MapBufferObjectFailed", "mapping of buffer object failed"),
    _e(206, "UnmapBufferObjectFailed", "unmapping of buffer object failed"),
    _e(207, "ArrayIsMapped", "array is mapped"),
    _e(208, "AlreadyMapped", "resource already mapped"),
    _e(209, "NoKernelImageForDevice", "no kernel image is available for execution on the device",
       remedy=_IMAGE, aliases=("CUDA_ERROR_NO_BINARY_FOR_GPU",)),
    _e(210, "AlreadyAcquired", "resource already acquired"),
    _e(211, "NotMapped", "resource not mapped"),
    _e(212, "NotMappedAsArray", "resource not mapped as array"),
    _e(213, "NotMappedAsPointer", "resource not mapped as pointer"),
    _e(214, "ECCUncorrectable", "uncorrectable ECC error encountered", STICKY,
       remedy="the GPU's memory reported an uncorrectable error: drain the node, reset the GPU "
              "(nvidia-smi -r) and check its retired pages and remapped rows; replace the GPU if it repeats",
       aliases=("CUDA_ERROR_ECC_UNCORRECTABLE",)),
    _e(215, "UnsupportedLimit", "limit is not supported on this architecture"),
    _e(216, "DeviceAlreadyInUse", "exclusive-thread device already in use by a different thread", NOT_CHECKED,
       deep.DEVICE_BUSY, "none: another thread holds the GPU in exclusive-thread compute mode; not a fault",
       ("CUDA_ERROR_CONTEXT_ALREADY_IN_USE",)),
    _e(217, "PeerAccessUnsupported", "peer access is not supported between these two devices",
       remedy="the GPUs cannot reach each other's memory (P2P): confirm with NCCL_P2P_DISABLE=1, then check "
              "the host's IOMMU/ACS settings"),
    _e(218, "InvalidPtx", "a PTX JIT compilation failed", remedy=_JIT),
    _e(219, "InvalidGraphicsContext", "invalid OpenGL or DirectX context"),
    _e(220, "NvlinkUncorrectable", "uncorrectable NVLink error detected during the execution", STICKY,
       remedy="an NVLink reported an uncorrectable error: drain the node and reset the GPUs; check the links "
              "(nvidia-smi nvlink -s) and dmesg for Xid 74", aliases=("CUDA_ERROR_NVLINK_UNCORRECTABLE",)),
    _e(221, "JitCompilerNotFound", "PTX JIT compiler library not found", remedy=_JIT),
    _e(222, "UnsupportedPtxVersion", "the provided PTX was compiled with an unsupported toolchain.",
       remedy=_JIT),
    _e(223, "JitCompilationDisabled", "PTX JIT compilation was disabled", remedy=_JIT),
    _e(224, "UnsupportedExecAffinity", "the provided execution affinity is not supported"),
    _e(225, "UnsupportedDevSideSync", "", remedy=_JIT),
    _e(226, "Contained", "", STICKY,
       remedy="the GPU contained an error (a bad access to a peer's memory over NVLink, or a hardware "
              "error): check dmesg for Xid errors; the process must be relaunched",
       aliases=("CUDA_ERROR_CONTAINED",)),
    _e(300, "InvalidSource", "device kernel source is invalid"),
    _e(301, "FileNotFound", "file not found"),
    _e(302, "SharedObjectSymbolNotFound", "shared object symbol not found"),
    _e(303, "SharedObjectInitFailed", "shared object initialization failed"),
    _e(304, "OperatingSystem", "OS call failed or operation not supported on this OS"),
    _e(400, "InvalidResourceHandle", "invalid resource handle"),
    _e(401, "IllegalState", "the operation cannot be performed in the present state"),
    _e(402, "LossyQuery", ""),
    _e(500, "SymbolNotFound", "named symbol not found"),
    _e(600, "NotReady", "device not ready"),
    _e(700, "IllegalAddress", "an illegal memory access was encountered", STICKY,
       aliases=("CUDA_ERROR_ILLEGAL_ADDRESS",)),
    _e(701, "LaunchOutOfResources", "too many resources requested for launch",
       remedy="a kernel launch needs more registers or threads than the GPU has: an error in the code that "
              "launched it; nothing latched", aliases=("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",)),
    _e(702, "LaunchTimeout", "the launch timed out and was terminated", STICKY,
       remedy="a kernel ran past the watchdog (a GPU that also drives a display, or a hung GPU): check dmesg "
              "for Xid 8; the process must be relaunched", aliases=("CUDA_ERROR_LAUNCH_TIMEOUT",)),
    _e(703, "LaunchIncompatibleTexturing", "launch uses incompatible texturing mode"),
    _e(704, "PeerAccessAlreadyEnabled", "peer access is already enabled"),
    _e(705, "PeerAccessNotEnabled", "peer access has not been enabled"),
    _e(708, "SetOnActiveProcess", "cannot set while device is active in this process"),
    _e(709, "ContextIsDestroyed", "context is destroyed"),
    _e(710, "Assert", "device-side assert triggered", STICKY,
       remedy="a kernel's own check (a device-side assert, e.g. an index out of range) failed: the device "
              "cannot be used again by this process; the process must be relaunched",
       aliases=("CUDA_ERROR_ASSERT",)),
    _e(711, "TooManyPeers", "peer mapping resources exhausted"),
    _e(712, "HostMemoryAlreadyRegistered", "part or all of the requested memory range is already mapped"),
    _e(713, "HostMemoryNotRegistered", "pointer does not correspond to a registered memory region"),
    _e(714, "HardwareStackError", "hardware stack error", STICKY,
       aliases=("CUDA_ERROR_HARDWARE_STACK_ERROR",)),
    _e(715, "IllegalInstruction", "an illegal instruction was encountered", STICKY,
       aliases=("CUDA_ERROR_ILLEGAL_INSTRUCTION",)),
    _e(716, "MisalignedAddress", "misaligned address", STICKY, aliases=("CUDA_ERROR_MISALIGNED_ADDRESS",)),
    _e(717, "InvalidAddressSpace", "operation not supported on global/shared address space", STICKY,
       aliases=("CUDA_ERROR_INVALID_ADDRESS_SPACE",)),
    _e(718, "InvalidPc", "invalid program counter", STICKY, aliases=("CUDA_ERROR_INVALID_PC",)),
    _e(719, "LaunchFailure", "unspecified launch failure", STICKY, aliases=("CUDA_ERROR_LAUNCH_FAILED",)),
    _e(720, "CooperativeLaunchTooLarge", "too many blocks in cooperative launch"),
    _e(721, "TensorMemoryLeak", "", STICKY, aliases=("CUDA_ERROR_TENSOR_MEMORY_LEAK",)),
    _e(800, "NotPermitted", "operation not permitted"),
    _e(801, "NotSupported", "operation not supported"),
    _e(802, "SystemNotReady", "system not yet initialized", ENVIRONMENT, deep.FABRIC_MANAGER,
       "the system is not ready for CUDA: on NVSwitch systems (HGX/DGX A100, H100, H200, B200) start "
       "NVIDIA Fabric Manager on the host (systemctl start nvidia-fabricmanager, the same version as the "
       "driver) and wait until the GPUs' fabric state is Completed (nvidia-smi -q)",
       ("CUDA_ERROR_SYSTEM_NOT_READY",)),
    _e(803, "SystemDriverMismatch", "system has unsupported display driver / cuda driver combination",
       ENVIRONMENT, DRIVER_MISMATCH,
       "the CUDA driver library (libcuda) does not match the loaded kernel module: a driver upgraded "
       "without a reboot, or a libcuda copied into the image; reboot the node (or reload the nvidia module) "
       "and never ship libcuda in the image", ("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",)),
    _e(804, "CompatNotSupportedOnDevice", "forward compatibility was attempted on non supported HW",
       ENVIRONMENT, deep.FORWARD_COMPAT,
       "the image's CUDA forward-compatibility libraries (cuda-compat) were loaded on a GPU that does not "
       "support them (GeForce/RTX and other non-data-center GPUs): remove cuda-compat from the library path "
       "or upgrade the host driver to one that supports this CUDA",
       ("CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",)),
    _e(805, "MpsConnectionFailed", "MPS client failed to connect to the MPS control daemon or the MPS server",
       ENVIRONMENT, remedy="start the MPS control daemon (nvidia-cuda-mps-control -d) and share its pipe "
                           "directory (CUDA_MPS_PIPE_DIRECTORY) with the container"),
    _e(806, "MpsRpcFailure", "the remote procedural call between the MPS server and the MPS client failed",
       ENVIRONMENT, remedy="the MPS server failed: check its log and restart it"),
    _e(807, "MpsServerNotReady", "MPS server is not ready to accept new MPS client requests", NOT_CHECKED,
       deep.MPS_BUSY, _MPS),
    _e(808, "MpsMaxClientsReached",
       "the hardware resources required to create MPS client have been exhausted", NOT_CHECKED, deep.MPS_BUSY,
       _MPS),
    _e(809, "MpsMaxConnectionsReached",
       "the hardware resources required to support device connections have been exhausted", NOT_CHECKED,
       deep.MPS_BUSY, _MPS),
    _e(810, "MpsClientTerminated", "the MPS client has been terminated by the server", STICKY,
       remedy="the MPS server ended this client (after a fault in any client, or a server restart): the "
              "process must be relaunched; check the MPS server's log"),
    _e(811, "CdpNotSupported", ""),
    _e(812, "CdpVersionMismatch", ""),
    _e(900, "StreamCaptureUnsupported", "operation not permitted when stream is capturing"),
    _e(901, "StreamCaptureInvalidated", "operation failed due to a previous error during capture"),
    _e(902, "StreamCaptureMerge", "operation would result in a merge of separate capture sequences"),
    _e(903, "StreamCaptureUnmatched", "capture was not ended in the same stream as it began"),
    _e(904, "StreamCaptureUnjoined", "capturing stream has unjoined work"),
    _e(905, "StreamCaptureIsolation", "dependency created on uncaptured work in another stream"),
    _e(906, "StreamCaptureImplicit",
       "operation would make the legacy stream depend on a capturing blocking stream"),
    _e(907, "CapturedEvent", "operation not permitted on an event last recorded in a capturing stream"),
    _e(908, "StreamCaptureWrongThread",
       "attempt to terminate a thread-local capture sequence from another thread"),
    _e(909, "Timeout", "wait operation timed out"),
    _e(910, "GraphExecUpdateFailure", "the graph update was not performed because it included changes which "
                                      "violated constraints specific to instantiated graph update"),
    _e(911, "ExternalDevice", "an async error has occured in external entity outside of CUDA", STICKY,
       remedy="a device outside CUDA signalled an error on shared data: the process must be relaunched"),
    _e(912, "InvalidClusterSize", "a kernel launch error has occurred due to cluster misconfiguration"),
    _e(913, "FunctionNotLoaded", ""),
    _e(914, "InvalidResourceType", ""),
    _e(915, "InvalidResourceConfiguration", ""),
    _e(917, "StreamDetached", ""),
    _e(999, "Unknown", "unknown error", ENVIRONMENT, deep.CUDA_UNKNOWN,
       "an unknown error from the driver: check nvidia-smi and dmesg for Xid errors; inside a container it "
       "often means the device access was lost after a host systemctl daemon-reload: recreate the container",
       ("CUDA_ERROR_UNKNOWN", "CUDA unknown error")),
)

_ALLOC = "none: no GPU memory left for the library's handle or workspace: the workload uses it; not checked"
_LIBRARY = ("a cuBLAS or cuDNN call failed without harming the GPU (a bad input, an unsupported GPU, or a "
            "library that does not match the driver): details in the log; nothing latched")
# cuBLAS's and cuDNN's status codes, as torch prints them ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when
# calling `cublasCreate(handle)`", "cuDNN error: CUDNN_STATUS_ALLOC_FAILED"); any other status is OTHER.
LIBRARY: tuple[CudaError, ...] = (
    CudaError(None, "CUBLAS_STATUS_ALLOC_FAILED", "", NOT_CHECKED, deep.OOM, _ALLOC),
    CudaError(None, "CUDNN_STATUS_ALLOC_FAILED", "", NOT_CHECKED, deep.OOM, _ALLOC),
)

BY_CODE = {e.code: e for e in TABLE}
_BY_NAME = {name.lower(): e for e in (*TABLE, *LIBRARY)
            for name in (e.name, *(a for a in e.aliases if a.startswith("CUDA_ERROR_")))}
# (lower-case text, entry), longest first ("... in prior launch" wins); a wording that does not say CUDA
# ("The NVIDIA driver on your system is too old") is accepted anywhere, the others on a line naming CUDA.
_TEXTS = sorted(((t.lower(), e) for e in TABLE for t in (e.text, *e.aliases)
                 if t and not t.startswith("CUDA_ERROR_")), key=lambda pair: -len(pair[0]))

# PyTorch's added lines: everything from one of these to the end of its line is not the error.
BOILERPLATE = ("CUDA kernel errors might be asynchronously reported", "For debugging consider passing",
               "Compile with `TORCH_USE_CUDA_DSA`", "Compile with TORCH_USE_CUDA_DSA",
               "Search for `cudaError", "Search for 'cudaError")
_CUT = re.compile("(?i)" + "|".join(BOILERPLATE))  # the phrases hold no pattern characters
_NAMES = re.compile(r"\b(cudaError[A-Za-z]+|CUDA_ERROR_[A-Z_]+|CUBLAS_STATUS_[A-Z_]+|CUDNN_STATUS_[A-Z_]+)\b")
# Numbered forms that can only be CUDA's: "CUDA error 700", "cuda runtime error (59)", THCudaCheck's
# "error=46", glog's "(803 vs. 0)", "CUDA failure 804", the CUDA samples' "code=802".
_NUMBER = re.compile(r"(?i)cuda (?:runtime )?error:? \(?(\d{1,5})\b|\berror=(\d{1,5})\b|\((\d{1,5}) vs\. 0\)"
                     r"|cuda failure (\d{1,5})\b|\bcode[=#](\d{1,5})\b")


class Found(Record):
    error: CudaError
    how: str  # "code", "text", "status", "number" or "name"

    def facts(self) -> dict[str, Any]:
        return {"code": self.error.code, "name": self.error.name, "category": self.error.category,
                "how": self.how}


def lines(message: str) -> list[str]:
    """The message's lines without PyTorch's added text (a cleaned message's ``\\n`` escapes break too)."""
    kept = (_CUT.split(line, 1)[0].strip() for line in message.replace("\\n", "\n").splitlines())
    return [line for line in kept if line]


def identify(code: object, message: str, kind: object = None) -> Found | None:
    """The CUDA error a failure reports: by ``error_code``, a known text, a cuBLAS/cuDNN status, then
    a number or a name; torch's OutOfMemoryError (``kind``) is CUDA's out of memory. None: no CUDA error."""
    if isinstance(code, int) and not isinstance(code, bool) and code in BY_CODE:
        return Found(BY_CODE[code], "code")
    body = lines(message)
    for line in body:
        low = line.lower()
        for text, entry in _TEXTS:
            if text in low and ("cuda" in low or "nvidia driver" in text):
                return Found(entry, "text")
    for line in body:
        for name in _NAMES.findall(line):
            if name.startswith(("CUBLAS_", "CUDNN_")):
                known = _BY_NAME.get(name.lower())
                return Found(known or CudaError(None, name, "", OTHER, deep.CUDA_ERROR, _LIBRARY), "status")
    for line in body:
        if "cuda" not in line.lower():
            continue
        for match in _NUMBER.finditer(line):
            number = int(next(g for g in match.groups() if g))
            if number in BY_CODE:
                return Found(BY_CODE[number], "number")
        for name in _NAMES.findall(line):
            if name.lower() in _BY_NAME:
                return Found(_BY_NAME[name.lower()], "name")
    return Found(BY_CODE[2], "type") if kind == "OutOfMemoryError" else None


def failure(name: str, found: Found | None, where: str, *, holder: str = "", start: bool = False,
            **kw: Any) -> Result | None:
    """A probe's verdict on an identified CUDA error (None for none): sticky latches (``fatal`` in the
    facts), could-not-check warns naming the GPU's ``holder``; with ``start`` (torch-cuda) an error at
    start is said by its own cause, else any other error fails as ``cuda-error``."""
    if found is None:
        return None
    error, facts = found.error, kw.setdefault("facts", {})
    facts["cuda_error"] = found.facts()
    if error.category == STICKY:
        facts["fatal"] = True
        return error.verdict(name, f"fatal CUDA error on {where} ({error.label}): sticky, the CUDA "
                             f"context is unusable; {deep.UNTIL_RESTART}", **kw)
    if error.category == NOT_CHECKED:
        if error.cause is deep.OOM:
            return result.verdict(name, deep.OOM, f"{where} out of memory for the probe's own "
                                  f"context{holder} ({error.label})", **kw)
        mps = error.cause is deep.MPS_BUSY or "MPS client" in holder
        return result.verdict(name, deep.MPS_BUSY if mps else deep.DEVICE_BUSY, f"{where} busy{holder} "
                              f"({error.label})", **kw)
    if error.category == ENVIRONMENT and start:
        return error.verdict(name, f"CUDA cannot start on {where} ({error.label})", **kw)
    return error.verdict(name, f"CUDA error on {where} ({error.label})", None if start else deep.CUDA_ERROR,
                         **kw)
