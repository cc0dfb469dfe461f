"""End to end: docs/image.md's "add it to your own image" lines on an image NOT built from our Dockerfile.

tests/e2e/adopt/Dockerfile is a plain training-style image (the CPU base with torch, no
Jupyter, no sshd, no tini) plus only docs/image.md's lines: the suite's wheel in its own virtual
environment, the HEALTHCHECK, and the ENABLE_* toggles for the services it lacks. It must
reach `healthy`, turn `unhealthy` with our reason first once torch is broken inside it, show
the HEALTHCHECK in `docker inspect`, and answer `healthcheck --help` and the documented exit
codes inside.
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from typing import Callable

import pytest
from conftest import (
    DOCUMENTED,
    HERE,
    LABEL,
    SESSION,
    Health,
    build_image,
    docker,
    exec_in,
    health_of,
    inspect,
    last_output,
    wait_for_health,
)

from tests.conftest import build_wheel

pytestmark = pytest.mark.e2e

ADOPT = HERE / "adopt"
TAG = os.environ.get("E2E_ADOPT_IMAGE", "gpu-dev-e2e/adopt:latest")
# As in test_image.py: the image's --timeout stays, interval and retries shrink.
FAST = Health(interval="2s", start_period="60s", start_interval="1s", retries=2)


@pytest.fixture(scope="session")
def adopt_image(docker_engine: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    ctx = tmp_path_factory.mktemp("adopt-context")
    shutil.copy2(ADOPT / "Dockerfile", ctx / "Dockerfile")
    build_wheel(ctx, tmp_path_factory.mktemp("adopt-src"))
    build_image(TAG, ctx)
    return TAG


@pytest.fixture(scope="session")
def image(adopt_image: str) -> str:
    """conftest's start_container starts this image in this module."""
    return adopt_image


@pytest.fixture
def start(start_container: Callable[..., str]) -> Callable[..., str]:
    """A training container gets a real /dev/shm (DataLoader workers, NCCL), as docs/image.md says."""
    return functools.partial(start_container, "--shm-size=2g")


def test_the_readme_lines_alone_add_the_suite(adopt_image: str) -> None:
    config = inspect(adopt_image)["Config"]
    hc = config["Healthcheck"]
    assert hc["Test"] == ["CMD", "/usr/local/bin/healthcheck"]
    assert (hc["Interval"] / 1e9, hc["Timeout"] / 1e9, hc["StartPeriod"] / 1e9, hc["StartInterval"] / 1e9,
            hc["Retries"]) == DOCUMENTED
    env = dict(e.split("=", 1) for e in config["Env"])
    assert (env.get("ENABLE_JUPYTER_CHECK"), env.get("ENABLE_SSH_CHECK")) == ("false", "false")
    assert "ENABLE_GPU_CHECK" not in env, "a GPU image keeps the GPU checks"
    assert config["Cmd"][0] == "python3", "the image's own workload, not ours"
    assert not any("tini" in part for part in config.get("Entrypoint") or []), "no init of ours"
    # What the HEALTHCHECK runs is there: the command pip installed, linked onto PATH.
    helped = docker("run", "--rm", "--label", f"{LABEL}={SESSION}", "--no-healthcheck", adopt_image,
                    "/usr/local/bin/healthcheck", "--help", check=False)
    assert helped.returncode == 0 and "Exit status: 0 healthy" in helped.stdout, helped.stdout + helped.stderr


def test_healthy_then_unhealthy_with_our_reason_when_torch_breaks(start) -> None:  # type: ignore[no-untyped-def]
    # TTL 0: every readiness probe runs the tensor op afresh, so the broken torch shows at once.
    cid = start(env={"HEALTHCHECK_TORCH_TTL": "0"}, health=FAST)
    wait_for_health(cid, "healthy", timeout=60)
    out = last_output(cid)
    assert out.startswith("healthy") and "PASS torch-cuda" in out, out
    assert "jupyter" not in out and "PASS ssh" not in out, "the toggles turned the services off"

    where = exec_in(cid, "python3", "-c", "import os, torch; print(os.path.dirname(torch.__file__))").stdout.strip()
    assert where.endswith("/torch"), where
    exec_in(cid, "mv", where, where + ".moved")
    t0 = time.monotonic()
    wait_for_health(cid, "unhealthy", timeout=35 + 2 * (2 + 35))
    out = last_output(cid)
    assert out.startswith("unhealthy: torch-cuda:"), out
    assert "FAIL torch-cuda" in out, out
    assert health_of(cid)["Log"][-1]["ExitCode"] == 1
    assert time.monotonic() - t0 < 60
    # The workload itself, which imported torch before, still runs: only the probe saw it.
    assert inspect(cid)["State"]["Running"]


def test_inside_the_image_the_command_behaves_as_documented(start) -> None:  # type: ignore[no-untyped-def]
    cid = start(healthcheck=False)
    helped = exec_in(cid, "healthcheck", "--help")
    assert helped.stdout.startswith("usage: healthcheck ") and "torch-cuda (framework" in helped.stdout, \
        helped.stdout
    assert exec_in(cid, "readlink", "-f", "/usr/local/bin/healthcheck").stdout.strip() == \
        "/opt/healthcheck/bin/healthcheck"
    assert exec_in(cid, "/opt/healthcheck/bin/python", "-c", "import torch", check=False).returncode != 0, \
        "the suite's environment has no torch of its own"

    ok = exec_in(cid, "healthcheck", check=False)
    assert ok.returncode == 0 and ok.stdout.startswith("healthy"), ok.stdout + ok.stderr
    # sshd is absent: asked for anyway, the probe fails with its reason (exit 1).
    ssh = exec_in(cid, "healthcheck", "--only", "ssh", check=False)
    assert ssh.returncode == 1 and ssh.stdout.startswith("unhealthy: ssh:"), ssh.stdout
    # Usage and configuration errors: 3, one line on stderr, no traceback.
    for argv in (("healthcheck", "--profile", "nope"), ("env", "ENABLE_TORCH_CHECK=maybe", "healthcheck")):
        bad = exec_in(cid, *argv, check=False)
        assert bad.returncode == 3 and bad.stderr.startswith("healthcheck: "), bad.stderr
        assert "Traceback" not in bad.stdout + bad.stderr
    # A user's PYTHONPATH cannot reach the suite (isolated mode).
    exec_in(cid, "bash", "-c", "mkdir -p /tmp/evil/probes && echo 'raise SystemExit(2)' >/tmp/evil/probes/__init__.py")
    shadow = exec_in(cid, "env", "PYTHONPATH=/tmp/evil", "healthcheck", check=False)
    assert shadow.returncode == 0 and shadow.stdout.startswith("healthy"), shadow.stdout
