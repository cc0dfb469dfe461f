"""Whose server answers: the uid of the socket listening on Jupyter's port (/proc/net/tcp) against
the owner of the runtime file. A real Jupyter Server run as a uid with no passwd entry (the
notebook user), and root without CAP_SYS_PTRACE, as Docker runs the image's check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT, clean_env
from tests.services.conftest import TOKEN, Jupyter, needs_root, write_runtime

NOTEBOOK_UID = 4242  # Jupyter's user, as OpenShift runs it: no passwd entry
SQUATTER_UID = 4343


@pytest.fixture(scope="session")
def nb_jupyter() -> Iterator[Jupyter]:
    """Jupyter Server run as NOTEBOOK_UID under a base URL, its dirs its own (outside pytest's 0700 tmp)."""
    needs_root()
    pytest.importorskip("jupyter_server")
    root = Path(tempfile.mkdtemp(prefix="healthcheck-nb-"))
    try:
        server = Jupyter(root, token=TOKEN, base_url="/user/nb/", uid=NOTEBOOK_UID)
        yield server
        server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def token_file(tmp_path: Path, owner: int) -> Path:
    path = tmp_path / f"token-{owner}"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    os.chown(path, owner, owner)
    return path


def as_uid(uid: int, *argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, user=uid, group=uid, extra_groups=[], stdin=subprocess.DEVNULL)


# ---------------------------------------------------------------- root without CAP_SYS_PTRACE

def no_ptrace(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The suite's interpreter as the image's HEALTHCHECK runs it, root without CAP_SYS_PTRACE:
    ``-m probes ...`` (the CLI) or ``-c CODE``."""
    argv = args if args[0] == "-c" else ("-m", "probes", *args)
    return subprocess.run(["capsh", "--drop=cap_sys_ptrace", "--", "-c", 'exec "$0" "$@"', PYTHON, *argv],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


# The jupyter probe's refused runtime files, in full, under the settings in the environment.
REFUSED = ("import json, os, time\nfrom probes.config import load\nfrom probes.context import Context\n"
           "from probes.state import State\nfrom probes.services import jupyter\n"
           "ctx = Context(load(os.environ), time.monotonic() + 3, {}, State.off('t'))\n"
           "print(json.dumps(jupyter.judge(jupyter.gather(ctx), ctx).facts['runtime_files_refused']))\n")


@pytest.mark.skipif(shutil.which("capsh") is None, reason="needs capsh (libcap2-bin) to drop CAP_SYS_PTRACE")
def test_root_without_ptrace_trusts_the_notebook_users_runtime_file(nb_jupyter: Jupyter, tmp_path: Path) -> None:
    pid = nb_jupyter.proc.pid
    cut = subprocess.run(["capsh", "--drop=cap_sys_ptrace", "--", "-c", f"readlink /proc/{pid}/exe"],
                         capture_output=True, check=False)
    assert cut.returncode != 0, "capsh did not take CAP_SYS_PTRACE away: this test would prove nothing"
    env = clean_env(HEALTHCHECK_JUPYTER_PORT=str(nb_jupyter.port), HEALTHCHECK_STATE_DIR=str(tmp_path / "s"),
                    HEALTHCHECK_JUPYTER_RUNTIME_DIR=str(nb_jupyter.runtime))
    out = no_ptrace(env, "--only", "jupyter", "--json")
    check = json.loads(out.stdout)["checks"]["jupyter:responseTime"][0]
    assert (out.returncode, check["status"]) == (0, "pass"), out.stdout + out.stderr
    assert "GET /user/nb/api" in check["message"]  # the base URL came from the file
    # The same file owned by another uid than the listener's; and such a file naming a live
    # process of its own owner: both refused, each with its reason.
    live = next(nb_jupyter.runtime.glob("jpserver-*.json"))
    doc = json.loads(live.read_text())
    squatter = as_uid(SQUATTER_UID, "sleep", "30")
    try:
        for fields, why in (({}, f"owned by uid {SQUATTER_UID} but names a process of uid {NOTEBOOK_UID}"),
                            ({"pid": squatter.pid}, f"port {nb_jupyter.port} is held by uid {NOTEBOOK_UID}, "
                                                    f"not uid {SQUATTER_UID} who owns the file")):
            rt = tmp_path / f"rt{len(fields)}"
            rt.mkdir()
            write_runtime(rt, live.name, owner=SQUATTER_UID, **{**doc, **fields})
            out = no_ptrace({**env, "HEALTHCHECK_JUPYTER_RUNTIME_DIR": str(rt)}, "--only", "jupyter", "--json")
            check = json.loads(out.stdout)["checks"]["jupyter:responseTime"][0]
            assert (out.returncode, check["reason"]) == (1, "not-jupyter"), out.stdout + out.stderr
            assert TOKEN not in out.stdout + out.stderr
            # Its reason, which the 300 characters of a check's output cut here: the probe's facts.
            out = no_ptrace({**env, "HEALTHCHECK_JUPYTER_RUNTIME_DIR": str(rt)}, "-c", REFUSED)
            assert json.loads(out.stdout) == {live.name: why}, out.stderr
    finally:
        squatter.kill()
        squatter.wait()
