"""The torch-cuda worker, run by file path in ``HEALTHCHECK_TORCH_PYTHON`` (stdlib + torch only, never
the ``probes`` package, Python 3.6+; docs/probes.md, "How the probes decide"). It reports, never judges."""

import functools
import os
import sys
import time

PREFIX = "HEALTHCHECK-TORCH-RESULT "
PHASE = "HEALTHCHECK-TORCH-PHASE "
SCHEMA = 3
SEED = 20240601
MAX_TEXT = 1000  # characters of an error message: the CUDA error line and PyTorch's lines after it
HERE = os.path.dirname(os.path.abspath(__file__))
# The report's fields and their kinds as the suite checks them ("?": or null; a nested object, or a list).
ERROR = {"phase": "str", "type": "str", "message": "str", "device": "int?", "module": "str?", "code": "int?"}
DEVICE = {"index": "int", "name": "str", "uuid": "str?", "op_ms": "num?", "max_err": "measure?",
          "scale": "measure?", "free": "int?", "total": "int?", "error": ERROR}
REPORT = {"v": "int", "device": "str", "size": "int", "torch": "str?", "cuda": "str?", "cuda_built": "bool?",
          "available": "bool?", "count": "int?", "visible_devices": "str?", "error": ERROR,
          "devices": [DEVICE]}
# After these "could not check" rows of cuda_errors.py (a test keeps them equal) the next device is tried;
# after any other error the context may be corrupted and further CUDA calls may hang: it stops.
BENIGN_CODES = (2, 46, 216, 807, 808, 809)
BENIGN = ("all cuda-capable devices are busy or unavailable", "cublas_status_alloc_failed",
          "cuda out of memory", "cuda-capable device(s) is/are busy or unavailable",
          "cudnn_status_alloc_failed", "exclusive-thread device already in use by a different thread",
          "mps server is not ready to accept new mps client requests", "out of memory",
          "the hardware resources required to create mps client have been exhausted",
          "the hardware resources required to support device connections have been exhausted")


@functools.lru_cache(maxsize=None)  # noqa: UP033 - functools.cache is Python 3.9+; workers run on 3.6+
def scaffold():
    """worker_base.py beside this file, loaded by its path (never by name), once."""
    import runpy
    import types

    return types.SimpleNamespace(**runpy.run_path(os.path.join(HERE, "worker_base.py")))


def phase(name):
    scaffold().phase(PHASE, name)


def error(where, exc, device=None):
    err = scaffold().described(exc, MAX_TEXT, one_line=False)  # the parent looks for the CUDA error line
    err.update(phase=where, device=device,
               module=getattr(exc, "name", None) if isinstance(exc, ImportError) else None)
    return err


def benign(err):
    low = err["message"].lower()
    return err["code"] in BENIGN_CODES or any(word in low for word in BENIGN)


def parse_args(argv):
    import argparse

    p = argparse.ArgumentParser(description="torch-cuda health worker")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--size", type=int, default=1024)
    return p.parse_args(argv)


def new_report(args):
    return {**dict.fromkeys(REPORT), "v": SCHEMA, "device": args.device, "size": args.size,
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "devices": []}


def check_cuda(torch, report):
    """The device count, or the error that keeps CUDA from being used."""
    phase("init")
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report["available"] = bool(torch.cuda.is_available())
    if report["available"]:
        report["count"] = int(torch.cuda.device_count())
        return
    # is_available() only warns; init() raises the driver's own reason (too old, no driver, device
    # busy), which the parent turns into a diagnosis.
    try:
        torch.cuda.init()
    except Exception as exc:
        report["error"] = error("init", exc)
        return
    text = "\n".join(str(w.message) for w in caught) or "torch.cuda.is_available() returned False"
    report["error"] = error("init", Warning(text))


def run_op(torch, a, b, ref, scale, device, entry):
    is_cuda = device.type == "cuda"
    da, db = a.to(device), b.to(device)
    out = torch.matmul(da, db)  # warm-up: library initialisation is not op time
    if is_cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = torch.matmul(da, db)
    if is_cuda:
        torch.cuda.synchronize(device)  # surfaces asynchronous errors of everything above
    entry["op_ms"] = round((time.perf_counter() - start) * 1000.0, 3)
    entry["max_err"] = scaffold().measure((out.cpu().double() - ref).abs().max().item())
    entry["scale"] = scaffold().measure(scale)
    if is_cuda:
        free, total = torch.cuda.mem_get_info(device)
        entry["free"], entry["total"] = int(free), int(total)


def work(args, report):
    phase("import")
    try:
        import torch
    except Exception as exc:  # ImportError, or an OSError from a missing shared library
        report["error"] = error("import", exc)
        return
    report["torch"] = str(getattr(torch, "__version__", "?"))
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    report["cuda"] = None if cuda is None else str(cuda)
    try:
        report["cuda_built"] = bool(torch.backends.cuda.is_built())
    except Exception:
        report["cuda_built"] = report["cuda"] is not None
    if args.device == "cuda":
        try:
            check_cuda(torch, report)
        except Exception as exc:
            report["error"] = error("init", exc)
        if report["error"] is not None:
            return
        indices = list(range(report["count"]))
    else:
        report["count"] = 1
        indices = [None]

    phase("reference")
    try:
        # TF32 would change the GPU result by ~1e-3 and hide or fake a mismatch.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        gen = torch.Generator().manual_seed(SEED)
        a = torch.randn(args.size, args.size, generator=gen, dtype=torch.float32)
        b = torch.randn(args.size, args.size, generator=gen, dtype=torch.float32)
        ref = torch.matmul(a.double(), b.double())
        scale = float(ref.abs().max().item())
    except Exception as exc:
        report["error"] = error("reference", exc)
        return

    for index in indices:
        entry = {**dict.fromkeys(DEVICE), "index": 0 if index is None else index, "name": "cpu",
                 "error": None}
        report["devices"].append(entry)
        phase("device cpu" if index is None else "device " + str(index))
        try:
            device = torch.device("cpu") if index is None else torch.device("cuda", index)
            if index is not None:
                entry["name"] = str(torch.cuda.get_device_name(index))
                try:
                    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
                    entry["uuid"] = None if uuid is None else str(uuid)
                except Exception:  # noqa: S110 - an older torch: no uuid, nothing else wrong
                    pass
            run_op(torch, a, b, ref, scale, device, entry)
        except Exception as exc:
            entry["error"] = error("device", exc, entry["index"])
            if not benign(entry["error"]):
                break


def main(argv=None):
    # Nothing in this folder or the current directory may stand in for torch or the standard library.
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != HERE]
    args = parse_args(sys.argv[1:] if argv is None else argv)
    scaffold().run(PREFIX, PHASE, new_report(args), lambda report: work(args, report),
                   lambda exc: error("worker", exc), trace=True)


if __name__ == "__main__":
    main()
