"""The probes as an exec probe runs them: ``docker exec`` into a running container of the test image.

``docker exec <c> true`` is the floor (the engine's own cost of an exec); liveness and cached
readiness are measured against it, interleaved, in one container of our own name that is removed
at the end. Without an engine that answers, or without the image, the case is skipped with a line.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
from typing import Any

IMAGE = os.environ.get("E2E_IMAGE", "gpu-dev:e2e")  # what tests/e2e builds
CPU_ENV = ("ENABLE_GPU_CHECK=false", "HEALTHCHECK_TORCH_DEVICE=cpu")  # no GPU in the bench
EXEC_FLOOR_FACTOR = 1.7
READY_WAIT = 180.0
CASES = (("docker exec: true (floor)", ["true"]),
         ("docker exec: liveness", ["healthcheck", "--profile", "liveness"]),
         ("docker exec: readiness (torch cached)", ["healthcheck", "--profile", "readiness"]))


def _docker(*argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=timeout, check=False)


def unavailable() -> str | None:
    """Why the case cannot run here, or None."""
    if shutil.which("docker") is None:
        return "no docker CLI"
    try:
        if _docker("info", timeout=15).returncode != 0:
            return "no Docker engine answers (tests/e2e/engine.sh starts one)"
        if _docker("image", "inspect", IMAGE, timeout=15).returncode != 0:
            return f"no image {IMAGE} (make e2e builds it)"
    except subprocess.TimeoutExpired:
        return "the Docker engine did not answer within 15 s"
    return None


def _timed(name: str, argv: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    code = _docker("exec", name, *argv, timeout=120).returncode
    return (time.perf_counter() - start) * 1000, code


def _wait_ready(name: str) -> None:
    """Readiness passes once: Jupyter and sshd answer and a torch result is cached."""
    deadline = time.monotonic() + READY_WAIT
    while _timed(name, CASES[2][1])[1] != 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"readiness did not pass within {READY_WAIT:g} s in {IMAGE}")
        time.sleep(2)


def run(runs: int) -> dict[str, Any]:
    """Interleaved samples of each case; {} and a reason when skipped."""
    why = unavailable()
    if why:
        return {"skipped": why}
    name = f"healthcheck-bench-{os.getpid()}"
    env = [a for kv in CPU_ENV for a in ("-e", kv)]
    started = _docker("run", "-d", "--name", name, "--no-healthcheck", *env, IMAGE, timeout=120)
    if started.returncode != 0:
        return {"skipped": f"docker run failed: {started.stderr.strip()[:200]}"}
    try:
        _wait_ready(name)
        wall: dict[str, list[float]] = {case: [] for case, _ in CASES}
        failures = dict.fromkeys(wall, 0)
        for _ in range(runs):
            for case, argv in CASES:
                ms, code = _timed(name, argv)
                wall[case].append(round(ms, 2))
                failures[case] += code != 0
        return {"image": IMAGE, "runs": runs,
                "cases": {c: {"wall_ms": w, "failures": failures[c]} for c, w in wall.items()}}
    finally:
        _docker("rm", "-f", name, timeout=60)


def summary(result: dict[str, Any]) -> tuple[list[str], list[tuple[str, bool, str]]]:
    """Lines for the table and (target, met, detail) for each check."""
    if "skipped" in result:
        return [f"docker exec: skipped: {result['skipped']}"], []
    cases = result["cases"]
    floor = statistics.median(cases[CASES[0][0]]["wall_ms"])
    lines = [f"docker exec ({result['image']}, {result['runs']} runs each, interleaved):"]
    targets = []
    for case, data in cases.items():
        med = statistics.median(data["wall_ms"])
        lines.append(f"  {case:<40} median {med:8.1f} ms  {med / floor:5.2f}x floor  "
                     f"failures {data['failures']}")
        if case != CASES[0][0]:
            targets.append((f"{case} median <= {EXEC_FLOOR_FACTOR:g}x docker exec true",
                            med <= EXEC_FLOOR_FACTOR * floor and not data["failures"],
                            f"{med:.1f} ms vs {EXEC_FLOOR_FACTOR * floor:.1f} ms "
                            f"({med / floor:.2f}x {floor:.1f} ms)"))
    return lines, targets
