"""Whose server answers, and who gets the token: the uid of the socket listening on Jupyter's port
(/proc/net/tcp) against the owner of the runtime file or of the token file. A real Jupyter Server
run as a uid with no passwd entry (the notebook user), a squatter of another uid on the port, and
root without CAP_SYS_PTRACE, as Docker runs the image's check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from probes.config import Config
from probes.context import Context
from probes.result import Status
from probes.services import jupyter_kernel, kernel_run
from probes.state import State
from tests.conftest import PYTHON, ROOT, clean_env, run_cli
from tests.services.conftest import TOKEN, Jupyter, needs_root, no_runtime, probe, write_runtime

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


def kernel_ctx(timeout: float = 10.0, **config: Any) -> Context:
    return Context(Config(torch_device="cpu", **config), time.monotonic() + timeout, {}, State.off("tests"))


# ---------------------------------------------------------------- a squatter of another uid

def test_a_squatter_of_another_uid_is_an_impostor_and_never_gets_the_token(other_user_server: Any,
                                                                          tmp_path: Path) -> None:
    # Jupyter (the notebook user's) is down; its stale runtime file names the port, which a process
    # of another uid now holds, answering GET /api like Jupyter.
    squatter = other_user_server(uid=SQUATTER_UID)
    owner = as_uid(NOTEBOOK_UID, "sleep", "30")  # a live process of the file's owner
    try:
        rt = tmp_path / "rt"
        rt.mkdir()
        name = f"jpserver-{owner.pid}.json"
        write_runtime(rt, name, owner=NOTEBOOK_UID, pid=owner.pid, port=squatter.port)
        env = clean_env(HEALTHCHECK_JUPYTER_PORT=str(squatter.port), HEALTHCHECK_JUPYTER_RUNTIME_DIR=str(rt),
                        HEALTHCHECK_JUPYTER_TOKEN_FILE=str(token_file(tmp_path, NOTEBOOK_UID)),
                        HEALTHCHECK_STATE_DIR=str(tmp_path / "state"))
        out = run_cli("--profile", "liveness", "--only", "jupyter", "--json", env=env, timeout=60)
        check = json.loads(out.stdout)["checks"]["jupyter:responseTime"][0]
        assert (out.returncode, check["reason"]) == (1, "impostor"), out.stdout + out.stderr
        held = f"port {squatter.port} is held by uid {SQUATTER_UID}, not uid {NOTEBOOK_UID}"
        assert check["output"].startswith(f"{held} who owns the token file (nothing was sent)")
        assert (check["actor"], check["action"]) == ("tenant", "fix-config")
        r = probe(jupyter_port=squatter.port, jupyter_runtime_dir=str(rt),
                  jupyter_token_file=env["HEALTHCHECK_JUPYTER_TOKEN_FILE"])
        assert r.reason == "impostor" and r.facts["runtime_files_refused"] == {name: f"{held} who owns the file"}
        # The kernel check on its own: the token file's token is withheld from that listener.
        ctx = kernel_ctx(jupyter_port=squatter.port, jupyter_runtime_dir=str(rt),
                         jupyter_token_file=str(tmp_path / f"token-{NOTEBOOK_UID}"))
        r = jupyter_kernel.judge(jupyter_kernel.gather(ctx), ctx)
        assert r.reason == "api-error" and f"token was not sent: {held} who owns the token file" in r.message
    finally:
        owner.kill()
        owner.wait()
    heads = squatter.stop()
    assert heads, "the kernel check never reached the squatter: the assertions below would prove nothing"
    assert all(not h.startswith("GET /api ") for h in heads), "the jupyter probe talked to the squatter"
    assert not [h for h in heads if "authorization" in h.lower() or TOKEN in h], "the token reached it"


# ---------------------------------------------------------------- Jupyter as the notebook user

def test_the_kernel_client_gets_the_listeners_uid_and_the_token_only_for_its_owner(nb_jupyter: Jupyter,
                                                                                     tmp_path: Path) -> None:
    port = nb_jupyter.port
    srv, source, withheld = kernel_run.server(kernel_ctx(jupyter_runtime_dir=str(nb_jupyter.runtime),
                                                             jupyter_port=port))
    assert (srv.uid, srv.token == TOKEN, srv.base_url, withheld) == (NOTEBOOK_UID, True, "/user/nb/", "")
    assert source is not None and source.startswith("jpserver-")
    for owner in (NOTEBOOK_UID, SQUATTER_UID, 0):
        ctx = kernel_ctx(jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=port,
                         jupyter_base_url="/user/nb/", jupyter_token_file=str(token_file(tmp_path, owner)))
        srv, source, withheld = kernel_run.server(ctx)
        assert (srv.uid, source) == (NOTEBOOK_UID, None)
        if owner == NOTEBOOK_UID:
            assert (srv.token, withheld) == (TOKEN, "")
        else:
            assert srv.token == "" and withheld == (f"port {port} is held by uid {NOTEBOOK_UID}, "
                                                    f"not uid {owner} who owns the token file")


def test_the_port_must_be_the_token_files_owners(nb_jupyter: Jupyter, tmp_path: Path) -> None:
    # Its owner listening passes (no false alarm); another owner of the file makes that listener a stand-in.
    r = probe(jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=nb_jupyter.port,
              jupyter_base_url="/user/nb/", jupyter_token_file=str(token_file(tmp_path, NOTEBOOK_UID)))
    assert r.status is Status.PASS, r.message
    r = probe(jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=nb_jupyter.port,
              jupyter_base_url="/user/nb/", jupyter_token_file=str(token_file(tmp_path, SQUATTER_UID)))
    assert r.reason == "impostor", r.message


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
