"""The nccl probe's worker, run by file path in the image's interpreter with ``NCCL_DEBUG=WARN``
(stdlib + torch only, never the ``probes`` package, Python 3.6+). GPU ``i`` plays rank ``i`` of one
single-process ``torch.cuda.nccl.all_reduce``, checked exactly (the sum is exact in float32)."""

import functools
import os
import sys
import time

PREFIX = "HEALTHCHECK-NCCL-RESULT "
PHASE = "HEALTHCHECK-NCCL-PHASE "
SCHEMA = 2
LENGTH = 1 << 16  # elements per tensor (256 KiB of float32): several NCCL chunks, trivial for a GPU
MAX_TEXT = 400
# The report's fields and their kinds as the suite checks them ("?": or null; a nested object).
ERROR = {"kind": "str", "type": "str", "message": "str", "code": "int?"}
REPORT = {"v": "int", "backend": "str", "torch": "str?", "nccl": "str?", "count": "int?", "ms": "num?",
          "bad": "int?", "max_err": "num?", "error": ERROR}
HERE = os.path.dirname(os.path.abspath(__file__))


@functools.lru_cache(maxsize=None)  # noqa: UP033 - functools.cache is Python 3.9+; workers run on 3.6+
def scaffold():
    """worker_base.py beside this file, loaded by its path (never by name), once."""
    import runpy
    import types

    return types.SimpleNamespace(**runpy.run_path(os.path.join(HERE, "worker_base.py")))


def phase(name):
    scaffold().phase(PHASE, name)


def contribution(torch, rank):
    """What rank ``rank`` adds: (rank + 1) * (1 + i % 7), so a mixed-up or missing rank shows."""
    return ((torch.arange(LENGTH, dtype=torch.int64) % 7 + 1) * (rank + 1)).to(torch.float32)


def expected(torch, world):
    """The exact sum of ``world`` ranks' contributions: what a rank of that factor would add."""
    return contribution(torch, world * (world + 1) // 2 - 1)


def verify(torch, tensors, world):
    """(number of tensors that differ from the exact sum, largest absolute difference)."""
    want = expected(torch, world).to(torch.float64)
    bad, worst = 0, 0.0
    for t in tensors:
        got = t.detach().to("cpu").to(torch.float64)
        if got.shape != want.shape or not torch.equal(got, want):
            bad += 1
        err = float((got - want).abs().max().item())
        worst = max(worst, float("inf") if err != err else err)  # NaN: inf
    return bad, worst


def error(kind, exc):
    return dict(scaffold().described(exc, MAX_TEXT), kind=kind)


def run_nccl(torch, report):
    phase("nccl")
    try:
        import torch.distributed as dist

        built = bool(dist.is_available() and dist.is_nccl_available())
        v = torch.cuda.nccl.version() if getattr(torch._C, "_nccl_version", None) is not None else None
    except Exception:
        built, v = False, None
    if isinstance(v, int):
        v = (v // 10000, v // 100 % 100, v % 100) if v >= 10000 else (v,)  # old torch: 21805 is 2.18.5
    report["nccl"] = None if v is None else ".".join(str(x) for x in v)
    if not built or report["nccl"] is None:
        report["error"] = {"kind": "no-nccl", "type": "NotBuilt", "message": "this torch build has no NCCL",
                           "code": None}
        return
    phase("init")
    if not torch.cuda.is_available():
        report["error"] = {"kind": "cuda-unavailable", "type": "NoCuda",
                           "message": "torch.cuda.is_available() is False", "code": None}
        return
    count = int(torch.cuda.device_count())
    report["count"] = count
    phase("place")
    tensors = [contribution(torch, i).to(torch.device("cuda", i)) for i in range(count)]
    for i in range(count):
        torch.cuda.synchronize(i)
    phase("allreduce")
    start = time.perf_counter()
    torch.cuda.nccl.all_reduce(tensors)
    for i in range(count):
        torch.cuda.synchronize(i)
    report["ms"] = round((time.perf_counter() - start) * 1000.0, 3)
    phase("verify")
    report["bad"], report["max_err"] = verify(torch, tensors, count)


def work(report):
    phase("import")
    try:
        import torch
    except Exception as exc:
        report["error"] = error("import", exc)
        return
    report["torch"] = str(getattr(torch, "__version__", "?"))
    try:
        run_nccl(torch, report)
    except Exception as exc:
        report["error"] = error("collective", exc)


def main():
    # Nothing in this folder or the current directory may stand in for torch or the standard library.
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != HERE]
    report = {**dict.fromkeys(REPORT), "v": SCHEMA, "backend": "nccl"}
    scaffold().run(PREFIX, PHASE, report, work, lambda exc: error("worker", exc))


if __name__ == "__main__":
    main()
