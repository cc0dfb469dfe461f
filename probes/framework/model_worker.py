"""The model probe's worker, run by file path in the image's interpreter (stdlib + torch only, never
the ``probes`` package, Python 3.6+). It never executes pickled code, reads the format from the
content and loads through the descriptor it checked."""

import functools
import os
import sys
import time

PREFIX = "HEALTHCHECK-MODEL-RESULT "
PHASE = "HEALTHCHECK-MODEL-PHASE "
SCHEMA = 2
SEED = 20240601
MAX_TEXT = 400
MAX_HEADER = 100 * 2**20  # safetensors' own limit for its JSON header
FORMATS = ("torchscript", "safetensors", "state-dict")
ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
             "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
             "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
# The report's fields and their kinds as the suite checks them ("?": or null; a nested object).
ERROR = {"kind": "str", "type": "str", "message": "str", "code": "int?"}
REPORT = {"v": "int", "device": "str", "torch": "str?", "format": "str?", "loader": "str?",
          "file_bytes": "int?", "bytes": "int?", "budget": "int?", "budget_source": "str?", "load_ms": "num?",
          "params": "int?", "param_bytes": "int?", "peak_gpu": "int?", "forward_ms": "num?",
          "max_err": "measure?", "scale": "measure?", "error": ERROR}
INPUT_DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8", "bool")


# The worker's own words for what went wrong: the suite shows these, and only these.
NO_FILE = "no such file"
A_DIRECTORY = "a directory, not a file"
SPECIAL_FILE = "not a regular file (a FIFO, socket or device)"
NO_PERMISSION = "permission denied"
CANNOT_OPEN = "cannot be opened"
PHRASES = (
    NO_FILE, A_DIRECTORY, SPECIAL_FILE, NO_PERMISSION, CANNOT_OPEN,
    "expected SHAPE:DTYPE[:zeros|seeded]", "the shape is not NxMx... (positive integers)",
    "a dimension is zero", "dtype or fill not accepted",
    "safetensors header length beyond the file (truncated?)",
    "safetensors header is not JSON", "safetensors header is not an object",
    "safetensors header entry is malformed",
    "a tensor lies beyond the end of the file (truncated?)", "a damaged or truncated zip archive",
    "not a TorchScript archive, a safetensors file or a torch.save state dict",
    "a dtype unknown to this torch", "a tensor's size does not match its shape",
    "the file ended inside a tensor (truncated?)", "safetensors data is little-endian; this machine is not",
    "no weights_only loading in this torch: not unpickled",
    "the expected output is not a tensor", "larger than the memory it may take",
    "the model's output is not a tensor", "another shape than the expected output",
    "torch.cuda.is_available() is False", "the model needs more memory than is free",
    "only a TorchScript model can run a forward pass",
)


class Failure(Exception):
    """A failure of ``kind``, said with one of ``PHRASES`` or the text of ``exc`` (its CUDA error code)."""

    def __init__(self, kind, message, exc=None):
        Exception.__init__(self, message)
        self.kind = kind
        self.code = None if exc is None else scaffold().error_code(exc)


HERE = os.path.dirname(os.path.abspath(__file__))


@functools.lru_cache(maxsize=None)  # noqa: UP033 - functools.cache is Python 3.9+; workers run on 3.6+
def scaffold():
    """worker_base.py beside this file, loaded by its path (never by name), once."""
    import runpy
    import types

    return types.SimpleNamespace(**runpy.run_path(os.path.join(HERE, "worker_base.py")))


def phase(name):
    scaffold().phase(PHASE, name)


def text(exc):
    return scaffold().text(exc, MAX_TEXT)


def parse_args(argv):
    import argparse

    p = argparse.ArgumentParser(description="model health worker")
    p.add_argument("--path", required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--input", default=None)
    p.add_argument("--expect", default=None)
    p.add_argument("--max-bytes", type=int, default=None)
    return p.parse_args(argv)


def parse_input(spec):
    """``1x3x224x224:float16[:zeros|seeded]`` -> (shape, dtype name, fill); the suite's too."""
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise Failure("bad-input", "expected SHAPE:DTYPE[:zeros|seeded]")
    dims = parts[0].lower().split("x")
    # ASCII digits only: str.isdigit() takes '\u0663' and '\u00b2', and int() reads them.
    if not all(d and len(d) <= 9 and all(c in "0123456789" for c in d) for d in dims) or len(dims) > 8:
        raise Failure("bad-input", "the shape is not NxMx... (positive integers)")
    shape = [int(d) for d in dims]
    if any(d == 0 for d in shape):
        raise Failure("bad-input", "a dimension is zero")
    fill = parts[2] if len(parts) == 3 else "zeros"
    if parts[1] not in INPUT_DTYPES or fill not in ("zeros", "seeded"):
        raise Failure("bad-input", "dtype or fill not accepted")
    return shape, parts[1], fill


def _kind_of(st):
    import stat

    if stat.S_ISDIR(st.st_mode):
        return A_DIRECTORY
    return None if stat.S_ISREG(st.st_mode) else SPECIAL_FILE


def open_file(path, missing="missing", unreadable="unreadable"):
    """(file object, size) of a regular file; anything else is a Failure, said without waiting: the
    type is known before the open, which cannot block (O_NONBLOCK) should a FIFO appear in between."""
    import errno

    try:
        problem = _kind_of(os.stat(path))
        if problem is None:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
                         | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        sys.stderr.write("cannot open " + path + ": " + text(exc) + "\n")  # the log's, not the output's
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise Failure(missing, NO_FILE) from None
        denied = exc.errno in (errno.EACCES, errno.EPERM)
        raise Failure(unreadable, NO_PERMISSION if denied else CANNOT_OPEN) from None
    if problem is not None:
        raise Failure(unreadable, problem)
    st = os.fstat(fd)
    if _kind_of(st) is not None:
        os.close(fd)
        raise Failure(unreadable, _kind_of(st))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb"), st.st_size


def by_descriptor(fh, path):
    """A path that opens the very file ``fh`` is (for loaders that take a path), where /proc has one."""
    name = "/proc/self/fd/" + str(fh.fileno())
    return name if os.path.exists(name) else path


def safetensors_header(fh, size):
    """(tensor entries, data start) of a file ``detect`` found to be safetensors, checked against its size."""
    import json
    import struct

    fh.seek(0)
    (length,) = struct.unpack("<Q", fh.read(8))
    if 8 + length > size:
        raise Failure("corrupt", "safetensors header length beyond the file (truncated?)")
    try:
        header = json.loads(fh.read(length).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise Failure("corrupt", "safetensors header is not JSON") from None
    if not isinstance(header, dict):
        raise Failure("corrupt", "safetensors header is not an object")
    start = 8 + length
    header.pop("__metadata__", None)
    for info in header.values():
        ok = (isinstance(info, dict) and info.get("dtype") in ST_DTYPES
              and isinstance(info.get("shape"), list) and isinstance(info.get("data_offsets"), list)
              and len(info["data_offsets"]) == 2
              and all(isinstance(v, int) and v >= 0 for v in info["shape"] + info["data_offsets"]))
        if not ok:
            raise Failure("corrupt", "safetensors header entry is malformed")
        begin, end = info["data_offsets"]
        if begin > end or start + end > size:
            raise Failure("corrupt", "a tensor lies beyond the end of the file (truncated?)")
    return header, start


def detect(fh, size):
    """(format, tensor bytes) from the file's content; raises Failure for anything else."""
    fh.seek(0)
    magic = fh.read(8)
    if magic[:4] == b"PK\x03\x04":
        import zipfile

        try:
            names = zipfile.ZipFile(fh).infolist()
        except (zipfile.BadZipFile, OSError, ValueError):
            raise Failure("corrupt", "a damaged or truncated zip archive") from None
        code = any("/code/" in "/" + i.filename for i in names)
        data = sum(i.file_size for i in names if "/data/" in "/" + i.filename)
        return ("torchscript" if code else "state-dict"), (data or size)
    import struct  # here, not at the top: the suite imports this file's constants

    if len(magic) == 8 and 2 <= struct.unpack("<Q", magic)[0] <= MAX_HEADER and fh.read(1) == b"{":
        header, _ = safetensors_header(fh, size)
        return "safetensors", sum(info["data_offsets"][1] - info["data_offsets"][0]
                                  for info in header.values())
    if magic[:1] == b"\x80":  # a pickle (torch.save's legacy format): only weights_only may read it
        return "state-dict", size
    raise Failure("unsupported", "not a TorchScript archive, a safetensors file or a torch.save state dict")


def budget_of(torch, args):
    """(bytes the model may take, where that comes from): the setting, the free GPU memory, or on the
    CPU the available RAM and the cgroup's (v2) room."""
    options = []
    if args.max_bytes is not None:
        options.append((args.max_bytes, "HEALTHCHECK_MODEL_MAX_BYTES"))
    if args.device == "cuda":
        free, _ = torch.cuda.mem_get_info(torch.cuda.current_device())
        return min([*options, (int(free), "free GPU memory")])
    try:
        with open("/proc/meminfo") as fh:
            options += [(int(line.split()[1]) * 1024, "available RAM") for line in fh
                         if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as fh, open("/sys/fs/cgroup/memory.current") as used:
            limit, current = fh.read().strip(), int(used.read().strip())
        if limit.isdigit():
            options.append((max(int(limit) - current, 0), "the container's memory limit"))
    except (OSError, ValueError):
        pass
    return min(options) if options else (None, None)


def tensors_of(value, depth=0):
    if hasattr(value, "numel") and hasattr(value, "element_size"):
        return [value]
    if isinstance(value, (dict, list, tuple)) and depth < 20:
        items = value.values() if isinstance(value, dict) else value
        return [t for v in items for t in tensors_of(v, depth + 1)]
    return []


def load_safetensors(torch, fh, size, device):
    try:
        from safetensors.torch import load_file
    except Exception:
        load_file = None
    if load_file is not None:
        return "safetensors", load_file(by_descriptor(fh, fh.name), device=str(device))
    header, start = safetensors_header(fh, size)
    out = {}
    for name, info in header.items():
        dtype = getattr(torch, ST_DTYPES[info["dtype"]], None)
        if dtype is None:
            raise Failure("unsupported", "a dtype unknown to this torch")
        begin, end = info["data_offsets"]
        width = torch.empty((), dtype=dtype).element_size()
        if torch.Size(info["shape"]).numel() * width != end - begin:
            raise Failure("corrupt", "a tensor's size does not match its shape")
        fh.seek(start + begin)
        raw = bytearray(fh.read(end - begin))
        if len(raw) != end - begin:
            raise Failure("corrupt", "the file ended inside a tensor (truncated?)")
        tensor = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        if sys.byteorder != "little":
            raise Failure("unsupported", "safetensors data is little-endian; this machine is not")
        out[name] = tensor.reshape(info["shape"]).to(device)
    return "frombuffer", out


def load(torch, fmt, fh, size, path, device):
    """(loader name, loaded object)."""
    path = by_descriptor(fh, path)
    if fmt == "torchscript":
        return "torch.jit.load", torch.jit.load(path, map_location=device)
    if fmt == "safetensors":
        return load_safetensors(torch, fh, size, device)
    try:
        return "torch.load", torch.load(path, map_location=device, weights_only=True)
    except TypeError as exc:
        if "weights_only" in str(exc):
            raise Failure("unsupported", "no weights_only loading in this torch: not unpickled") from None
        raise


def load_error(exc):
    message = text(exc)
    low = message.lower()
    if type(exc).__name__ == "UnpicklingError" and "weights only" in low:
        return Failure("unsafe", message)
    if "out of memory" in low:
        return Failure("oom", message, exc)
    if any(w in low for w in ("zip archive", "central directory", "unexpected eof", "truncated",
                              "ran out of input", "pickle data was truncated", "invalid load key")):
        return Failure("corrupt", message)
    return Failure("load", message, exc)


def forward(torch, model, args, device, report, expect_fh):
    shape, dtype_name, fill = parse_input(args.input)
    dtype = getattr(torch, dtype_name)
    if fill == "seeded":
        gen = torch.Generator().manual_seed(SEED)
        x = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    else:
        x = torch.zeros(shape, dtype=dtype)
    expect = None
    if expect_fh is not None:
        phase("expect")
        try:
            expect = torch.load(by_descriptor(expect_fh, args.expect), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise Failure("expect-unreadable", text(exc)) from None
        if not hasattr(expect, "shape"):
            raise Failure("expect-unreadable", "the expected output is not a tensor")
    phase("forward")
    x = x.to(device)
    start = time.perf_counter()
    try:
        with torch.no_grad():
            out = model(x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:
        kind = "oom" if "out of memory" in text(exc).lower() else "forward"
        raise Failure(kind, text(exc), exc) from None
    report["forward_ms"] = round((time.perf_counter() - start) * 1000.0, 3)
    if isinstance(out, (list, tuple)) and out:
        out = out[0]
    if not hasattr(out, "shape"):
        raise Failure("forward", "the model's output is not a tensor")
    if expect is not None:
        if list(out.shape) != list(expect.shape):
            shapes = str(list(out.shape)) + ", expected " + str(list(expect.shape))
            sys.stderr.write("output shape " + shapes + "\n")  # the log's
            raise Failure("shape-mismatch", "another shape than the expected output")
        got, want = out.detach().cpu().double(), expect.double()
        report["max_err"] = scaffold().measure((got - want).abs().max().item()) if want.numel() else 0.0
        report["scale"] = scaffold().measure(want.abs().max().item()) if want.numel() else 0.0


def work(args, report):
    phase("open")  # the files stay open until the worker exits
    fh, size = open_file(args.path)
    report["file_bytes"] = size
    expect_fh, expect_size = None, 0
    if args.expect and args.input is not None:  # said before anything costly, as a bad input is
        expect_fh, expect_size = open_file(args.expect, "expect-missing", "expect-unreadable")
    fmt, nbytes = detect(fh, size)
    report["format"], report["bytes"] = fmt, nbytes
    if args.input is not None:
        parse_input(args.input)  # a bad input is said before anything costly
    phase("import")
    try:
        import torch
    except Exception as exc:
        raise Failure("import", text(exc)) from None
    report["torch"] = str(getattr(torch, "__version__", "?"))
    if args.device == "cuda":
        phase("init")
        if not torch.cuda.is_available():
            raise Failure("cuda-unavailable", "torch.cuda.is_available() is False")
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    budget, source = budget_of(torch, args)
    report["budget"], report["budget_source"] = budget, source
    if budget is not None and nbytes > budget:
        raise Failure("too-big", "the model needs more memory than is free")
    if budget is not None and expect_size > budget:
        raise Failure("expect-unreadable", "larger than the memory it may take")
    phase("load")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    try:
        loader, model = load(torch, fmt, fh, size, args.path, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Failure:
        raise
    except Exception as exc:
        raise load_error(exc) from None
    report["load_ms"] = round((time.perf_counter() - start) * 1000.0, 3)
    report["loader"] = loader
    found = list(model.parameters()) + list(model.buffers()) if fmt == "torchscript" else tensors_of(model)
    report["params"] = int(sum(t.numel() for t in found))
    report["param_bytes"] = int(sum(t.numel() * t.element_size() for t in found))
    if args.input is not None:
        if fmt != "torchscript":
            raise Failure("no-forward", "only a TorchScript model can run a forward pass")
        forward(torch, model, args, device, report, expect_fh)
    if device.type == "cuda":
        report["peak_gpu"] = int(torch.cuda.max_memory_allocated(device))


def failed(exc):
    if isinstance(exc, Failure):
        return {"kind": exc.kind, "type": "Failure", "message": text(exc), "code": exc.code}
    kind = "oom" if "out of memory" in str(exc).lower() else "worker"
    return dict(scaffold().described(exc, MAX_TEXT), kind=kind)


def main(argv=None):
    # Nothing in this folder or the current directory may stand in for torch or the standard library.
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != HERE]
    args = parse_args(sys.argv[1:] if argv is None else argv)
    report = {**dict.fromkeys(REPORT), "v": SCHEMA, "device": args.device}
    scaffold().run(PREFIX, PHASE, report, lambda out: work(args, out), failed, trace=True)


if __name__ == "__main__":
    main()
