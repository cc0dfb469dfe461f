"""End to end: the person at the keyboard is told (docs/image.md, "Notices"). The checks are run
through `docker exec` as the HEALTHCHECK runs them (root, the image's environment), the GPU layer
turned on or off in each run's environment (there is no GPU here), so one container goes healthy,
unhealthy and healthy again. A healthy container shows nothing in its log, at an interactive SSH
login of `dev` (a real sshd, the system ssh client with a terminal) or in the first cell of a
kernel started through its Jupyter Server; an unhealthy one says the cause once in `docker logs`,
at the login and in the notebook; repaired, one "healthy again" line and silence elsewhere."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import docker, exec_in

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
KERNEL_CLIENT = (HERE.parent / "notice_kernel.py").read_text()
CAUSE = "nvidia-smi: "  # ENABLE_GPU_CHECK=true where there is no GPU: nvidia-smi is not found


def check(cid: str, gpu: bool) -> int:
    """One readiness run, as the HEALTHCHECK runs it, with the GPU layer on or off."""
    return exec_in(cid, "env", f"ENABLE_GPU_CHECK={str(gpu).lower()}", "healthcheck", check=False,
                   timeout=90).returncode


def told(cid: str) -> list[str]:
    logs = docker("logs", cid)
    return [line for line in (logs.stdout + logs.stderr).splitlines() if line.startswith("gpu-health:")]


def login(port: str, key: Path) -> str:
    """An interactive login of `dev` (a terminal forced with -tt), which exits at once."""
    res = subprocess.run(["ssh", "-tt", "-F", "/dev/null", "-p", port, "-i", str(key), "-o", "BatchMode=yes",
                          "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no",
                          "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "dev@127.0.0.1"],
                         input="exit\n", capture_output=True, text=True, timeout=60, check=False,
                         env={"PATH": "/usr/bin:/bin", "TERM": "xterm"})
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout + res.stderr


def first_cell(cid: str) -> dict[str, str]:
    """The first cell a person runs in a new kernel of the server's default kernelspec, as `dev`."""
    token = exec_in(cid, "cat", "/run/jupyter/token").stdout.strip()
    res = exec_in(cid, "/opt/healthcheck/.venv/bin/python", "-", "http://127.0.0.1:8888/", token, "",
                  json.dumps([["print('ran')", True]]), user="dev", input=KERNEL_CLIENT, timeout=120)
    cells: list[dict[str, str]] = json.loads(res.stdout)
    return cells[0]


def test_the_verdict_is_told_once_at_login_and_in_the_notebook_then_repaired(start_container, tmp_path):  # type: ignore[no-untyped-def]
    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    cid = start_container("-p", "127.0.0.1::22", healthcheck=False,
                          env={"SSH_AUTHORIZED_KEYS": (tmp_path / "id.pub").read_text().strip()})
    port = docker("port", cid, "22/tcp").stdout.split(":")[-1].strip()
    end = time.monotonic() + 120
    while check(cid, gpu=False) != 0:  # the services start; failures here are the start's
        assert time.monotonic() < end, exec_in(cid, "healthcheck", check=False).stdout
        time.sleep(1)

    # Healthy: nothing anywhere.
    assert told(cid) == []
    assert "gpu-health" not in login(port, key)
    cell = first_cell(cid)
    assert cell["stdout"] == "ran\n" and "gpu-health" not in cell["stderr"], cell

    # Unhealthy: the cause once in the log however many runs fail, at login and in the notebook.
    assert [check(cid, gpu=True) for _ in range(3)] == [1, 1, 1]
    lines = told(cid)
    assert len(lines) == 1 and lines[0].startswith("gpu-health: unhealthy since ") and CAUSE in lines[0], lines
    assert "you can fix this: start the container with --gpus all" in lines[0]
    notice = exec_in(cid, "stat", "-c", "%U %a", "/run/healthcheck-notice", "/run/healthcheck-notice/notice")
    assert notice.stdout.split() == ["root", "755", "root", "644"]
    shown = [line for line in login(port, key).splitlines() if line.startswith("gpu-health:")]
    assert len(shown) == 2 and CAUSE in shown[0] and "(checked " in shown[0], shown
    assert shown[1].startswith("gpu-health: you can fix this: start the container with --gpus all"), shown
    cell = first_cell(cid)
    assert cell["stdout"] == "ran\n" and CAUSE in cell["stderr"] and "you can fix this" in cell["stderr"], cell

    # Repaired: one "healthy again", then silence.
    assert [check(cid, gpu=False) for _ in range(2)] == [0, 0]
    lines = told(cid)
    assert len(lines) == 2 and lines[1].startswith("gpu-health: healthy again at "), lines
    assert "gpu-health" not in login(port, key)
    assert "gpu-health" not in first_cell(cid)["stderr"]
