"""End to end: the image's SSH checks. The built-in HEALTHCHECK logs in for real with the probe
principal, and readiness reuses that pass for HEALTHCHECK_SSH_LOGIN_TTL; a world-writable home of the
dev user (sshd's StrictModes) and a removed probe key make it unhealthy with their own reasons first
(the key once the cached pass is older than the TTL), and fixing them makes it healthy again."""

from __future__ import annotations

import json
import time

import pytest
from conftest import Health, docker, exec_in, health_of, last_output, record_timing, wait_for_health

pytestmark = pytest.mark.e2e

FAST = Health(interval="2s", start_period="60s", start_interval="1s", retries=2)
WORST = 2 * (2 + 35) + 35  # seconds: two failing runs at the image's --timeout, plus one interval
TTL = 10  # seconds a passing login is reused here (HEALTHCHECK_SSH_LOGIN_TTL): a revoked key shows in time


def failing(cid: str) -> list[str]:
    """The reasons of the failing checks of one readiness run in the container, in report order."""
    report = json.loads(exec_in(cid, "healthcheck", "--json", check=False).stdout)
    return [c["reason"] for checks in report["checks"].values() for c in checks if c["status"] == "fail"]


def test_real_probe_login_then_strict_modes_then_auth_failed(start_container) -> None:  # type: ignore[no-untyped-def]
    cid = start_container(health=FAST, env={"HEALTHCHECK_SSH_LOGIN_TTL": str(TTL)})
    wait_for_health(cid, "healthy", timeout=90)
    out = last_output(cid)
    assert out.startswith("healthy:") and "PASS ssh-login" in out and "PASS ssh-keys" in out, out
    assert "logged in as healthcheck" in out

    # The probe key is root's alone and never printed; its principal can only run /bin/true.
    mode = exec_in(cid, "stat", "-c", "%U %a", "/run/healthcheck-ssh/id_ed25519", "/run/healthcheck-ssh").stdout
    assert mode.split() == ["root", "600", "root", "700"], mode
    private = exec_in(cid, "cat", "/run/healthcheck-ssh/id_ed25519").stdout.splitlines()[2]
    authorized = exec_in(cid, "cat", "/run/healthcheck-ssh-home/.ssh/authorized_keys").stdout
    assert authorized.startswith('restrict,from="127.0.0.1,::1",command="/bin/true" ssh-ed25519 '), authorized
    timed = exec_in(cid, "healthcheck", "--only", "ssh,ssh-login", "--json", "--profile", "startup")
    assert timed.returncode == 0, timed.stdout
    cached = exec_in(cid, "healthcheck", "--only", "ssh,ssh-login")  # readiness, just after a login
    assert "PASS ssh-login" in cached.stdout and "(cached, " in cached.stdout, cached.stdout

    home = exec_in(cid, "bash", "-c", "getent passwd dev | cut -d: -f6").stdout.strip()
    t0 = time.monotonic()
    exec_in(cid, "chmod", "0777", home)
    wait_for_health(cid, "unhealthy", timeout=WORST)
    record_timing("ssh_strict_modes_to_unhealthy_s_interval2_retries2", round(time.monotonic() - t0, 2))
    out = last_output(cid)
    assert out.startswith("unhealthy: ssh-keys:"), out
    assert f"chmod go-w {home}" in out and "mode 0777" in out, out
    assert failing(cid) == ["ssh-strict-modes"]
    exec_in(cid, "chmod", "0755", home)
    wait_for_health(cid, "healthy", timeout=WORST)

    exec_in(cid, "truncate", "-s", "0", "/run/healthcheck-ssh-home/.ssh/authorized_keys")
    wait_for_health(cid, "unhealthy", timeout=WORST + TTL)
    out = last_output(cid)
    assert out.startswith("unhealthy: ssh-login:") and "refused the probe key" in out, out
    assert failing(cid) == ["ssh-auth-failed"]

    for entry in health_of(cid)["Log"]:
        assert private not in entry["Output"]
    logs = docker("logs", cid)
    assert private not in logs.stdout + logs.stderr
