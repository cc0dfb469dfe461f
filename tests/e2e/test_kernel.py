"""End to end: the image's HEALTHCHECK starts its default Jupyter kernel, and a broken package the
notebook user installs under ~/.local (which the kernel's Python finds first) makes the container
unhealthy with kernel-died, until it is removed. No kernel is ever left in api/kernels."""

from __future__ import annotations

import json

import pytest
from conftest import Health, exec_in, last_output, record_timing, wait_for_health

pytestmark = pytest.mark.e2e

FAST = Health(interval="2s", start_period="120s", start_interval="1s", retries=2)
# The kernels the server runs, asked as the notebook user with the token the entrypoint wrote.
KERNELS = ("import json, urllib.request\n"
           "token = open('/run/jupyter/token').read().strip()\n"
           "req = urllib.request.Request('http://127.0.0.1:8888/api/kernels',\n"
           "                             headers={'Authorization': 'token ' + token})\n"
           "opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))\n"
           "print(json.dumps([k['id'] for k in json.load(opener.open(req, timeout=10))]))\n")


def kernels(cid: str) -> list[str]:
    out: list[str] = json.loads(exec_in(cid, "python3", "-c", KERNELS, user="dev").stdout)
    return out


def no_kernel_left(cid: str, within: float = 30.0) -> None:
    """Every kernel listed now is gone within ``within`` seconds: the HEALTHCHECK (every 2 s here)
    may have one running at any moment, but none stays."""
    import time

    listed = set(kernels(cid))
    end = time.monotonic() + within
    while listed & set(kernels(cid)):
        assert time.monotonic() < end, f"kernels left in api/kernels: {sorted(listed & set(kernels(cid)))}"
        time.sleep(0.5)


def check(cid: str) -> dict[str, object]:
    """One startup run of jupyter-kernel inside the container, as the HEALTHCHECK runs it (root)."""
    res = exec_in(cid, "healthcheck", "--profile", "startup", "--only", "jupyter-kernel", "--json",
                  check=False, timeout=90)
    entry: dict[str, object] = json.loads(res.stdout)["checks"]["jupyter-kernel:startTime"][0]
    return entry


def test_default_kernel_checked_broken_user_package_unhealthy_then_healthy(start_container) -> None:  # type: ignore[no-untyped-def]
    # TTL 0: every readiness run starts a kernel, so the plant is seen at the next one.
    cid = start_container(env={"HEALTHCHECK_JUPYTER_KERNEL_TTL": "0"}, health=FAST)
    wait_for_health(cid, "healthy", 240)
    first = check(cid)
    assert first["status"] == "pass", first
    assert "verified matmul on cpu" in str(first["message"]), first
    record_timing("jupyter_kernel_check_s", first["observedValue"])
    no_kernel_left(cid)

    site = exec_in(cid, "python3", "-c", "import site; print(site.getusersitepackages())",
                   user="dev").stdout.strip()
    # pytorch/pytorch's conda Python puts the user's site-packages before its own; the e2e base's
    # venv (--system-site-packages) puts them after, so a .pth file there puts the broken module
    # first, as a user's `pip install --user` of a broken package does in the real image.
    plant = (f"mkdir -p '{site}/broken' && echo \"raise ImportError('broken by the user')\" > "
             f"'{site}/broken/comm.py' && echo \"import sys; sys.path.insert(0, '{site}/broken')\" > "
             f"'{site}/zz-broken.pth'")
    exec_in(cid, "sh", "-c", plant, user="dev")
    wait_for_health(cid, "unhealthy", 120)
    output = last_output(cid)
    assert output.splitlines()[0].startswith("unhealthy:") and "jupyter-kernel" in output.splitlines()[0], output
    broken = check(cid)
    assert (broken["status"], broken.get("reason")) == ("fail", "kernel-died"), broken
    assert "ImportError: broken by the user" in str(broken.get("output")), broken
    no_kernel_left(cid)

    exec_in(cid, "rm", "-rf", f"{site}/zz-broken.pth", f"{site}/broken", user="dev")
    wait_for_health(cid, "healthy", 120)
    no_kernel_left(cid)
