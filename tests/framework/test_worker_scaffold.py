"""The worker scripts share one scaffold (probes/framework/worker_base.py), loaded by its path.

Each worker is copied with the scaffold into a folder of its own and run three ways: by path,
through runpy from the current directory (which puts that directory on sys.path), and by path
with only the standard library and torch's folder (no site, so not the suite's own install),
always with the real CPU torch in .venv and from a current directory full of decoys: a
``torch.py``, a ``json.py``, a ``ctypes.py`` and files named like the scaffold. Decoys also lie
beside the copied worker. Neither the worker's folder nor the
current directory may lend it a module: every decoy records that it was imported, and none may.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from probes.framework import checkpoint_child, model_worker, nccl_worker, torch_worker
from tests.conftest import ROOT, clean_env

FRAMEWORK = ROOT / "probes" / "framework"
SCAFFOLD = "worker_base.py"
# Module names a worker or the scaffold imports (or, for the scaffold, the name it is loaded
# under): a file of that name in the wrong place must never be imported.
DECOYS = ("torch", "json", "ctypes", "traceback", "worker_base", "healthcheck_worker_base")
# Runs the worker as its parent's interpreter would, but from the current directory: -c puts
# '' (the current directory) first on sys.path, and records every module name imported.
VIA_CWD = ("import runpy, sys\nworker = sys.argv[1]\nsys.argv = sys.argv[1:]\n"
           "runpy.run_path(worker, run_name='__main__')\n")


def decoy(folder: Path, name: str, seen: Path) -> None:
    (folder / f"{name}.py").write_text(
        f"with open({str(seen / name)!r}, 'w') as fh:\n    fh.write({str(folder)!r})\n"
        f"raise ImportError('decoy {name}')\n")


def worker_args(name: str, tmp_path: Path) -> list[str]:
    if name == "torch_worker":
        return ["--device", "cpu", "--size", "8"]
    if name == "model_worker":
        import torch

        model = tmp_path / "weights.pt"
        torch.save({"w": torch.ones(4, 4)}, model)
        return ["--path", str(model), "--device", "cpu"]
    if name == "nccl_worker":
        return []  # the CPU torch has no NCCL: it says so in its result line
    return [str(1)]  # checkpoint_child: the state of pid 1 (without libcuda.so.1: not loaded)


WORKERS = {"torch_worker": torch_worker.PREFIX, "model_worker": model_worker.PREFIX,
           "nccl_worker": nccl_worker.PREFIX, "checkpoint_child": checkpoint_child.PREFIX}


@pytest.mark.parametrize("how", ["by-path", "from-the-current-directory", "stdlib-and-torch-only"])
@pytest.mark.parametrize("name", sorted(WORKERS))
def test_a_copied_worker_runs_on_the_stdlib_and_torch_and_no_decoy_shadows_anything(
        name: str, how: str, tmp_path: Path) -> None:
    copy, cwd, seen = tmp_path / "copy", tmp_path / "cwd", tmp_path / "seen"
    for folder in (copy, cwd, seen):
        folder.mkdir()
    shutil.copy(FRAMEWORK / f"{name}.py", copy)
    shutil.copy(FRAMEWORK / SCAFFOLD, copy)
    for module in DECOYS:
        decoy(cwd, module, seen)
        if f"{module}.py" != SCAFFOLD:
            decoy(copy, module, seen)
    worker = copy / f"{name}.py"
    if how == "stdlib-and-torch-only":
        # -S: no site module, so none of site-packages' .pth files (the suite's own install is
        # one): the standard library and torch's folder, nothing else.
        import torch

        flags, env = ["-S", str(worker)], clean_env(PYTHONPATH=str(Path(torch.__file__).parent.parent))
    else:
        # -E -s: no PYTHONPATH, no user site: the interpreter's own site-packages (torch) only.
        flags, env = ["-E", "-s", *([str(worker)] if how == "by-path" else ["-c", VIA_CWD, str(worker)])], clean_env()
    done = subprocess.run([sys.executable, *flags, *worker_args(name, tmp_path)], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in seen.iterdir()) == [], done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(WORKERS[name]), done.stdout + done.stderr[-2000:]
    report = json.loads(lines[0][len(WORKERS[name]):])
    assert report.get("error") is None or (name, report["error"]["kind"]) == ("nccl_worker", "no-nccl"), report
    if name != "checkpoint_child":
        import torch

        assert report["torch"] == torch.__version__
