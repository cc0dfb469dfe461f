"""End to end: the image as hardened runtimes run it (docs/kubernetes.md, "Runs anywhere"): a
read-only root with only the tmpfs mounts the docs name, an arbitrary UID with GID 0 and no passwd
entry (OpenShift), and a read-only, unmounted /tmp where the state dir falls back to /dev/shm, or
to caching off when nothing is writable, never to an internal error.
"""

from __future__ import annotations

import pytest
from conftest import ROOT, Health, docker, exec_in, last_output, wait_for_health

pytestmark = pytest.mark.e2e

FAST = Health(interval="2s", start_period="90s", start_interval="1s", retries=2)
# The read-only run exactly as docs/kubernetes.md writes it.
READ_ONLY = "docker run --read-only --tmpfs /run --tmpfs /tmp"
UID = "12345"
QUIET = ("env", "ENABLE_JUPYTER_CHECK=false", "ENABLE_SSH_CHECK=false")  # the state dir is what is judged here


def mode_and_owner(cid: str, path: str) -> list[str]:
    return exec_in(cid, "stat", "-c", "%a %u", path).stdout.split()


def test_read_only_root_with_the_documented_tmpfs_mounts_reaches_healthy(start_container) -> None:  # type: ignore[no-untyped-def]
    assert READ_ONLY in (ROOT / "docs" / "kubernetes.md").read_text(), "the docs name other mounts"
    # The user's keys need a volume at the dev user's home on a read-only root (docs/image.md): none here.
    cid = start_container(*READ_ONLY.split()[2:], env={"SSH_AUTHORIZED_KEYS": ""}, health=FAST)
    wait_for_health(cid, "healthy", timeout=120)
    out = last_output(cid)
    for check in ("PASS torch-cuda", "PASS jupyter", "PASS ssh ", "PASS ssh-login"):
        assert check in out, out
    assert "caching off" not in out, out
    assert mode_and_owner(cid, "/run/healthcheck") == ["700", "0"]
    assert "host keys made in /run/ssh-host-keys" in docker("logs", cid).stderr
    assert exec_in(cid, "touch", "/etc/x", check=False).returncode != 0, "the root file system is writable"


def test_an_arbitrary_uid_without_a_passwd_entry_reaches_healthy(start_container) -> None:  # type: ignore[no-untyped-def]
    cid = start_container("--user", f"{UID}:0", env={"ENABLE_SSH_CHECK": "false"}, health=FAST)
    wait_for_health(cid, "healthy", timeout=120)
    out = last_output(cid)
    assert "PASS torch-cuda" in out and "PASS jupyter" in out and "caching off" not in out, out
    assert exec_in(cid, "getent", "passwd", UID, check=False).returncode != 0, "the uid has a passwd entry"
    assert mode_and_owner(cid, f"/tmp/healthcheck-{UID}") == ["700", UID]  # /run is root's
    assert "sshd is not started" in docker("logs", cid).stderr


def test_read_only_unmounted_tmp_falls_back_to_dev_shm_then_caching_off(start_container) -> None:  # type: ignore[no-untyped-def]
    """Root's runs keep /run/healthcheck; another uid exec'd in (whose /run/healthcheck is root's and
    whose /tmp is read-only) lands in /dev/shm, and with /dev/shm closed too runs with caching off."""
    # With /tmp read-only Jupyter Server cannot list kernelspecs (HTTP 500): no notebook kernel can
    # start there, and the jupyter-kernel probe says so; the state dir is what this test is about.
    cid = start_container("--read-only", "--tmpfs", "/run", health=FAST,
                          env={"SSH_AUTHORIZED_KEYS": "", "ENABLE_JUPYTER_KERNEL_CHECK": "false"})
    wait_for_health(cid, "healthy", timeout=120)
    exec_in(cid, "chmod", "0755", "/dev/shm")
    for profile in ("liveness", "readiness"):
        res = exec_in(cid, *QUIET, "healthcheck", "--profile", profile, user=f"{UID}:0", check=False)
        assert res.returncode == 0 and res.stdout.startswith("healthy"), (profile, res.stdout, res.stderr)
        assert "internal error" not in res.stdout + res.stderr and "Traceback" not in res.stderr
        assert "caching off: no writable state dir" in res.stdout, res.stdout
    exec_in(cid, "chmod", "1777", "/dev/shm")
    res = exec_in(cid, *QUIET, "healthcheck", user=f"{UID}:0", check=False)
    assert res.returncode == 0 and "caching off" not in res.stdout, res.stdout
    assert mode_and_owner(cid, f"/dev/shm/healthcheck-{UID}") == ["700", UID]
    cached = exec_in(cid, *QUIET, "healthcheck", user=f"{UID}:0", check=False)
    assert cached.returncode == 0 and "(cached, " in cached.stdout, cached.stdout
    assert mode_and_owner(cid, "/run/healthcheck") == ["700", "0"]
