"""The jupyter-kernel probe against a real Jupyter Server starting real ipykernel kernels (torch on
the CPU): a healthy kernel, a kernelspec whose interpreter is gone, a kernel killed by a broken
module on its path, an interpreter without torch, a kernel that never answers, a token-protected
server under a base URL, a user's busy kernel beside the check, the token kept out of every
output, and a SIGTERM to the suite mid-check. After each, the server lists no kernel of the
probe's and no process of it is alive."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from probes.config import Config
from probes.context import Context
from probes.result import Result, Status
from probes.services import jupyter_kernel, kernel_run
from probes.state import State
from tests.conftest import ROOT, clean_env, run_cli
from tests.framework.conftest import FAKE_TORCH
from tests.hardware.conftest import FAKE_LIB_DIR
from tests.servers import Jupyter, leftovers, wait_gone
from tests.services.conftest import TOKEN, _jupyter

pytest.importorskip("ipykernel")
pytest.importorskip("websocket")

# On the hanging kernel's command line, to find leftovers: this process's own, as the tests run two
# at a time (make unit) and another's hanging kernel is none of this one's.
HANG = f"healthcheck-test-hanging-kernel-{os.getpid()}"
LAUNCH = ["-m", "ipykernel_launcher", "-f", "{connection_file}"]
# An interpreter that cannot import torch: ipykernel starts, `import torch` finds nothing.
NO_TORCH = ("import sys; sys.modules['torch'] = None; from ipykernel import kernelapp; "
            "kernelapp.launch_new_instance()")
HANGS = (f"import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
         f"signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)  # {HANG}")


def kernelspec(data: Path, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
    where = data / "kernels" / name
    where.mkdir(parents=True, exist_ok=True)
    (where / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": name, "language": "python",
                                                   **({"env": env} if env else {})}))


@pytest.fixture(scope="session")
def kserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jupyter]:
    """A Jupyter Server (token-protected, as they all are here) with the test's kernelspecs."""
    for server in _jupyter(tmp_path_factory, "jupyter-kernels"):
        data = server.root / "data"
        broken = server.root / "planted"
        broken.mkdir()
        # Shadows a module ipykernel imports at start, as a file under ~/.local would.
        (broken / "comm.py").write_text("raise ImportError('comm is broken: planted by the test')\n")
        kernelspec(data, "ok", [sys.executable, *LAUNCH])
        kernelspec(data, "gone", ["/nonexistent/bin/python3", *LAUNCH])
        kernelspec(data, "broken", [sys.executable, *LAUNCH], {"PYTHONPATH": str(broken)})
        kernelspec(data, "notorch", [sys.executable, "-c", NO_TORCH, "-f", "{connection_file}"])
        kernelspec(data, "hangs", [sys.executable, "-c", HANGS, "{connection_file}"])
        # A stale ipykernel under ~/.local: the launcher's first import fails, tens of ms after exec.
        (server.root / "stale" / "ipykernel").mkdir(parents=True)
        (server.root / "stale" / "ipykernel" / "__init__.py").write_text("")
        kernelspec(data, "shadowed", [sys.executable, *LAUNCH], {"PYTHONPATH": str(server.root / "stale")})
        for mode in ("ok", "busy", "cpu-build", "wrong"):  # torch at its boundary: tests/framework/fake_torch
            kernelspec(data, f"fake-{mode}", [sys.executable, *LAUNCH],
                       {"PYTHONPATH": str(FAKE_TORCH), "FAKE_TORCH_MODE": mode})
        yield server


@pytest.fixture(scope="session")
def kbase(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jupyter]:
    yield from _jupyter(tmp_path_factory, "jupyter-kernel-base", base_url="/user/alice/")


def api(server: Jupyter | OwnJupyter, method: str, path: str, body: Any = None) -> Any:
    from tests import notice_kernel  # websocket-client: after the importorskip above

    return notice_kernel.api(f"http://127.0.0.1:{server.port}{server.base_url}", TOKEN, method, path, body, 30)


def listed(server: Jupyter | OwnJupyter) -> list[dict[str, Any]]:
    """The server's kernels. Jupyter Server 2.21 lists a kernel it is starting a few turns of its
    loop before the kernel's model has ``last_activity``, and answers the listing 500 meanwhile
    (enterprise_gateway issue 1395 quotes the traceback): that answer is asked again."""
    end = time.monotonic() + 10
    while True:
        try:
            got: list[dict[str, Any]] = api(server, "GET", "api/kernels")
            return got
        except urllib.error.HTTPError as e:
            if e.code != 500 or time.monotonic() > end:
                raise
            time.sleep(0.05)


def kernel_ids(server: Jupyter | OwnJupyter) -> set[str]:
    return {k["id"] for k in listed(server)}


def used(server: Jupyter) -> None:
    """A request of the user's, later than what the probe counts as its own kernel's last words."""
    time.sleep(jupyter_kernel.SLACK + 0.2)
    kernel_ids(server)


@contextlib.contextmanager
def server_uid(uid: int | None) -> Iterator[None]:
    """kernel_run.server() as it is, with ``uid`` as the verified owner of the server's
    listening socket (what the server's discovery gives where it can verify it)."""
    found = kernel_run.server

    def server(ctx: Context) -> tuple[Any, str | None, str]:
        srv, source, withheld = found(ctx)
        srv.uid = uid
        return srv, source, withheld

    with mock.patch.object(kernel_run, "server", server):
        yield


FOUND = -1  # probe()'s uid: whatever the server's discovery verifies


def probe(server: Jupyter | OwnJupyter, kernel: str | None = "ok", timeout: float = 30.0,
          uid: int | None = FOUND, state: State | None = None, **config: Any) -> Result:
    """One probe run (without a state dir unless given), held to its deadline, the token, and
    leaving nothing; the server's uid is what its discovery verifies, or ``uid`` when given."""
    before = kernel_ids(server)
    cfg = Config(**{"jupyter_port": server.port, "jupyter_runtime_dir": str(server.runtime),
                    "torch_device": "cpu", "jupyter_kernel_name": kernel, **config})
    ctx = Context(cfg, time.monotonic() + timeout, {}, state or State.off("tests"))
    with server_uid(uid) if uid != FOUND else contextlib.nullcontext():
        result = jupyter_kernel.judge(jupyter_kernel.gather(ctx), ctx)
    assert time.monotonic() <= ctx.deadline + 0.5, "the probe overran its deadline"
    assert "\n" not in result.message
    assert TOKEN not in repr(result) and TOKEN not in json.dumps(result.to_dict())
    assert kernel_ids(server) <= before, "the probe left its kernel on the server"
    return result


def test_a_healthy_kernel_passes_with_the_seconds_to_its_verified_reply(kserver: Jupyter) -> None:
    r = probe(kserver)
    assert r.status is Status.PASS, r.message
    assert "verified matmul on cpu" in r.message and r.unit == "s" and 0 < r.observed < 30
    assert r.facts["cleanup"]["deleted"] is True and r.facts["cleanup"]["left"] == 0


def test_the_servers_default_kernelspec_is_taken_when_none_is_named(kserver: Jupyter) -> None:
    r = probe(kserver, kernel=None)
    assert r.status is Status.PASS and r.facts["kernel"] == "python3", r.message


def test_a_missing_kernelspec_lists_those_that_exist(kserver: Jupyter) -> None:
    r = probe(kserver, kernel="nosuch")
    assert r.status is Status.FAIL and r.reason == "kernelspec-missing"
    assert "'nosuch'" in r.message
    assert ("(it has: broken, fake-busy, fake-cpu-build, fake-ok, fake-wrong, gone, hangs, notorch and 3 more)"
            in r.message), r.message


def test_a_kernelspec_naming_a_missing_interpreter_cannot_start(kserver: Jupyter) -> None:
    r = probe(kserver, kernel="gone")
    assert r.status is Status.FAIL and r.reason == "kernel-start-failed", r.message
    assert "/nonexistent/bin/python3" in r.message or "No such file" in r.message, r.message


def test_a_kernel_killed_by_a_broken_module_on_its_path_died_and_says_which(kserver: Jupyter,
                                                                            tmp_path: Path) -> None:
    r = probe(kserver, kernel="broken", state=State.open(str(tmp_path / "state")))
    assert r.status is Status.FAIL and r.reason == "kernel-died", r.message
    assert "ImportError: comm is broken: planted by the test" in r.message


def test_an_interpreter_without_torch(kserver: Jupyter) -> None:
    r = probe(kserver, kernel="notorch")
    assert r.status is Status.FAIL and r.reason == "kernel-no-torch", r.message
    assert "no module 'torch'" in r.message


def test_a_kernel_that_never_answers_times_out_in_its_share_and_leaves_no_process(kserver: Jupyter) -> None:
    t0 = time.monotonic()
    r = probe(kserver, kernel="hangs", timeout=12.0)
    assert r.status is Status.FAIL and r.reason == "kernel-timeout", r.message
    assert time.monotonic() - t0 < 12.5
    assert not wait_gone(HANG), "the hanging kernel outlived the probe"
    assert r.facts["cleanup"]["ended"] >= 1 and r.facts["cleanup"]["left"] == 0


def test_a_token_protected_server_under_a_base_url(kbase: Jupyter) -> None:
    r = probe(kbase, kernel=None)
    assert r.status is Status.PASS, r.message
    assert r.facts["runtime_file"].startswith("jpserver-")


def test_without_the_token_the_api_refuses_and_the_probe_says_where_to_find_it(kbase: Jupyter,
                                                                                tmp_path: Path) -> None:
    empty = tmp_path / "runtime"
    empty.mkdir()
    cfg = Config(jupyter_port=kbase.port, jupyter_runtime_dir=str(empty), jupyter_base_url=kbase.base_url,
                 torch_device="cpu")
    ctx = Context(cfg, time.monotonic() + 10, {}, State.off("tests"))
    r = jupyter_kernel.judge(jupyter_kernel.gather(ctx), ctx)
    assert r.status is Status.FAIL and r.reason == "api-error" and "HTTP 403" in r.message, r.message


def test_a_token_file_serves_where_no_runtime_file_can_be_trusted(kbase: Jupyter, tmp_path: Path) -> None:
    # As in the image: root without CAP_SYS_PTRACE cannot trust the notebook user's runtime file.
    empty = tmp_path / "runtime"
    empty.mkdir()
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "link").symlink_to(tmp_path / "token")
    results = {}
    for name in ("token", "link"):
        cfg = Config(jupyter_port=kbase.port, jupyter_runtime_dir=str(empty), jupyter_base_url=kbase.base_url,
                     torch_device="cpu", jupyter_token_file=str(tmp_path / name))
        ctx = Context(cfg, time.monotonic() + 30, {}, State.off("tests"))
        results[name] = jupyter_kernel.judge(jupyter_kernel.gather(ctx), ctx)
        assert TOKEN not in json.dumps(results[name].to_dict())
    assert results["token"].status is Status.PASS, results["token"].message
    assert results["link"].reason == "api-error", results["link"].message  # a link is never followed


def _busy_user_kernel(server: Jupyter) -> str:
    """A user's kernel, busy in a long cell."""
    import websocket

    kid = api(server, "POST", "api/kernels", {"name": "ok"})["id"]
    ws = websocket.create_connection(f"ws://127.0.0.1:{server.port}/api/kernels/{kid}/channels",
                                     header=[f"Authorization: token {TOKEN}"], timeout=30, suppress_origin=True)
    msg = {"header": {"msg_id": uuid.uuid4().hex, "username": "user", "session": uuid.uuid4().hex,
                      "msg_type": "execute_request", "version": "5.3", "date": ""},
           "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
           "content": {"code": "import time; time.sleep(120)", "silent": False, "store_history": True,
                       "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}
    ws.send(json.dumps(msg))
    end = time.monotonic() + 20
    while time.monotonic() < end:
        states = {k["id"]: k["execution_state"] for k in listed(server)}
        if states.get(kid) == "busy":
            ws.close()
            return kid
        time.sleep(0.1)
    ws.close()
    raise AssertionError("the user's kernel never got busy")


def test_a_users_busy_kernel_beside_the_check_is_untouched(kserver: Jupyter) -> None:
    kid = _busy_user_kernel(kserver)
    try:
        pids = set(leftovers(f"kernel-{kid}.json"))
        assert pids
        for name in ("ok", "hangs"):
            probe(kserver, kernel=name, timeout=12.0)
        states = {k["id"]: k["execution_state"] for k in listed(kserver)}
        assert states.get(kid) == "busy", states
        assert all(p.is_running() for p in pids)
    finally:
        api(kserver, "DELETE", f"api/kernels/{kid}")


def _env(server: Jupyter | OwnJupyter, tmp_path: Path, **extra: str) -> dict[str, str]:
    return clean_env(**{"HEALTHCHECK_JUPYTER_PORT": str(server.port),
                        "HEALTHCHECK_JUPYTER_RUNTIME_DIR": str(server.runtime), "HEALTHCHECK_TORCH_DEVICE": "cpu",
                        "HEALTHCHECK_STATE_DIR": str(tmp_path / "state"), "HEALTHCHECK_LOG_FILE": str(tmp_path / "log"),
                        "HEALTHCHECK_CHECKS_DIR": str(tmp_path / "none"), **extra})


def test_the_token_never_appears_in_output_logs_or_serve_answers(kserver: Jupyter, tmp_path: Path) -> None:
    from tests.serve.conftest import ALL_OFF, Server

    for name in ("ok", "broken"):
        env = _env(kserver, tmp_path, HEALTHCHECK_JUPYTER_KERNEL_NAME=name)
        for flags in (["-v"], ["--json", "-v"]):
            res = run_cli("--profile", "startup", "--only", "jupyter,jupyter-kernel", *flags, env=env)
            assert res.returncode == (0 if name == "ok" else 1), res.stdout + res.stderr
            assert "jupyter-kernel" in res.stdout and TOKEN not in res.stdout + res.stderr
    assert TOKEN not in (tmp_path / "log").read_text(errors="replace")
    wanted = {k: v for k, v in _env(kserver, tmp_path).items()
              if k.startswith("HEALTHCHECK_") and k != "HEALTHCHECK_LOG_FILE"}  # serve logs to stderr
    serve = Server(tmp_path, {**ALL_OFF, **wanted, "ENABLE_JUPYTER_CHECK": "true",
                              "ENABLE_JUPYTER_KERNEL_CHECK": "true"}, [])
    try:
        serve.wait_runs_ended(timeout=90)
        for path in ("/readyz?verbose", "/startupz?verbose", "/health", "/metrics"):
            _, _, body = serve.get(path)
            assert TOKEN.encode() not in body, path
    finally:
        serve.cleanup()
    assert TOKEN not in serve.log_text()


def test_on_a_server_in_use_readiness_reuses_a_pass_within_its_ttl_and_startup_runs_fresh(
        kserver: Jupyter, tmp_path: Path) -> None:
    env = _env(kserver, tmp_path, HEALTHCHECK_JUPYTER_KERNEL_NAME="ok")
    first = run_cli("--only", "jupyter-kernel", env=env)
    assert first.returncode == 0 and "cached" not in first.stdout, first.stdout
    used(kserver)
    again = run_cli("--only", "jupyter-kernel", env=env)
    assert again.returncode == 0 and "cached" in again.stdout, again.stdout
    fresh = run_cli("--profile", "startup", "--only", "jupyter-kernel", env=env)
    assert fresh.returncode == 0 and "cached" not in fresh.stdout, fresh.stdout
    used(kserver)
    off = run_cli("--only", "jupyter-kernel", env={**env, "HEALTHCHECK_JUPYTER_KERNEL_TTL": "0"})
    assert off.returncode == 0 and "cached" not in off.stdout and "idle" not in off.stdout, off.stdout


def test_liveness_never_runs_it(kserver: Jupyter, tmp_path: Path) -> None:
    res = run_cli("--profile", "liveness", "-v", env=_env(kserver, tmp_path, ENABLE_GPU_CHECK="false",
                                                          ENABLE_TORCH_CHECK="false", ENABLE_SSH_CHECK="false"))
    assert "jupyter-kernel" not in res.stdout and "jupyter" in res.stdout, res.stdout


def test_sigterm_to_the_suite_removes_the_kernel_it_started(kserver: Jupyter, tmp_path: Path) -> None:
    before = kernel_ids(kserver)
    env = _env(kserver, tmp_path, HEALTHCHECK_JUPYTER_KERNEL_NAME="hangs", HEALTHCHECK_TIMEOUT="30",
               PYTHONPATH=str(ROOT))
    suite = subprocess.Popen([sys.executable, "-m", "probes", "--profile", "startup", "--only", "jupyter-kernel"],
                             env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 20
        while not leftovers(HANG) and time.monotonic() < end:
            time.sleep(0.05)
        assert leftovers(HANG), "the hanging kernel never started"
        suite.send_signal(signal.SIGTERM)
        out, _ = suite.communicate(timeout=10)
        assert suite.returncode == 1 and "SIGTERM" in out, out
        assert not wait_gone(HANG, within=3.0), "the kernel outlived the suite"
        end = time.monotonic() + 10
        while kernel_ids(kserver) - before and time.monotonic() < end:
            time.sleep(0.1)
        assert kernel_ids(kserver) <= before
    finally:
        if suite.poll() is None:
            os.kill(suite.pid, signal.SIGKILL)
            suite.wait()


@pytest.mark.parametrize(("env", "on"), [
    ({}, True),
    ({"ENABLE_JUPYTER_CHECK": "false"}, False),
    ({"ENABLE_JUPYTER_CHECK": "false", "ENABLE_JUPYTER_KERNEL_CHECK": "true"}, True),
    ({"ENABLE_JUPYTER_KERNEL_CHECK": "false"}, False),
])
def test_on_by_default_wherever_the_jupyter_probe_is_on(env: dict[str, str], on: bool) -> None:
    from probes import config

    names = [s.name for s in config.load(env).selected()]
    assert ("jupyter-kernel" in names) is on, names
    assert "jupyter-kernel" not in [s.name for s in config.load(env, profile="liveness").selected()]


# ---------------------------------------------------------------- the GPU: torch at its boundary

@pytest.mark.parametrize(("kernel", "status", "reason", "words"), [
    ("fake-ok", Status.PASS, None, "verified matmul on cuda"),
    ("ok", Status.FAIL, "kernel-no-gpu", "sees no CUDA device"),  # the real, CPU-only torch
    ("fake-cpu-build", Status.FAIL, "kernel-no-gpu", "(a CPU-only build) sees no CUDA device"),
    ("fake-wrong", Status.FAIL, "kernel-wrong-result", "differs from the CPU reference"),
    ("fake-busy", Status.FAIL, "kernel-op-failed", "RuntimeError: CUDA error: CUDA-capable device"),
])
def test_on_the_gpu(kserver: Jupyter, kernel: str, status: Status, reason: str | None, words: str) -> None:
    r = probe(kserver, kernel=kernel, torch_device="cuda")
    assert (r.status, r.reason) == (status, reason), r.message
    assert words in r.message, r.message


def test_a_gpu_the_workload_fills_gets_no_op_and_a_warning(kserver: Jupyter, tmp_path: Path) -> None:
    # fake-busy fails any tensor put on the GPU: the warning proves no op (no context) was tried.
    (tmp_path / "scenario").write_text("gpus 1\ngpu 0 memory 81559 81000\n")
    env = _env(kserver, tmp_path, HEALTHCHECK_JUPYTER_KERNEL_NAME="fake-busy", HEALTHCHECK_TORCH_DEVICE="cuda",
               LD_LIBRARY_PATH=str(FAKE_LIB_DIR), FAKE_NVML_SCENARIO=str(tmp_path / "scenario"))
    res = run_cli("--profile", "startup", "--only", "jupyter-kernel", "--json", env=env)
    check = json.loads(res.stdout)["checks"]["jupyter-kernel:startTime"][0]
    assert (res.returncode, check["status"], check["reason"]) == (0, "warn", "workload-memory"), check
    assert "the op was not run" in check["output"]
    (tmp_path / "scenario").write_text("gpus 1\ngpu 0 memory 81559 1000\n")
    res = run_cli("--profile", "startup", "--only", "jupyter-kernel", "--json", env=env)
    check = json.loads(res.stdout)["checks"]["jupyter-kernel:startTime"][0]
    assert (res.returncode, check["reason"]) == (1, "kernel-op-failed"), check


# ---------------------------------------------------------------- the image's case: root without CAP_SYS_PTRACE

def test_root_without_ptrace_uses_the_token_file_and_still_names_a_dead_kernels_cause(kserver: Jupyter,
                                                                                     tmp_path: Path) -> None:
    # As Docker runs the HEALTHCHECK: root without CAP_SYS_PTRACE may not read the server's
    # environment (the dead kernel's command runs again with the suite's). Where no runtime file
    # is found, the token comes from the token file.
    from tests.services.conftest import needs_root, no_runtime

    needs_root()
    (tmp_path / "token").write_text(TOKEN + "\n")
    env = _env(kserver, tmp_path, HEALTHCHECK_JUPYTER_TOKEN_FILE=str(tmp_path / "token"), PYTHONPATH=str(ROOT),
               HEALTHCHECK_JUPYTER_RUNTIME_DIR=no_runtime(tmp_path))
    argv = ["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace", sys.executable, "-m", "probes",
            "--profile", "startup", "--only", "jupyter-kernel", "--json", "-v"]
    checks = {}
    for name in ("ok", "broken"):
        before = kernel_ids(kserver)
        res = subprocess.run(argv, env={**env, "HEALTHCHECK_JUPYTER_KERNEL_NAME": name}, cwd=ROOT,
                             capture_output=True, text=True, timeout=90, check=False)
        assert TOKEN not in res.stdout + res.stderr
        checks[name] = json.loads(res.stdout)["checks"]["jupyter-kernel:startTime"][0]
        assert kernel_ids(kserver) <= before
    assert checks["ok"]["status"] == "pass", checks["ok"]["output"]
    assert checks["broken"]["reason"] == "kernel-died", checks["broken"]["output"]
    # The cause is read by running the kernelspec again as the server's uid, only where the
    # server's discovery verified whose socket listens (no ptrace needed for that).
    ctx = Context(Config(jupyter_port=kserver.port, jupyter_runtime_dir=str(kserver.runtime)), time.monotonic() + 5,
                  {}, State.off("tests"))
    known = kernel_run.server(ctx)[0].uid is not None
    said = "ImportError: comm is broken: planted by the test" if known else \
        "the cause was not read (the server's user is not known"
    assert said in checks["broken"]["output"], checks["broken"]["output"]
    res = subprocess.run(argv, env={**env, "HEALTHCHECK_JUPYTER_TOKEN_FILE": str(tmp_path / "none"),
                                    "HEALTHCHECK_JUPYTER_KERNEL_NAME": "ok"},
                         cwd=ROOT, capture_output=True, text=True, timeout=90, check=False)
    check = json.loads(res.stdout)["checks"]["jupyter-kernel:startTime"][0]
    assert check["reason"] == "api-error" and "HTTP 403" in check["output"], check  # the file was refused


# ---------------------------------------------------------------- judge, on gathered data

def _reply(report: dict[str, Any], **data: Any) -> dict[str, Any]:
    line = jupyter_kernel.PREFIX + json.dumps(report)
    return {"kind": "kernel", "outcome": "reply", "kernel": "python3", "device": "cuda", "observed": 4.2,
            "stdout": f"noise\n{line}\n", "lingered": False, **data}


TORCH = {"torch": "2.9.1", "cuda": "12.8", "available": True, "count": 2, "error": None,
         "op": {"max_err": 1e-6, "scale": 80.0, "ms": 3.0}}


@pytest.mark.parametrize(("data", "status", "reason", "words"), [
    (_reply(TORCH), Status.PASS, None, "verified matmul on cuda in 4.2s (torch 2.9.1)"),
    (_reply(TORCH, cache={"how": "ttl", "age": 42.0}), Status.PASS, None, "(cached, 42s old)"),
    (_reply({**TORCH, "op": None}, room={"need_mib": 1024, "unknown": None, "full": []}), Status.WARN,
     "workload-memory", "sees 2 GPU(s); the op was not run"),
    (_reply({**TORCH, "op": {"max_err": 5.0, "scale": 80.0}}), Status.FAIL, "kernel-wrong-result", "6.2e-02"),
    (_reply({**TORCH, "op": {"max_err": "nan", "scale": 80.0}}), Status.FAIL, "kernel-wrong-result",
     "not a number"),
    ({"kind": "kernel", "outcome": "reply", "stdout": "HEALTHCHECK-KERNEL-RESULT {\"forged\"\n",
      "error": {"ename": "NameError", "evalue": "x\x1b[31m"}}, Status.FAIL, "kernel-wrong-result",
     "no result line (NameError: x\\x1b[31m)"),
    ({"kind": "kernel", "outcome": "channels-failed", "why": "the server refused the channels with HTTP 403"},
     Status.FAIL, "api-error", "HEALTHCHECK_JUPYTER_TOKEN_FILE"),
    ({"kind": "kernel", "outcome": "channels-failed", "why": "the server refused the channels with HTTP 500"},
     Status.FAIL, "kernel-start-failed", "HTTP 500"),
    ({"kind": "kernel", "outcome": "no-client"}, Status.WARN, "client-missing", "gpu-healthcheck[jupyter]"),
    ({"kind": "kernel", "outcome": "api", "http": 500, "net": "http", "where": "127.0.0.1:8888"}, Status.FAIL,
     "api-error", "(HTTP 500: the server failed; a read-only home or /tmp keeps it from listing kernels)"),
    ({"kind": "kernel", "outcome": "api", "http": 404, "net": "http", "where": "127.0.0.1:8888"}, Status.FAIL,
     "api-error", "(HTTP 404): point HEALTHCHECK_JUPYTER_RUNTIME_DIR at the server's runtime directory"),
    ({**_reply(TORCH), "lingered": True, "cleanup": {"deleted": False, "ended": 1, "left": 1}}, Status.FAIL,
     "kernel-left", "1 process(es) left"),
])
def test_judge(data: dict[str, Any], status: Status, reason: str | None, words: str) -> None:
    r = jupyter_kernel.judge(data, None)
    assert (r.status, r.reason) == (status, reason), r.message
    assert words in r.message and "\n" not in r.message and "\x1b" not in r.message, r.message


# ---------------------------------------------------------------- the line that names the cause

# Kernels that died at start, as their users posted them (the last lines of each traceback).
DEATHS = [
    # jupyter/help#439: a package too old for IPython (the traceback's last frame is IPython's).
    ('  File "/Library/Frameworks/Python.framework/Versions/3.6/lib/python3.6/site-packages/IPython/terminal/'
     'interactiveshell.py", line 20, in <module>\n    from prompt_toolkit.formatted_text import PygmentsTokens\n'
     "ModuleNotFoundError: No module named 'prompt_toolkit.formatted_text'\n",
     "ModuleNotFoundError: No module named 'prompt_toolkit.formatted_text' (in /Library/Frameworks/"),
    # jupyter/notebook#4222: the interpreter itself says it, without an exception line.
    ("/usr/bin/python: No module named ipykernel_launcher\n", "/usr/bin/python: No module named ipykernel_launcher"),
    # spyder-ide/spyder-kernels#116: a local signal.py shadows the standard library's; a failing
    # excepthook's traceback follows.
    ('  File "/usr/lib/python3.6/pdb.py", line 79, in <module>\n    import signal\n'
     '  File "/home/akul/Documents/backtrader/signal.py", line 24, in <module>\n    import backtrader as bt\n'
     "ModuleNotFoundError: No module named 'backtrader'\nError in sys.excepthook:\nTraceback (most recent call last):\n"
     '  File "/usr/lib/python3/dist-packages/apport_python_hook.py", line 63, in apport_excepthook\n'
     "    from apport.fileutils import likely_packaged, get_recent_crashes\n",
     "ModuleNotFoundError: No module named 'backtrader' (in /home/akul/Documents/backtrader/signal.py)"),
    # microsoft/vscode-jupyter#4937: a user's file shadows subprocess; the kernel dies in platform.
    ('  File "/usr/lib/python3.8/platform.py", line 613, in _syscmd_uname\n'
     "    output = subprocess.check_output(('uname', option),\n"
     "AttributeError: partially initialized module 'subprocess' has no attribute 'check_output' "
     "(most likely due to a circular import)\n",
     "AttributeError: partially initialized module 'subprocess' has no attribute 'check_output' "
     "(most likely due to a circular import) (in /usr/lib/python3.8/platform.py)"),
    # microsoft/vscode-jupyter#11805: psutil from the system beside a user's ipykernel.
    ('  File "/usr/lib/python3/dist-packages/psutil/_pslinux.py", line 26, in <module>\n'
     "    from . import _psutil_linux as cext\nImportError: cannot import name '_psutil_linux' from partially "
     "initialized module 'psutil' (most likely due to a circular import) "
     "(/usr/lib/python3/dist-packages/psutil/__init__.py)\n",
     "ImportError: cannot import name '_psutil_linux' from partially initialized module 'psutil' "
     "(most likely due to a circular import) (/usr/lib/python3/dist-packages/psutil/__init__.py)"),
    # ContinuumIO/anaconda-issues#9090: an old libstdc++ under pyzmq's library.
    ('  File "/usr/local/conda3/lib/python3.6/site-packages/zmq/backend/cython/__init__.py", line 6, in <module>\n'
     "    from . import (constants, error, message, context,\nImportError: /usr/lib64/libstdc++.so.6: version "
     "`GLIBCXX_3.4.21' not found (required by /usr/local/conda3/lib/python3.6/site-packages/zmq/backend/cython/"
     "../../../../../libzmq.so.5.1.2)\n",
     "ImportError: /usr/lib64/libstdc++.so.6: version `GLIBCXX_3.4.21' not found (required by /usr/local/"),
    # python/cpython#136094: Python 3.13's hint, which names the file to rename.
    ('  File "/home/as/mainmod.py", line 1, in <module>\n    from secondmod import secondaryitem\n'
     "ImportError: cannot import name 'secondaryitem' from 'secondmod' (consider renaming '/home/as/secondmod.py' "
     "if it has the same name as a library you intended to import)\n",
     "ImportError: cannot import name 'secondaryitem' from 'secondmod' (consider renaming '/home/as/secondmod.py' "),
]


@pytest.mark.parametrize(("output", "shown"), DEATHS)
def test_the_line_kept_of_a_dead_kernels_output_names_its_module_or_file(output: str, shown: str) -> None:
    line = kernel_run.first_cause("Traceback (most recent call last):\n" + output)
    assert shown in line and len(line) <= 200, line


def test_a_long_line_keeps_the_names_at_its_ends() -> None:
    deep = "/opt/conda/envs/" + "x" * 150 + "/lib/libzmq.so.5"
    line = kernel_run.first_cause(f"ImportError: /lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.30' "
                               f"not found (required by {deep})\n")
    assert len(line) <= 200 and line.startswith("ImportError: /lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBC")
    assert line.endswith("/lib/libzmq.so.5)"), line
    line = kernel_run.first_cause("AttributeError: module 'random' has no attribute 'randint' (consider renaming "
                               f"'/home/dev/{'r' * 80}/random.py' since it has the same name as the standard library "
                               "module named 'random' and prevents importing that standard library module)\n")
    assert line.endswith(f"(consider renaming '/home/dev/{'r' * 80}/random.py')"), line


# ---------------------------------------------------------------- the user's server: do no harm

OTHER = 4242  # the notebook user, as OpenShift runs it: no passwd entry
RECORDS = "uid-records.txt"
# A kernelspec of the server's user that dies at start: it writes who runs it, the connection file
# it got, that file's mode and owner, then fails as a stale package makes a kernel fail.
RECORDER = f"""#!/bin/sh
echo "$(id -u) $1 $(stat -L -c '%a %u' "$1")" >> "$(dirname "$0")/{RECORDS}"
echo "ModuleNotFoundError: No module named 'planted_by_the_test'" >&2
exit 1
"""
# The server's kernel manager, slow to answer one start (when the file "slow" is there), as a busy
# server or a remote provisioner is: the kernel starts after the POST was given up.
SLOW = """import asyncio, os
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

class SlowKernelManager(AsyncMappingKernelManager):
    async def start_kernel(self, **kwargs):
        flag = os.path.join(os.path.dirname(__file__), "slow")
        if os.path.exists(flag):
            os.unlink(flag)
            await asyncio.sleep(9)
        return await super().start_kernel(**kwargs)
"""


def as_uid(uid: int) -> list[str]:
    """The command that runs what follows as ``uid`` (no passwd entry needed), with no group of
    ours. This interpreter may lie under a directory closed to that uid (root's home): the process
    reads it with CAP_DAC_READ_SEARCH, as an image's Python is readable to its user; nothing it
    starts through the suite (which drops to a uid with no capability) keeps it."""
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv (util-linux) to run a process as another uid")
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=+dac_read_search",
            "--ambient-caps=+dac_read_search", "--"]


class OwnJupyter:
    """A real Jupyter Server run as ``uid``, its root, runtime and data dirs that uid's, with the
    slow kernel manager above."""

    def __init__(self, uid: int) -> None:
        import tempfile

        from tests.servers import free_port, wait_port

        self.root = Path(tempfile.mkdtemp(prefix="hc-jupyter-"))
        self.port, self.base_url, self.runtime, self.uid = free_port(), "/", self.root / "runtime", uid
        (self.root / "lib").mkdir()
        (self.root / "lib" / "slow_km.py").write_text(SLOW)
        (self.root / "record.sh").write_text(RECORDER)
        kernelspec(self.root / "data", "record", ["/bin/sh", str(self.root / "record.sh"), "{connection_file}"])
        kernelspec(self.root / "data", "ok", [sys.executable, *LAUNCH])
        for path in [self.root, *self.root.rglob("*")]:
            os.chown(path, uid, uid)
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(self.runtime), "JUPYTER_DATA_DIR": str(self.root / "data"),
               "JUPYTER_CONFIG_DIR": str(self.root / "config"), "JUPYTER_PLATFORM_DIRS": "1", "JUPYTER_NO_CONFIG": "1",
               "HOME": str(self.root), "PYTHONPATH": str(self.root / "lib")}
        argv = [sys.executable, "-m", "jupyter_server", f"--ServerApp.port={self.port}", "--ServerApp.ip=127.0.0.1",
                f"--IdentityProvider.token={TOKEN}", "--ServerApp.open_browser=False", "--ServerApp.port_retries=0",
                f"--ServerApp.root_dir={self.root}", "--ServerApp.kernel_manager_class=slow_km.SlowKernelManager",
                *(["--allow-root"] if uid == 0 else [])]
        self.log = open(self.root / "jupyter.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen([*as_uid(uid), *argv], env=env, cwd=self.root, stdout=self.log,
                                     stderr=self.log)
        wait_port("127.0.0.1", self.port, 60, self.proc)

    def records(self) -> list[list[str]]:
        path = self.root / RECORDS
        return [ln.split() for ln in path.read_text().splitlines()] if path.exists() else []

    def stop(self) -> None:
        from tests.servers import stop

        stop(self.proc)
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def other() -> Iterator[OwnJupyter]:
    from tests.services.conftest import needs_root

    needs_root()
    server = OwnJupyter(OTHER)
    yield server
    server.stop()


def test_a_dead_kernelspec_of_the_servers_user_runs_again_only_as_that_uid(other: OwnJupyter, tmp_path: Path) -> None:
    state = State.open(str(tmp_path / "state"))
    r = probe(other, kernel="record", state=state)  # the listener's uid: OTHER, found without ptrace
    assert r.reason == "kernel-died", r.message
    assert "ModuleNotFoundError: No module named 'planted_by_the_test'" in r.message, r.message
    runs = other.records()
    assert runs and {uid for uid, *_ in runs} == {str(OTHER)}, runs  # the server's starts, and ours: never root
    replays = [run for run in runs if run[1] == "/dev/fd/3"]
    assert replays == [[str(OTHER), "/dev/fd/3", "600", str(OTHER)]], runs  # its connection file: 0600, the uid's
    assert os.listdir(tmp_path / "state" / "scratch") == [], "the replay's scratch dir outlived it"


def test_without_the_servers_uid_nothing_runs_again(other: OwnJupyter, tmp_path: Path) -> None:
    before = len(other.records())
    r = probe(other, kernel="record", uid=None, state=State.open(str(tmp_path / "state")))
    assert r.reason == "kernel-died", r.message
    assert "the cause was not read (the server's user is not known" in r.message, r.message
    assert all(run[1] != "/dev/fd/3" for run in other.records()[before:])


def test_a_suite_that_is_not_root_runs_nothing_of_another_uid(other: OwnJupyter, tmp_path: Path) -> None:
    # The suite as uid 4343 (not root, not the server's): it may not become the server's user.
    state = other.root / "suite-state"
    state.mkdir()
    os.chown(state, 4343, 4343)
    script = ("import json, sys, time\n"
              "from probes.config import Config\nfrom probes.context import Context\nfrom probes.state import State\n"
              "from probes.services import jupyter_kernel\nfrom probes.services.kernel_run import Server\n"
              "cfg = Config(torch_device='cpu', jupyter_kernel_name='record')\n"
              f"ctx = Context(cfg, time.monotonic() + 30, {{}}, State.open({str(state)!r}))\n"
              f"srv = Server('127.0.0.1', {other.port}, '/', False, {TOKEN!r}, None, {OTHER})\n"
              "print(jupyter_kernel.judge(jupyter_kernel.check(ctx, srv), ctx).message)\n")
    before = len(other.records())
    res = subprocess.run([*as_uid(4343), sys.executable, "-c", script], env={**clean_env(), "PYTHONPATH": str(ROOT)},
                         cwd="/", capture_output=True, text=True, timeout=60, check=False)
    assert f"the cause was not read (the suite may not run as the server's user (uid {OTHER})" in res.stdout, \
        res.stdout + res.stderr
    assert all(run[1] != "/dev/fd/3" for run in other.records()[before:])
    assert kernel_ids(other) == set()


@pytest.mark.parametrize("apart", [True, False], ids=["suite-per-run", "one-process-as-serve"])
def test_a_post_answered_after_the_probe_gave_up_leaves_no_kernel_after_the_next_run(other: OwnJupyter,
                                                                                      tmp_path: Path,
                                                                                      apart: bool) -> None:
    def run(timeout: int) -> str:
        if apart:
            env = _env(other, tmp_path, HEALTHCHECK_JUPYTER_KERNEL_NAME="ok", HEALTHCHECK_TIMEOUT=str(timeout))
            return run_cli("--profile", "startup", "--only", "jupyter-kernel", env=env).stdout
        return probe(other, timeout=timeout, uid=OTHER, state=State.open(str(tmp_path / "state"))).message

    (other.root / "lib" / "slow").write_text("")
    first = run(8)
    assert "took too long to start; the next run removes it" in first, first

    end = time.monotonic() + 20
    while not kernel_ids(other) and time.monotonic() < end:
        time.sleep(0.2)
    late = kernel_ids(other)
    assert late, "the slow start never finished"
    run(30)
    assert not kernel_ids(other) & late, "the late kernel is still there"


def test_a_suite_killed_mid_check_leaves_no_kernel_after_the_next_run(kserver: Jupyter, tmp_path: Path) -> None:
    before = kernel_ids(kserver)
    env = _env(kserver, tmp_path, HEALTHCHECK_JUPYTER_KERNEL_NAME="hangs", HEALTHCHECK_TIMEOUT="30",
               PYTHONPATH=str(ROOT))
    suite = subprocess.Popen([sys.executable, "-m", "probes", "--profile", "startup", "--only", "jupyter-kernel"],
                             env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 20
        while not leftovers(HANG) and time.monotonic() < end:
            time.sleep(0.05)
        assert leftovers(HANG), "the hanging kernel never started"
    finally:
        suite.kill()  # as a runtime ends a probe at its timeout, or the OOM killer does
        suite.wait()
    assert kernel_ids(kserver) - before, "the killed suite's kernel should still be listed"
    res = run_cli("--profile", "startup", "--only", "jupyter-kernel",
                  env={**env, "HEALTHCHECK_JUPYTER_KERNEL_NAME": "ok"})
    assert res.returncode == 0, res.stdout
    assert kernel_ids(kserver) <= before and not wait_gone(HANG), "the killed suite's kernel was left"
    assert not [n for n in os.listdir(tmp_path / "state") if n.startswith("kernel-")], "a record was left"


def test_an_idle_servers_activity_is_left_alone_and_a_used_one_is_checked(kserver: Jupyter, tmp_path: Path) -> None:
    # TTL 0: no pass is reused for its age; an idle server keeps its last result all the same.
    env = _env(kserver, tmp_path, HEALTHCHECK_JUPYTER_KERNEL_NAME="ok", HEALTHCHECK_JUPYTER_KERNEL_TTL="0")
    first = run_cli("--only", "jupyter-kernel", env=env)
    assert first.returncode == 0 and "idle" not in first.stdout, first.stdout
    time.sleep(jupyter_kernel.SLACK + 0.5)  # the kernel's last messages, shut down
    idle = api(kserver, "GET", "api/status?no_track_activity=1")
    for _ in range(3):
        again = run_cli("--only", "jupyter-kernel", env=env)
        assert again.returncode == 0 and "the server has been idle since" in again.stdout, again.stdout
    assert api(kserver, "GET", "api/status?no_track_activity=1")["last_activity"] == idle["last_activity"]
    kid = api(kserver, "POST", "api/kernels", {"name": "ok"})["id"]  # the user opens a notebook
    try:
        used = run_cli("--only", "jupyter-kernel", env=env)
        assert used.returncode == 0 and "idle" not in used.stdout and "cached" not in used.stdout, used.stdout
    finally:
        api(kserver, "DELETE", f"api/kernels/{kid}")


def test_a_reused_pass_loads_nothing_a_kernel_start_needs(kserver: Jupyter, tmp_path: Path) -> None:
    """Readiness pays the kernel check's client (websocket, uuid and its platform, subprocess) only
    when it starts a kernel, not when it reuses the last pass of an idle server."""
    env = _env(kserver, tmp_path, HEALTHCHECK_JUPYTER_KERNEL_NAME="ok")
    assert run_cli("--only", "jupyter-kernel", env=env).returncode == 0
    script = ("import sys\nfrom probes.cli import main\nmain(['--only', 'jupyter-kernel'])\n"
              "print(','.join(sorted({'websocket', 'uuid', 'platform', 'subprocess'} & set(sys.modules))))\n")
    res = subprocess.run([sys.executable, "-I", "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=False)
    lines = res.stdout.splitlines()
    assert "the server has been idle since" in res.stdout and lines[-1] == "", res.stdout + res.stderr


def test_a_kernel_that_dies_at_start_is_seen_within_seconds_even_on_a_busy_machine(kserver: Jupyter,
                                                                                   tmp_path: Path) -> None:
    for load in (0, os.cpu_count() or 2):
        state = State.open(str(tmp_path / f"state-{load}"))  # a fresh check, not the last result
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
        try:
            t0 = time.monotonic()
            r = probe(kserver, kernel="shadowed", state=state)
            took = time.monotonic() - t0
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
        assert r.reason == "kernel-died", r.message
        # The module and the file that broke it, before the server's restarter starts it again
        # (it looks every 3 s; the replay that reads the line is a Python start), not after the
        # kernel's whole share (~26 s).
        assert f"cannot import name 'kernelapp' from 'ipykernel' ({kserver.root}/stale/ipykernel/" in r.message
        assert took < 6.0, f"{took:.1f}s with {load} busy loops"


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    # In a PID namespace of its own: the kernel's process (pid, start) ends, and its pid is given
    # to another process (the namespace's next pid set just below it) with a session of its own,
    # before the clean-up that has the pair: neither that process nor its session is touched.
    from tests.services.conftest import needs_root

    needs_root()
    if not shutil.which("unshare"):
        pytest.skip("needs unshare (util-linux)")
    script = f"""
import os, subprocess, sys, time
sys.path.insert(0, {str(ROOT)!r})
from probes import pidstat
from probes.services import kernel_run
from probes.services.kernel_run import Server
from probes.state import State
kernel = subprocess.Popen(["sleep", "60"])
pair = {{kernel.pid: pidstat.stat(kernel.pid).start}}
kernel.kill(); kernel.wait()
time.sleep(0.05)  # start times count 10 ms ticks: a pid reused within one is the same pair
with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
    fh.write(str(kernel.pid - 1))
other = subprocess.Popen(["setsid", "sh", "-c", "sleep 60 & exec sleep 60"])
assert other.pid == kernel.pid, (other.pid, kernel.pid)
time.sleep(0.3)
srv = Server("127.0.0.1", 9, "/", False, "", None)
kernel_run.remove(State.off("test"), srv, "00000000-0000-4000-8000-000000000000",
                  {{"answered": True, "time": time.time()}}, pair, time.monotonic() + 3)
time.sleep(0.5)
session = [p for p, st in pidstat.table(alive=True).items() if st.sid == other.pid]
print(other.poll(), len(session))
"""
    res = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.stdout.split() == ["None", "2"], res.stdout + res.stderr
