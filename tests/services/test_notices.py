"""The readers of the published notice (probes/notice.py): the SSH login script, run by real bash as
a dev-like uid in an interactive shell, and the notebook hook, in real ipykernel kernels started
through a real Jupyter Server with the test's copy of the system IPython configuration. Unhealthy or
stale: the person's lines; healthy or starting: nothing; a file of another user, an oversized one, a
link, a FIFO: ignored, and nothing blocks or breaks the shell or the kernel."""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from probes import notice, registry
from probes.hardware.common import GPU_COUNT_LOW, GPU_LOST
from probes.result import verdict
from probes.runner import Outcome
from probes.services import jupyter_kernel
from tests.conftest import ROOT
from tests.services.conftest import TOKEN, Jupyter, _jupyter

pytest.importorskip("ipykernel")
pytest.importorskip("websocket")

from tests.notice_kernel import run_cells

LOGIN = ROOT / "docker" / "gpu-health-notice.sh"
KERNEL_CONFIG = ROOT / "docker" / "ipython_kernel_config.py"
HOOK = runpy.run_path(str(KERNEL_CONFIG))  # the readers' rendering, as the kernel runs it
READER = 4243  # the dev-like user who logs in
OTHER = 4242  # another user, who may write where the reader looks
BASH_NOISE = ("bash: cannot set terminal process group", "bash: no job control in this shell")
AGO = 600  # seconds since the verdict: "10 min ago" however long a test takes


def published(v: notice.Verdict, *, stale: int = 3600, started: float = 0.0) -> str:
    """The notice a check publishes for ``v``, taken AGO seconds ago."""
    return notice.decide(None, v._replace(time=time.time() - AGO), life="l", started=started, stale=stale)[2]


def lost() -> notice.Verdict:
    gone = verdict("nvml", GPU_LOST, "GPU 1 is lost (1 other GPU still reports)")
    return notice.verdict_of(Outcome("readiness", (gone,)), registry.PROBES)


HEALTHY = notice.Verdict(0.0)


def test_the_readers_decide_staleness_at_read_time():
    t0 = 1_800_000_000.0
    healthy = notice.decide(None, notice.Verdict(t0), life="l", started=t0 - 3600, stale=90)[2]
    assert HOOK["lines"](healthy, t0 + 90) == []
    assert HOOK["lines"](healthy, t0 + 91) == ["gpu-health: not checked since 08:00 UTC (91 s ago); "
                                                "last verdict: healthy"]
    bad = notice.decide(None, lost()._replace(time=t0), life="l", started=t0 - 3600, stale=90)[2]
    assert HOOK["lines"](bad, t0 + 12) == [
        "gpu-health: unhealthy since 08:00 UTC: nvml: GPU 1 is lost (1 other GPU still reports) (checked 12 s ago)",
        f"gpu-health: {notice.OPERATOR}"]
    assert HOOK["lines"](bad, t0 + 3 * 3600) == [
        "gpu-health: not checked since 08:00 UTC (3 h ago); last verdict: unhealthy since 08:00 UTC: "
        "nvml: GPU 1 is lost (1 other GPU still reports)", f"gpu-health: {notice.OPERATOR}"]
    starting = notice.decide(None, lost()._replace(time=t0), life="l", started=t0 - 5, stale=90)[2]
    assert HOOK["lines"](starting, t0 + 1) == []
    for garbage in ("", "x 90 unhealthy 08:00 UTC\nboo\n", f"{int(t0)} 90 sick 08:00\nboo\n", "\x00" * 50):
        assert HOOK["lines"](garbage, t0) == []


def test_the_hook_knows_the_health_checks_own_cell():
    start, mark = HOOK["CHECK_CELL"]
    assert jupyter_kernel.CELL.startswith(start) and mark == jupyter_kernel.PREFIX
    assert repr(jupyter_kernel.PREFIX) in jupyter_kernel.CELL % (jupyter_kernel.PREFIX, "cpu", False)


# ---------------------------------------------------------------- files another uid may read

@pytest.fixture
def where() -> Iterator[Path]:
    """The notice's path in a directory the reader's uid can reach (pytest's tmp is root's, 0700)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the login runs as another uid, files are made another user's")
    base = Path(tempfile.mkdtemp(prefix="hc-notice-", dir="/tmp"))
    try:
        base.chmod(0o755)
        (base / "run").mkdir(mode=0o755)
        yield base / "run" / "notice"
    finally:
        shutil.rmtree(base)


def plant(path: Path, text: str, owner: int = 0) -> Path:
    path.write_text(text)
    path.chmod(0o644)
    os.chown(path, owner, owner)
    return path


def login(path: Path, *, script: str = "", interactive: bool = True, uid: int = READER,
          **env: str) -> tuple[list[str], str, float]:
    """An interactive bash of ``uid`` that sources the login script, as /etc/profile does: the
    notice's lines (stderr, without bash's own job-control words), stdout, and seconds taken."""
    argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "env", "-i", "PATH=/usr/bin:/bin",
            "HOME=/", f"HEALTHCHECK_NOTICE_FILE={path}", *(f"{k}={v}" for k, v in env.items()),
            "bash", "--noprofile", "--norc", *(["-i"] if interactive else []),
            "-c", f'{script}. {LOGIN}; echo "alive ${{t-none}} $(declare -F __gpu_health_notice)"']
    t0 = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL, check=False)
    took = time.monotonic() - t0
    lines = [ln for ln in res.stderr.splitlines() if not ln.startswith(BASH_NOISE)]
    return lines, res.stdout, took


def test_an_unhealthy_verdict_is_shown_at_login_naming_the_cause_and_who_acts(where):
    plant(where, published(lost()))
    lines, out, _ = login(where)
    assert out == "alive none \n"  # the shell goes on; no variable or function left in it
    assert len(lines) == 2 and lines[0].startswith("gpu-health: unhealthy since "), lines
    assert lines[0].endswith(" UTC: nvml: GPU 1 is lost (1 other GPU still reports) (checked 10 min ago)")
    assert lines[1] == f"gpu-health: {notice.OPERATOR}"
    assert lines == HOOK["lines"](where.read_text(), time.time())  # the notebook says the same
    few = verdict("nvml", GPU_COUNT_LOW, "1 GPU, 2 expected")
    tenant = notice.verdict_of(Outcome("readiness", (few,)), registry.PROBES)
    plant(where, published(tenant))
    assert login(where)[0][1] == "gpu-health: you can fix this: " + GPU_COUNT_LOW.remedy.replace("`", "")


def test_healthy_or_starting_shows_nothing_stale_says_not_checked(where):
    plant(where, published(HEALTHY))
    assert login(where)[:2] == ([], "alive none \n")
    plant(where, published(lost(), started=time.time() - AGO - 10))  # the container's start period
    assert where.read_text().split()[2] == "starting" and login(where)[0] == []
    plant(where, published(HEALTHY, stale=90))
    lines = login(where)[0]
    assert lines == [f"gpu-health: not checked since {lines[0].split('since ')[1][:9]} (10 min ago); "
                     "last verdict: healthy"], lines
    assert lines == HOOK["lines"](where.read_text(), time.time())
    plant(where, published(lost(), stale=90))
    stale = login(where)[0]
    assert stale[0].startswith("gpu-health: not checked since ") and "last verdict: unhealthy since" in stale[0]
    assert stale == HOOK["lines"](where.read_text(), time.time())


def test_off_non_interactive_or_a_strict_shell_change_nothing(where):
    plant(where, published(lost()))
    assert login(where, HEALTHCHECK_NOTICES="false")[:2] == ([], "alive none \n")
    assert login(where, interactive=False)[:2] == ([], "alive none \n")  # scp, ssh host cmd
    lines, out, _ = login(where, script="set -euo pipefail; IFS=:; ")
    assert len(lines) == 2 and out == "alive none \n"
    # /etc/profile is read by sh too: the script returns before anything bash-only.
    dash = subprocess.run(["sh", "-c", f". {LOGIN}; echo alive"], capture_output=True, text=True, timeout=10,
                          env={"PATH": "/usr/bin:/bin", "HEALTHCHECK_NOTICE_FILE": str(where)}, check=False)
    assert (dash.stdout, dash.stderr) == ("alive\n", "")


@pytest.mark.parametrize("hostile", ["another user's", "oversized", "a link", "a fifo", "in a dir others write",
                                     "control characters"])
def test_hostile_notices_never_reach_the_person(where, hostile):
    text = published(lost())
    if hostile == "another user's":
        plant(where, text, owner=OTHER)
    elif hostile == "oversized":
        plant(where, text + "x" * 5000)
    elif hostile == "a link":
        plant(where.with_name("real"), text)
        where.symlink_to(where.with_name("real"))
    elif hostile == "a fifo":
        os.mkfifo(where, 0o644)
    elif hostile == "in a dir others write":
        plant(where, text)
        where.parent.chmod(0o777)
    else:
        plant(where, text.replace("GPU 1", "GPU \x1b]0;owned\x07\x1b[2J1"))
    lines, out, took = login(where)
    assert out == "alive none \n" and took < 5, (out, took)
    if hostile == "control characters":
        assert len(lines) == 2 and "\x1b" not in "".join(lines) and "\x07" not in "".join(lines)
        return
    assert lines == []


def test_the_hook_ignores_what_the_login_ignores(where):
    text = published(lost())
    env = {"HEALTHCHECK_NOTICE_FILE": str(where)}
    plant(where, text, owner=OTHER)
    assert HOOK["notice"](env) == []
    where.unlink()
    os.mkfifo(where, 0o644)
    assert HOOK["notice"](env) == []  # opened without blocking
    where.unlink()
    plant(where, text + "x" * 5000)
    assert HOOK["notice"](env) == []
    where.unlink()
    plant(where.with_name("real"), text)
    where.symlink_to(where.with_name("real"))
    with pytest.raises(OSError):
        HOOK["notice"](env)  # the hook swallows it (test below); a link is never followed
    where.unlink()
    plant(where, text)
    assert len(HOOK["notice"](env)) == 2 and HOOK["notice"]({**env, "HEALTHCHECK_NOTICES": "off"}) == []


# ---------------------------------------------------------------- real kernels


class Kernels:
    """A Jupyter Server whose kernelspecs `notice` and `plain` run ipykernel, with and without the
    test's copy of /etc/ipython/ipython_kernel_config.py (IPYTHONDIR's profile), the notice at
    ``path``."""

    def __init__(self, server: Jupyter) -> None:
        self.server = server
        self.path = server.root / "run" / "notice"
        self.path.parent.mkdir()
        for name, config in (("notice", True), ("plain", False)):
            ipython = server.root / f"ipython-{name}"
            (ipython / "profile_default").mkdir(parents=True)
            if config:
                shutil.copy2(KERNEL_CONFIG, ipython / "profile_default" / "ipython_kernel_config.py")
            spec = server.root / "data" / "kernels" / name
            spec.mkdir(parents=True)
            (spec / "kernel.json").write_text(json.dumps({
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": name, "language": "python",
                "env": {"IPYTHONDIR": str(ipython), "HEALTHCHECK_NOTICE_FILE": str(self.path)}}))

    def cells(self, *cells: str | tuple[str, bool], kernel: str = "notice") -> list[dict[str, str]]:
        base = f"http://127.0.0.1:{self.server.port}{self.server.base_url}"
        return run_cells(base, TOKEN, kernel, [(c, True) if isinstance(c, str) else c for c in cells])


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernels]:
    for server in _jupyter(tmp_path_factory, "notice-kernels"):
        yield Kernels(server)


def check_cell(keep: bool = False) -> tuple[str, bool]:
    """The health check's own cell, as jupyter-kernel sends it (no history), or kept."""
    return jupyter_kernel.CELL % (jupyter_kernel.PREFIX, "cpu", True), keep


def test_the_first_cell_shows_the_notice_once(kernels):
    plant(kernels.path, published(lost()))
    first, second = kernels.cells("x = 1", "print(x + 1)")
    assert first["stderr"].splitlines() == HOOK["lines"](kernels.path.read_text(), time.time())
    assert "nvml: GPU 1 is lost" in first["stderr"] and notice.OPERATOR in first["stderr"]
    assert first["error"] == "" and (second["stdout"], second["stderr"]) == ("2\n", "")


def test_healthy_shows_nothing_and_stale_says_not_checked(kernels):
    plant(kernels.path, published(HEALTHY))
    assert kernels.cells("print(1)")[0] == {"stdout": "1\n", "stderr": "", "error": ""}
    plant(kernels.path, published(HEALTHY, stale=90))
    assert kernels.cells("1")[0]["stderr"].startswith("gpu-health: not checked since ")


def test_the_health_checks_own_cell_does_not_consume_it(kernels):
    plant(kernels.path, published(lost()))
    check, kept_check, person = kernels.cells(check_cell(), check_cell(keep=True), "1")
    # (torch may warn on stderr: only the notice's lines matter)
    assert jupyter_kernel.PREFIX in check["stdout"] and "gpu-health" not in check["stderr"]
    assert "gpu-health" not in kept_check["stderr"]
    assert person["stderr"].startswith("gpu-health: unhealthy since ")


def test_hostile_files_are_ignored_and_nothing_reaches_the_users_code(kernels):
    for make in (lambda: plant(kernels.path, published(lost()), owner=OTHER),
                 lambda: plant(kernels.path, published(lost()) + "x" * 5000),
                 lambda: os.mkfifo(kernels.path, 0o644),
                 lambda: kernels.path.mkdir(),
                 lambda: kernels.path.symlink_to("/etc/hostname")):
        make()
        try:
            got = kernels.cells("print('ran')")[0]
        finally:
            (os.rmdir if kernels.path.is_dir() and not kernels.path.is_symlink() else os.unlink)(kernels.path)
        assert got == {"stdout": "ran\n", "stderr": "", "error": ""}


def test_no_name_is_left_in_the_users_namespace(kernels):
    plant(kernels.path, published(lost()))
    names = "print(sorted(globals()))"
    with_notice = kernels.cells(names)[0]
    assert with_notice["stderr"].startswith("gpu-health: ")
    assert with_notice["stdout"] == kernels.cells(names, kernel="plain")[0]["stdout"]
