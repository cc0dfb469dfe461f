"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
# A check the tests start tells the person (probes/notice.py): its log line and its notice go to this
# session's scratch, never into this machine's PID 1's stderr or /run. Inherited by every child; a
# test that is about the notices sets its own.
NOTICES = Path(tempfile.mkdtemp(prefix="hc-test-notices-"))
os.environ.setdefault("_HEALTHCHECK_NOTICE_LOG", str(NOTICES / "pid1-stderr"))
os.environ.setdefault("HEALTHCHECK_NOTICE_FILE", str(NOTICES / "notice"))


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(NOTICES, ignore_errors=True)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a whole-process run: no ENABLE_*/HEALTHCHECK_* leaking in from the caller."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ENABLE_", "HEALTHCHECK_", "FAKE_NVML", "CUDA_VISIBLE", "NVIDIA_VISIBLE"))}
    env["HEALTHCHECK_NOTICE_FILE"] = os.environ["HEALTHCHECK_NOTICE_FILE"]  # see NOTICES
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
            front_door: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the suite as Docker or the kubelet would: a whole process, its output captured."""
    argv = [str(ROOT / "healthcheck"), *args] if front_door else [PYTHON, "-m", "probes", *args]
    if front_door:
        env = dict(env or clean_env())
        env.setdefault("HEALTHCHECK_PYTHON", PYTHON)
    return subprocess.run(argv, env=env if env is not None else clean_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)


# A stand-in for the suite's interpreter behind the front door (./healthcheck): it runs BODY (bash)
# and answers as probes/cli.py does there, with `verdict N` (exit 200 + N; 0 after BODY), and with
# `deadline S` says its hard deadline on descriptor 3.
SUITE_STUB = """#!/bin/bash
verdict() { exit $((200 + $1)); }
deadline() { printf '%s\\n' "$1" >&3; exec 3>&-; }
BODY
verdict 0
"""


def suite_stub(path: Path, body: str = "") -> Path:
    """SUITE_STUB with ``body`` written to ``path``, executable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SUITE_STUB.replace("BODY", body))
    path.chmod(0o755)
    return path


def _has_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True, timeout=20, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# What load can break in a module that holds more than that, marked `loaded` by name (a module whose
# every test is about it says `pytestmark = pytest.mark.loaded`): the kernel check's death detection
# and what a killed or timed-out check leaves. A name here that its module no longer has fails the run.
LOADED = {"tests/services/test_jupyter_kernel.py": (
    "test_a_kernel_killed_by_a_broken_module_on_its_path_died_and_says_which",
    "test_a_kernel_that_never_answers_times_out_in_its_share_and_leaves_no_process",
    "test_sigterm_to_the_suite_removes_the_kernel_it_started",
    "test_a_post_answered_after_the_probe_gave_up_leaves_no_kernel_after_the_next_run",
    "test_a_suite_killed_mid_check_leaves_no_kernel_after_the_next_run",
    "test_a_kernel_that_dies_at_start_is_seen_within_seconds_even_on_a_busy_machine",
    "test_a_reused_pid_is_never_signalled",
)}


def mark_loaded(items: list[pytest.Item]) -> None:
    found: dict[str, set[str]] = {}
    for item in items:
        module, _, name = item.nodeid.partition("::")
        name = name.split("[")[0]
        if name in LOADED.get(module, ()):
            item.add_marker(pytest.mark.loaded)
        found.setdefault(module, set()).add(name)
    for module, names in LOADED.items():
        if module in found and not set(names) <= found[module]:
            raise pytest.UsageError(f"tests/conftest.py LOADED names what {module} no longer has: "
                                    f"{sorted(set(names) - found[module])}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_loaded(items)
    # The marker, not the keywords: every test in a folder named gpu has the keyword "gpu".
    if any(item.get_closest_marker("gpu") for item in items) and not _has_gpu():
        skip = pytest.mark.skip(reason="needs a real NVIDIA GPU: nvidia-smi -L found none on this machine")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


WHEEL_SOURCES = ("pyproject.toml", "README.md", "healthcheck", "probes")


def build_wheel(into: Path, scratch: Path) -> Path:
    """The suite's wheel, built offline from a copy of the tree in ``scratch`` (the build leaves
    build/ behind there, not here); reproducible: a fixed SOURCE_DATE_EPOCH keeps an image's
    layer cache when nothing changed."""
    src = scratch / "src"
    src.mkdir()
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "-w", str(into), str(src)],
                          capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "SOURCE_DATE_EPOCH": "315532800"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = into.glob("gpu_healthcheck-*.whl")
    return wheel
