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


# A non-interactive shell's asynchronous command: started with SIGINT (and SIGQUIT) ignored.
IN_THE_BACKGROUND = ("bash", "-c", '"$@" & wait "$!"', "in-the-background")


def run(directory: Path, *args: str, timeout: float = 60, via: tuple[str, ...] = (),
        **env: str) -> subprocess.CompletedProcess[str]:
    full = clean_env(**{"HEALTHCHECK_CHECKS_DIR": str(directory), "HEALTHCHECK_STATE_DIR": str(directory.parent / "state"),
                        **ALL_OFF, **env})
    return subprocess.run([*via, sys.executable, "-m", "probes", *args], env=full, cwd=ROOT, capture_output=True,
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
    if code:  # the image owner wrote the check and what it checks: a tenant's to act on
        assert check["actor"] == "tenant" and check["action"] in ("fix-config", "retry"), check
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


# ---------------------------------------------------------------- a name whose toggle is taken

@pytest.mark.parametrize(("name", "toggle"), [("gpu", "ENABLE_GPU_CHECK"), ("torch", "ENABLE_TORCH_CHECK"),
                                              ("GPU", "ENABLE_GPU_CHECK"), ("Torch", "ENABLE_TORCH_CHECK"),
                                              ("model", None)])
def test_a_drop_in_whose_toggle_is_a_built_in_one_is_reported_even_when_that_toggle_is_off(checks, tmp_path, name,
                                                                                            toggle):
    (tmp_path / "ran").mkdir()
    write(checks, name, f"touch {tmp_path}/ran/{name}")
    write(checks, "other", "echo fine")
    res = run(checks, "--json")  # every built-in toggle is false here, ENABLE_GPU_CHECK and ENABLE_TORCH_CHECK too
    assert res.returncode == 1 and os.listdir(tmp_path / "ran") == [], res.stdout
    doc = json.loads(res.stdout)
    check = doc["checks"][f"drop-in-{name}:status"][0]
    assert check["status"] == "fail" and check["reason"] == "bad-check", check
    assert (toggle or "built-in probe") in check["output"] and "rename the file" in check["output"]
    assert doc["checks"]["other:status"][0]["status"] == "pass"


def test_two_drop_ins_never_share_a_toggle(checks, tmp_path):
    (tmp_path / "ran").mkdir()
    write(checks, "disk-ok", f"touch {tmp_path}/ran/dash")
    write(checks, "disk.ok", f"touch {tmp_path}/ran/dot")
    res = run(checks, ENABLE_DISK_OK_CHECK="false")
    assert res.returncode == 1 and os.listdir(tmp_path / "ran") == [], res.stdout
    assert "FAIL drop-in-disk.ok" in res.stdout and "share its toggle ENABLE_DISK_OK_CHECK with the drop-in 'disk-ok'" \
        in res.stdout


# ---------------------------------------------------------------- a path another user controls

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="makes files owned by another user: needs root")
OTHER = 65534


def world(tmp_path: Path) -> Path:
    """A world-writable sticky directory, as /tmp is."""
    d = tmp_path / "world"
    d.mkdir()
    d.chmod(0o1777)
    return d


def their_link(at: Path, target: Path) -> Path:
    at.symlink_to(target)
    os.lchown(at, OTHER, OTHER)
    return at


def untrusted_layouts(tmp_path: Path, checks: Path) -> dict[str, tuple[Path, str]]:
    """HEALTHCHECK_CHECKS_DIR values that lead to ``checks`` through something another user controls,
    each with what the failure must name."""
    w = world(tmp_path)
    layouts = {"their link in a sticky dir": (their_link(w / "checks", checks), f"{w}/checks is a symbolic link "
                                                                                 f"owned by uid {OTHER}")}
    their_link(w / "mid", tmp_path)
    layouts["their link mid-path"] = (w / "mid" / checks.name, f"{w}/mid is a symbolic link owned by uid {OTHER}")
    (w / "root-link").symlink_to(w / "theirs")
    their_link(w / "theirs", checks)
    layouts["root's link to their link"] = (w / "root-link", f"{w}/theirs is a symbolic link owned by uid {OTHER}")
    theirs = tmp_path / "their-dir"
    theirs.mkdir()
    os.chown(theirs, OTHER, OTHER)
    (theirs / "checks").symlink_to(checks)
    layouts["their directory on the way"] = (theirs / "checks", f"{theirs} is owned by uid {OTHER}")
    group = tmp_path / "group-writable"
    group.mkdir()
    group.chmod(0o775)
    (group / "checks").symlink_to(checks)
    layouts["a group-writable directory on the way"] = (group / "checks", f"{group} is writable by group or "
                                                                           "others (mode 775)")
    sticky = w / "sticky-checks"
    sticky.mkdir()
    sticky.chmod(0o1777)
    write(sticky, "ran-from-sticky", f"touch {tmp_path}/ran/sticky")
    layouts["the checks dir itself world-writable, even sticky"] = (sticky, f"{sticky} is writable by group or "
                                                                            "others (mode 1777)")
    return layouts


@needs_root
def test_a_checks_dir_reached_through_what_another_user_controls_runs_nothing(checks, tmp_path):
    (tmp_path / "ran").mkdir()
    write(checks, "root-owned-tool", f"touch {tmp_path}/ran/tool")
    for layout, (path, named) in untrusted_layouts(tmp_path, checks).items():
        res = run(checks, HEALTHCHECK_CHECKS_DIR=str(path))
        assert os.listdir(tmp_path / "ran") == [], (layout, res.stdout)
        assert res.returncode == 1 and res.stdout.startswith("unhealthy: drop-ins: untrusted: "), (layout, res.stdout)
        assert named in res.stdout and "nothing in it is run" in res.stdout, (layout, res.stdout)
        assert "root-owned-tool" not in res.stdout and "ran-from-sticky" not in res.stdout  # not even listed


@needs_root
def test_roots_link_and_a_sticky_directory_on_the_way_are_trusted_but_their_link_is_not(checks, tmp_path):
    (tmp_path / "ran").mkdir()
    write(checks, "tool", f"touch {tmp_path}/ran/tool")
    w = world(tmp_path)
    (w / "roots").symlink_to(checks)  # root's own link in /tmp: followed
    inside = w / "inside"  # a root-owned directory inside a sticky world-writable one
    inside.mkdir()
    write(inside, "tool", f"touch {tmp_path}/ran/inside")
    for path, ran in ((w / "roots", "tool"), (inside, "inside")):
        res = run(checks, HEALTHCHECK_CHECKS_DIR=str(path))
        assert res.returncode == 0 and (tmp_path / "ran" / ran).exists(), res.stdout
    their_link(w / "theirs", checks)
    (tmp_path / "ran" / "tool").unlink()
    res = run(checks, HEALTHCHECK_CHECKS_DIR=str(w / "theirs"))
    assert res.returncode == 1 and not (tmp_path / "ran" / "tool").exists(), res.stdout


# SIGTERM to one of the suite's threads other than the main one (tgkill), as the kernel may pick
# for a kill(1) under load: only the main thread runs a handler, and it must not sleep through it.
TGKILL = {"x86_64": 234, "aarch64": 131}
AT_ANOTHER_THREAD = f"""#!{sys.executable}
import ctypes, os, time
parent = os.getppid()
tids = [int(t) for t in os.listdir(f"/proc/{{parent}}/task") if int(t) != parent]
ctypes.CDLL(None).syscall({TGKILL.get(os.uname().machine, 0)}, parent, tids[0], 15)
time.sleep(5)
print("late")
"""


@pytest.mark.parametrize("signal", ["TERM", "INT", "INT, started with SIGINT ignored", "TERM at another thread"])
def test_a_drop_in_that_signals_the_suite_leaves_a_verdict_at_once_without_the_front_door(checks, signal):
    """Started with SIGINT ignored (a script's `healthcheck-probes &`, a CI job run in the
    background), the suite still ends on a SIGINT: an interpreter keeps an ignored SIGINT."""
    if signal == "TERM at another thread":
        if os.uname().machine not in TGKILL:
            pytest.skip(f"no tgkill number known for {os.uname().machine}")
        (checks / "rude").write_text(AT_ANOTHER_THREAD)
        (checks / "rude").chmod(0o755)
    else:
        write(checks, "rude", f"kill -{signal.split(',')[0]} $PPID\nsleep 5\necho late")
    t0 = time.monotonic()
    res = run(checks, via=IN_THE_BACKGROUND if "ignored" in signal else ())
    assert res.returncode == 1 and time.monotonic() - t0 < 4, res.stdout + res.stderr
    assert res.stdout.startswith("unhealthy: healthcheck: ") and "before a verdict" in res.stdout, res.stdout
