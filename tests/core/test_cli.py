"""The command as Docker and the kubelet run it: whole processes, exit status and output only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from probes import config, registry
from tests.conftest import ROOT, clean_env, run_cli

ALL_OFF = {t: "false" for t in registry.TOGGLES}


def no_gpu_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This machine as it is: no nvidia-smi, no NVML, nothing on the service ports."""
    return clean_env(HEALTHCHECK_STATE_DIR=str(tmp_path / "state"),
                     HEALTHCHECK_JUPYTER_PORT="1", HEALTHCHECK_SSH_PORT="2",
                     PATH="/usr/bin:/bin", LD_LIBRARY_PATH=str(tmp_path), **extra)


def test_all_toggles_off_is_healthy_and_says_so():
    res = run_cli(env=clean_env(**ALL_OFF))
    assert res.returncode == 0
    assert res.stdout.startswith("healthy: all checks disabled (ENABLE_GPU_CHECK")
    assert res.stderr == ""


def test_defaults_on_a_machine_without_gpu_fail_with_first_failure_and_remedy(tmp_path):
    res = run_cli(env=no_gpu_env(tmp_path))
    assert res.returncode == 1, res.stdout + res.stderr
    first = res.stdout.splitlines()[0]
    assert first.startswith("unhealthy: nvidia-smi: ")
    assert "--gpus" in first  # the remedy: start the container with GPUs
    names = [line.split()[1] for line in res.stdout.splitlines()[1:] if not line.startswith("note")]
    on_by_default = [s.name for s in config.load(no_gpu_env(tmp_path)).selected()]
    assert names == on_by_default and set(on_by_default) >= {"nvidia-smi", "nvml", "torch-cuda", "jupyter", "ssh"}
    assert "Traceback" not in res.stdout + res.stderr


def test_json_parses_and_fails(tmp_path):
    res = run_cli("--json", env=no_gpu_env(tmp_path))
    assert res.returncode == 1
    doc = json.loads(res.stdout)
    assert doc["status"] == "fail"
    assert doc["output"].startswith("unhealthy: ")
    assert all(":" in key for key in doc["checks"])


@pytest.mark.parametrize("args,env,needle", [
    ((), {"ENABLE_SSH_CHECK": "maybe"}, "ENABLE_SSH_CHECK='maybe'"),
    ((), {"HEALTHCHECK_TIMEOUT": "-1"}, "HEALTHCHECK_TIMEOUT='-1'"),
    ((), {"HEALTHCHECK_SSH_PORT": "70000"}, "HEALTHCHECK_SSH_PORT='70000'"),
    (("--profile", "nope"), {}, "--profile='nope'"),
    (("--only", "nosuchprobe"), {}, "--only: unknown probe 'nosuchprobe'"),
    (("--frobnicate",), {}, "unrecognized arguments: '--frobnicate'"),
])
@pytest.mark.parametrize("front_door", [False, True])
def test_usage_errors_exit_3_with_one_line(args, env, needle, front_door):
    res = run_cli(*args, env=clean_env(**env), front_door=front_door)
    assert res.returncode == 3
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("healthcheck: ") and needle in lines[0]
    assert "accepted" in lines[0] or "--help" in lines[0]


def test_help_and_version_exit_0():
    helped = run_cli("--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: healthcheck [--profile PROFILE]")
    assert all(f"  {s.name} ({s.layer}, {s.toggle}): " in helped.stdout for s in registry.PROBES)
    res = run_cli("--version")
    assert res.returncode == 0 and res.stdout.startswith("healthcheck ")


def test_log_file_gets_one_line_per_run_and_rotates(tmp_path):
    log = tmp_path / "hc.log"
    env = clean_env(HEALTHCHECK_LOG_FILE=str(log), **ALL_OFF)
    for _ in range(2):
        assert run_cli("--only", "ssh", env={**env, "HEALTHCHECK_SSH_PORT": "2"}).returncode == 1
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and all("readiness exit=1 ssh=fail" in line for line in lines)
    log.write_bytes(b"x" * (1 << 20))
    run_cli("--only", "ssh", env={**env, "HEALTHCHECK_SSH_PORT": "2"})
    assert (tmp_path / "hc.log.1").exists() and log.stat().st_size < 4096


def test_a_check_exits_without_finalization_or_gc_after_flushing_its_output_and_log(tmp_path):
    """The process's entry skips interpreter finalization (atexit handlers, module teardown): its
    report, buffered text and run log are out first; serve exits the ordinary way. The front door
    turns the collector off before any import; serve, a long-lived server, turns it on again."""
    log = tmp_path / "hc.log"
    script = ("import atexit, gc, sys\ngc.disable()\natexit.register(lambda: print('finalized'))\n"
              "from probes import cli\nmain = cli.main\n"
              "cli.main = lambda argv: print(f'gc={gc.isenabled()}', end='|') or main(argv)\n"
              "sys.stdout.write('buffered before the report|')\ncli.entry()\n")
    env = clean_env(HEALTHCHECK_LOG_FILE=str(log), HEALTHCHECK_SSH_PORT="2", **ALL_OFF)
    res = subprocess.run([sys.executable, "-I", "-c", script, "--only", "ssh"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 1, res.stdout + res.stderr
    # A check also runs without the cyclic garbage collector; serve keeps it.
    assert res.stdout.startswith("buffered before the report|gc=False|unhealthy: ssh: connection refused"), \
        res.stdout
    assert "finalized" not in res.stdout
    assert "readiness exit=1 ssh=fail" in log.read_text()
    serve = subprocess.run([sys.executable, "-I", "-c", script, "serve", "--port", "x"], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=60, check=False)
    assert serve.returncode == 3 and serve.stdout.endswith("gc=True|finalized\n"), serve.stdout + serve.stderr


@pytest.mark.parametrize("umask", [0o177, 0o277, 0o477, 0o777], ids=oct)
def test_the_log_file_is_0600_whatever_the_umask_and_rotation_keeps_it(tmp_path, umask):
    """A umask of 0277 or more would leave the log the suite creates unwritable (or unreadable) by
    its own user at the next run; 0600 is what it asks for."""
    log = tmp_path / "hc.log"
    env = clean_env(HEALTHCHECK_LOG_FILE=str(log), HEALTHCHECK_SSH_PORT="2", **ALL_OFF)

    def run_under_umask() -> None:
        res = subprocess.run([sys.executable, "-m", "probes", "--only", "ssh"], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=60, check=False,
                             preexec_fn=lambda: os.umask(umask))
        assert res.returncode == 1 and "log file" not in res.stdout + res.stderr, res.stdout + res.stderr

    run_under_umask()
    assert oct(log.stat().st_mode & 0o7777) == oct(0o600)
    log.write_bytes(b"x" * (1 << 20))
    run_under_umask()  # rotates: hc.log.1 is the old file, hc.log a new one
    assert oct(log.stat().st_mode & 0o7777) == oct(0o600) and "ssh=fail" in log.read_text()
    assert oct((tmp_path / "hc.log.1").stat().st_mode & 0o7777) == oct(0o600)


def test_unwritable_log_file_is_a_note_not_a_crash(tmp_path):
    res = run_cli(env=clean_env(HEALTHCHECK_LOG_FILE=str(tmp_path / "no" / "dir" / "x.log"), **ALL_OFF))
    assert res.returncode == 0 and "Traceback" not in res.stderr


def test_a_flood_of_unknown_flags_is_one_bounded_line():
    for front_door in (False, True):
        res = run_cli(*[f"--bogus{i}" for i in range(1500)], front_door=front_door)
        assert res.returncode == 3 and res.stdout == ""
        lines = res.stderr.splitlines()
        assert len(lines) == 1 and len(lines[0].encode()) <= 400
        assert "unrecognized arguments: '--bogus0'" in lines[0] and "1497 more" in lines[0]


@pytest.mark.parametrize("front_door", [False, True])
def test_newlines_and_escapes_in_a_setting_are_made_visible(front_door):
    res = run_cli(env=clean_env(HEALTHCHECK_SSH_PORT="22\n\x1b[2J\x07\x00"[:-1] + "x" * 5000),
                  front_door=front_door)
    assert res.returncode == 3 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and len(res.stderr.encode()) <= 400
    assert "\\n\\x1b[2J\\x07" in res.stderr and "\x1b" not in res.stderr and "\x07" not in res.stderr


def test_a_front_door_error_about_the_interpreter_is_one_visible_line():
    res = subprocess.run([str(ROOT / "healthcheck")], env=clean_env(HEALTHCHECK_PYTHON="/x\n\x1b[31m" + "y" * 500),
                         capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 3 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "\x1b" not in res.stderr and len(res.stderr) < 400


# Whatever the environment and arguments, the command answers 0, 1 or 3, without a
# traceback and within Docker's 4096 bytes.
VALUES = st.one_of(
    st.sampled_from(["", "true", "false", "1", "0", "yes", "off", "maybe", "-1", "0.5", "2", "70000",
                     "65535", "nan", "inf", "1e309", "cpu", "cuda", "tpu", "startup", "readiness",
                     "liveness", "/", "/lab", "127.0.0.1", "::1", "localhost", "a b", "\t"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
            max_size=300),
)
VARIABLES = [*registry.TOGGLES, "HEALTHCHECK_PROFILE", "HEALTHCHECK_TIMEOUT", "HEALTHCHECK_HOST",
             "HEALTHCHECK_JUPYTER_PORT", "HEALTHCHECK_SSH_PORT", "HEALTHCHECK_GPU_COUNT",
             "HEALTHCHECK_TORCH_DEVICE", "HEALTHCHECK_TORCH_TTL", "HEALTHCHECK_JUPYTER_BASE_URL"]
ARGS = st.lists(st.one_of(
    st.sampled_from(["--profile", "startup", "liveness", "--json", "-v", "--only", "--skip", "ssh",
                     "jupyter,nvml", "nope", "--", "-x", "serve-not"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
            max_size=40)), max_size=5)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(env=st.dictionaries(st.sampled_from(VARIABLES), VALUES, max_size=6), args=ARGS)
def test_any_input_gives_0_1_or_3_without_traceback_under_4096_bytes(tmp_path, env, args):
    if args and args[0] == "serve":
        args = args[1:]
    base = no_gpu_env(tmp_path, HEALTHCHECK_TORCH_PYTHON="/nonexistent/python3")
    res = run_cli(*args, env={**base, **env}, timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode in (0, 1, 3), out
    assert "Traceback" not in out
    assert len(res.stdout.encode()) < 4096 and len(res.stderr.encode()) < 4096
    if res.returncode == 3:  # a usage error: one bounded line, nothing on stdout
        assert res.stdout == "" and res.stderr.count("\n") == 1, out
        assert len(res.stderr.encode()) <= 400 and res.stderr.isprintable() is False  # the final newline
        assert res.stderr[:-1].isprintable(), out


def test_an_internal_error_shows_no_traceback_or_exception_text(tmp_path):
    """A bug inside the suite still answers with one line and exit 1; the exception's text
    (which may hold a token or a path) goes only to the log."""
    log = tmp_path / "hc.log"
    script = ("import sys\nfrom probes import cli, runner\n"
              "def boom(config, state):\n    raise RuntimeError('secret-token-xyz')\n"
              "runner.run = boom\nsys.exit(cli.main([]))\n")
    for env in (clean_env(), clean_env(HEALTHCHECK_LOG_FILE=str(log))):
        res = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True,
                             text=True, timeout=60, check=False)
        assert res.returncode == 1
        assert res.stdout == "unhealthy: healthcheck: internal error (RuntimeError); details in the log\n"
        assert res.stderr == ""
    assert "secret-token-xyz" in log.read_text()  # the detail is in the log, where it belongs


# The run log can never hurt the run: no block, no traceback, the same verdict.
def _log_target(tmp_path: Path, kind: str) -> Path:
    log = tmp_path / "hc.log"
    if kind == "fifo":
        os.mkfifo(log)
    elif kind == "directory":
        log.mkdir()
    elif kind == "device":
        log = Path("/dev/full")
    elif kind == "symlink":
        (tmp_path / "elsewhere").write_text("")
        log.symlink_to(tmp_path / "elsewhere")
    elif kind == "rotation":  # due for rotation, but hc.log.1 is a non-empty directory: the rename fails
        log.write_bytes(b"x" * (1 << 20))
        (tmp_path / "hc.log.1").mkdir()
        (tmp_path / "hc.log.1" / "keep").write_text("")
    return log


@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "symlink", "rotation"])
def test_a_log_file_that_cannot_be_used_never_blocks_or_changes_the_verdict(tmp_path, kind):
    log = _log_target(tmp_path, kind)
    res = run_cli(env=clean_env(HEALTHCHECK_LOG_FILE=str(log), **ALL_OFF), timeout=20)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("healthy: ")
    notes = [line for line in lines if line.startswith("note: log file ")]
    assert len(notes) == 1, res.stdout
    if kind == "symlink":
        assert (tmp_path / "elsewhere").read_text() == ""  # nothing written through the link
    if kind == "rotation":
        assert (tmp_path / "hc.log.1" / "keep").exists()


def test_serve_with_a_fifo_as_log_file_still_serves(tmp_path):
    from tests.servers import free_port, stop

    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    port = free_port()
    env = clean_env(HEALTHCHECK_LOG_FILE=str(fifo), HEALTHCHECK_STATE_DIR=str(tmp_path / "state"),
                    HEALTHCHECK_SERVE_XID_WATCH="false", **ALL_OFF)
    proc = subprocess.Popen([sys.executable, "-m", "probes", "serve", "--port", str(port)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        import urllib.request

        end = time.monotonic() + 20
        status = None
        while status is None and time.monotonic() < end:
            try:
                opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
                with opener.open(f"http://127.0.0.1:{port}/livez", timeout=2) as r:
                    status = r.status
            except OSError as exc:
                status = getattr(exc, "code", None)
                time.sleep(0.1)
        assert status in (200, 503), "serve did not answer: it blocked on the FIFO"
    finally:
        stop(proc)
    err = proc.stderr.read().decode()  # type: ignore[union-attr]
    assert "Traceback" not in err
    assert err.splitlines()[0] == f"healthcheck serve: log file {fifo} not usable (not a regular file): " \
                                  "logging to stderr instead"


@pytest.mark.parametrize("stdout", ["closed", "full"])
def test_a_closed_or_full_stdout_keeps_the_verdicts_exit_status(tmp_path, stdout):
    env = clean_env(HEALTHCHECK_STATE_DIR=str(tmp_path / "state"), **ALL_OFF)
    for front_door in (False, True):
        argv = [str(ROOT / "healthcheck")] if front_door else [sys.executable, "-m", "probes"]
        if front_door:
            env["HEALTHCHECK_PYTHON"] = sys.executable
        if stdout == "closed":
            res = subprocess.run(["bash", "-c", 'exec "$@" >&-', "-", *argv], env=env, cwd=ROOT,
                                 stderr=subprocess.PIPE, text=True, timeout=60, check=False)
        else:
            with open("/dev/full", "w") as full:
                res = subprocess.run(argv, env=env, cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True,
                                     timeout=60, check=False)
        assert res.returncode == 0, res.stderr
        assert res.stderr == ""

