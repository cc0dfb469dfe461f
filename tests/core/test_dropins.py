"""Drop-in checks: real executables in a temporary HEALTHCHECK_CHECKS_DIR, run through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from probes import registry
from tests.conftest import ROOT, clean_env
from tests.servers import wait_gone

ALL_OFF = {t: "false" for t in registry.TOGGLES}


def write(directory: Path, name: str, body: str, *, mode: int = 0o755, header: str = "") -> Path:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{header}\n{body}\n")
    path.chmod(mode)
    return path


def run(directory: Path, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    full = clean_env(HEALTHCHECK_CHECKS_DIR=str(directory), HEALTHCHECK_STATE_DIR=str(directory.parent / "state"),
                     **ALL_OFF, **env)
    return subprocess.run([sys.executable, "-m", "probes", *args], env=full, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.fixture
def checks(tmp_path: Path) -> Path:
    d = tmp_path / "healthcheck.d"
    d.mkdir(mode=0o755)
    return d


@pytest.mark.parametrize(("code", "status", "reason", "exit_status"), [
    (0, "pass", None, 0), (1, "warn", "check-warning", 0), (2, "fail", "check-failed", 1),
    (3, "warn", "unknown", 0), (4, "fail", "bad-exit", 1),
])
def test_nagios_exit_codes_and_the_first_line(checks, code, status, reason, exit_status):
    write(checks, "model-loaded", f"echo 'model resnet50 ready | load_time=1.5s;5;10'\necho second line\nexit {code}")
    res = run(checks, "--json")
    assert res.returncode == exit_status, res.stdout + res.stderr
    check = json.loads(res.stdout)["checks"]["model-loaded:status"][0]
    assert check["status"] == status and check["reason"] == reason
    said = check.get("output") or check["message"]  # health+json leaves output out of passing checks
    assert "model resnet50 ready" in said and "second line" not in said
    if code in (0, 1, 2, 3):
        assert check["observedValue"] == 1.5 and check["observedUnit"] == "s"
    text = run(checks).stdout
    assert text.splitlines()[1].startswith(f"{status.upper()} model-loaded ")


@pytest.mark.parametrize("behaviour", ["hang", "ignore-term", "setsid-grandchild"])
def test_a_check_that_hangs_ends_by_its_deadline_and_leaves_nothing(checks, behaviour):
    marker = f"dropin-{behaviour}-{os.getpid()}"
    sleeper = f"{sys.executable} -c 'import time; time.sleep(60)' {marker}"
    body = {
        "hang": f"exec {sleeper}",
        "ignore-term": f"trap '' TERM\n{sleeper}\n{sleeper}",
        # A grandchild in its own session keeps stdout open after the script exits.
        "setsid-grandchild": f"setsid {sleeper} &\necho started\nexit 0",
    }[behaviour]
    write(checks, "stuck", body, header="# healthcheck: timeout=1")
    t0 = time.monotonic()
    res = run(checks, "--json")
    elapsed = time.monotonic() - t0
    check = json.loads(res.stdout)["checks"]["stuck:status"][0]
    if behaviour == "setsid-grandchild":
        assert check["status"] == "pass" and elapsed < 5
    else:
        assert check["status"] == "fail" and check["reason"] == "deadline" and res.returncode == 1
        assert elapsed < 1 + 0.5 + 2.5  # the deadline, its grace, and one interpreter start-up
    assert wait_gone(marker) == []


def test_world_writable_or_foreign_checks_are_not_run_and_named(checks, tmp_path):
    ran = tmp_path / "ran"
    write(checks, "open-check", f"touch {ran}/open", mode=0o777)
    foreign = write(checks, "foreign-check", f"touch {ran}/foreign")
    os.chown(foreign, 65534, 65534)
    os.symlink(foreign, checks / "linked-check")
    ran.mkdir()
    res = run(checks)
    assert res.returncode == 1 and os.listdir(ran) == []
    lines = res.stdout.splitlines()
    assert any(line.startswith("FAIL open-check") and "writable by group or others" in line
               and "chown root and chmod go-w" in line for line in lines), res.stdout
    assert any(line.startswith("FAIL foreign-check") and "owned by uid 65534" in line for line in lines)
    assert any(line.startswith("FAIL linked-check") and "symbolic link" in line for line in lines)


def test_a_directory_writable_by_others_runs_nothing(checks, tmp_path):
    (tmp_path / "ran").mkdir()
    write(checks, "fine", f"touch {tmp_path}/ran/x")
    checks.chmod(0o777)
    res = run(checks)
    assert res.returncode == 1 and not (tmp_path / "ran" / "x").exists()
    assert "writable by group or others" in res.stdout


def test_what_is_not_a_check_is_ignored(checks):
    write(checks, ".hidden", "exit 2")
    write(checks, "backup~", "exit 2")
    write(checks, "old.bak", "exit 2")
    write(checks, "notes", "exit 2", mode=0o644)
    (checks / "subdir").mkdir()
    os.mkfifo(checks / "fifo")
    res = run(checks)
    assert res.returncode == 0 and res.stdout.startswith("healthy: "), res.stdout


def test_profiles_from_the_header_liveness_only_when_declared(checks):
    write(checks, "alive", "echo ok", header="# healthcheck: profiles=liveness,readiness timeout=5")
    write(checks, "ready-only", "echo ok")
    live = run(checks, "--profile", "liveness", "--json")
    assert set(json.loads(live.stdout)["checks"]) == {"alive:status"}
    ready = run(checks, "--json")
    assert set(json.loads(ready.stdout)["checks"]) == {"alive:status", "ready-only:status"}
    start = run(checks, "--profile", "startup", "--json")
    assert set(json.loads(start.stdout)["checks"]) == {"ready-only:status"}


@pytest.mark.parametrize("header", ["# healthcheck: profiles=sometimes", "# healthcheck: timeout=soon",
                                    "# healthcheck: color=blue"])
def test_a_bad_header_is_a_failure_that_says_what_is_accepted(checks, header, tmp_path):
    write(checks, "odd", f"touch {tmp_path}/ran", header=header)
    res = run(checks)
    assert res.returncode == 1 and not (tmp_path / "ran").exists()
    assert "FAIL odd" in res.stdout and "accepted:" in res.stdout


def test_toggle_only_and_skip_work_for_drop_ins(checks):
    write(checks, "gpu.mem-ok", "echo fine")
    write(checks, "failing", "echo broken\nexit 2")
    assert run(checks).returncode == 1
    res = run(checks, ENABLE_FAILING_CHECK="false")
    assert res.returncode == 0 and "gpu.mem-ok" in res.stdout and "failing" not in res.stdout
    assert run(checks, "--skip", "failing").returncode == 0
    only = run(checks, "--only", "failing")
    assert only.returncode == 1 and "gpu.mem-ok" not in only.stdout
    bad = run(checks, ENABLE_GPU_MEM_OK_CHECK="maybe")
    assert bad.returncode == 3 and "ENABLE_GPU_MEM_OK_CHECK='maybe' is not a boolean" in bad.stderr
    assert run(checks, "--only", "nosuch").returncode == 3


def test_fifty_chatty_drop_ins_keep_the_output_under_4096_bytes_verdict_first(checks):
    for i in range(50):
        write(checks, f"chatty-{i:02d}", f"printf 'check {i} says %01000d\\n' 0\nexit {2 if i == 7 else 0}")
    res = run(checks, timeout=120)
    assert res.returncode == 1
    assert len(res.stdout.encode()) < 4096
    assert res.stdout.startswith("unhealthy: chatty-07: check 7 says")


def test_a_script_without_a_shebang_cannot_start(checks):
    path = checks / "noshebang"
    path.write_text("echo hi\n")
    path.chmod(0o755)
    res = run(checks)
    assert res.returncode == 1 and "FAIL noshebang" in res.stdout and "#! line" in res.stdout


def test_a_missing_or_empty_directory_changes_nothing(tmp_path):
    for d in (tmp_path / "missing", tmp_path):
        res = run(d if d.name == "missing" else tmp_path / "empty", "--json")
        assert res.returncode == 0 and json.loads(res.stdout)["checks"] == {}
