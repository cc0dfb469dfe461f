"""Fixtures for the torch-cuda tests: wrapper interpreters that count their starts,
a fake torch package for the CUDA paths, and a check that no worker outlives its run."""

from __future__ import annotations

import dataclasses
import os
import stat
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest

from probes.config import Config
from probes.context import Context
from probes.framework import torch_cuda
from probes.result import Result
from probes.state import State

REAL_PYTHON = sys.executable  # the suite's venv: the CPU build of torch is installed there
FAKE_TORCH = Path(__file__).resolve().parent / "fake_torch"


@dataclasses.dataclass
class Interp:
    """A wrapper interpreter written by a test; every start appends a line to ``log``."""

    path: Path
    log: Path

    @property
    def starts(self) -> int:
        return len(self.log.read_text().splitlines()) if self.log.exists() else 0

    def __str__(self) -> str:
        return str(self.path)


def write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def make_interp(tmp_path: Path) -> Callable[..., Interp]:
    """make_interp(name, mode=None, exports={}, body=None, python_args="").

    mode: put the fake torch first on PYTHONPATH with FAKE_TORCH_MODE=mode.
    body: replace the exec line (a shell fragment) for interpreters that are not Python at all.
    """
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)

    def make(name: str, *, mode: str | None = None, exports: Mapping[str, str] | None = None,
             body: str | None = None, python_args: str = "") -> Interp:
        log = tmp_path / f"{name}.starts"
        lines = ["#!/bin/sh", f'echo "$$" >> "{log}"']
        env = dict(exports or {})
        if mode is not None:
            env.setdefault("PYTHONPATH", str(FAKE_TORCH))
            env.setdefault("FAKE_TORCH_MODE", mode)
        lines += [f"export {k}='{v}'" for k, v in env.items()]
        lines.append(body if body is not None else f'exec "{REAL_PYTHON}" {python_args} "$@"')
        return Interp(write_exe(bindir / name, "\n".join(lines) + "\n"), log)

    return make


@pytest.fixture
def marker(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[int]]:
    """Tags every child with an environment marker; returns a function listing the tagged
    processes still alive (zombies included: a reaped child is gone)."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv("HC_TEST_MARK", tag)

    def alive() -> list[int]:
        found = []
        for p in psutil.process_iter(["pid"]):
            if p.pid == os.getpid():
                continue
            try:
                if p.environ().get("HC_TEST_MARK") == tag:
                    found.append(p.pid)
            except (psutil.Error, OSError):
                continue
        return found

    return alive


def probe(python: object, tmp_path: Path, *, device: str = "cuda", profile: str = "readiness",
          timeout: float = 30.0, ttl: float = 300.0, state: State | None = None,
          results: Mapping[str, Result] | None = None) -> tuple[Result, float, dict[str, Any]]:
    """One torch-cuda run as the runner does it: gather() under a deadline, then judge()."""
    cfg = Config()._replace(profile=profile, torch_python=str(python), torch_device=device,
                              torch_ttl=ttl)
    st = state if state is not None else State.open(str(tmp_path / "state"))
    start = time.monotonic()
    ctx = Context(cfg, start + timeout, dict(results or {}), st)
    data = torch_cuda.gather(ctx)
    result = torch_cuda.judge(data, ctx)
    return result, time.monotonic() - start, data
