"""Test only: the real torch worker meets one corpus sample where its CUDA work happens.

Started as ``sample_worker.py WORKER_FILE WORKER_ARGS...`` by tests/corpus/sample-python.sh (what
HEALTHCHECK_TORCH_PYTHON points at in tests/corpus/test_cuda_corpus.py's front-door tests), with
CORPUS_SAMPLE naming a file of tests/corpus/cuda/; the in-process tests call ``install`` themselves.
It imports the real (CPU) torch, makes CUDA look available with one
device, arranges for the sample to be raised, then runs the worker file unchanged with runpy:

- ``# raise: init``: ``torch.cuda.is_available()`` is False and ``torch.cuda.init()`` raises it,
  as torch does when CUDA cannot start;
- otherwise the worker's first copy of a tensor to the GPU raises it.

It is raised as ``torch.AcceleratorError`` with ``error_code`` set when the sample has a
``# code:`` line (torch 2.8 and later set that attribute to the cudaError_t), as
``torch.cuda.OutOfMemoryError`` for ``# type: OutOfMemoryError``, and as a RuntimeError otherwise,
with the sample's text as its message.
"""

from __future__ import annotations

import os
import runpy
import sys
import types
from typing import Any, Callable


def read(path: str) -> tuple[dict[str, str], str]:
    """(header fields, sample text) of a corpus file: ``# key: value`` lines, then the text."""
    fields: dict[str, str] = {}
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    while lines and lines[0].startswith("# ") and ":" in lines[0]:
        key, _, value = lines.pop(0)[2:].partition(":")
        fields[key.strip()] = value.strip()
    return fields, "\n".join(lines)


def exception(torch: Any, fields: dict[str, str], text: str) -> BaseException:
    if "code" in fields:
        exc = torch.AcceleratorError(text)
        exc.error_code = int(fields["code"])
        return exc
    if fields.get("type") == "OutOfMemoryError":
        return torch.cuda.OutOfMemoryError(text)
    return RuntimeError(text)


def on_cuda(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return any(str(getattr(a, "type", a)).startswith("cuda") for a in (*args, kwargs.get("device")))


def install(torch: Any, fields: dict[str, str], exc: BaseException,
            patch: Callable[[Any, str, Any], None] = setattr) -> None:
    """Make CUDA look available (or failing at start) and raise ``exc`` where the worker's CUDA work
    happens; ``patch`` sets each attribute (the in-process tests pass one that undoes it)."""
    patch(torch.backends.cuda, "is_built", lambda: True)
    patch(torch.version, "cuda", "12.8")

    def fail(*_: Any) -> None:
        raise exc

    if fields.get("raise") == "init":
        patch(torch.cuda, "is_available", lambda: False)
        patch(torch.cuda, "init", fail)
        return
    patch(torch.cuda, "is_available", lambda: True)
    patch(torch.cuda, "device_count", lambda: 1)
    patch(torch.cuda, "get_device_name", lambda index=None: "Corpus GPU")
    uuid = "c0c0c0c0-0000-4000-8000-000000000000"
    patch(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(uuid=uuid))
    to = torch.Tensor.to

    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        if on_cuda(args, kwargs):
            raise exc
        return to(self, *args, **kwargs)

    patch(torch.Tensor, "to", patched)


def main() -> None:
    fields, text = read(os.environ["CORPUS_SAMPLE"])
    import torch

    install(torch, fields, exception(torch, fields, text))
    worker = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(worker, run_name="__main__")


if __name__ == "__main__":
    main()
