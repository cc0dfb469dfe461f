"""The command as Docker and the kubelet run it: whole processes, exit status and output only."""

from __future__ import annotations

import json
import re
import subprocess
import sys
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
    assert names == list(registry.NAMES)
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
    assert run_cli("--help").returncode == 0
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


def test_unwritable_log_file_is_a_note_not_a_crash(tmp_path):
    res = run_cli(env=clean_env(HEALTHCHECK_LOG_FILE=str(tmp_path / "no" / "dir" / "x.log"), **ALL_OFF))
    assert res.returncode == 0 and "Traceback" not in res.stderr


def test_front_door_profile_table_matches_the_suite():
    script = (ROOT / "healthcheck").read_text()
    table = dict(re.findall(r"^\s+\*?\)?\s*([a-z]+)\) budget=(\d+)", script, re.M))
    default = re.search(r"^\s+\*\) budget=(\d+)", script, re.M)
    assert default is not None
    table.setdefault("readiness", default.group(1))
    assert {k: float(v) for k, v in table.items()} == config.PROFILE_TIMEOUTS


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


def test_an_internal_error_shows_no_traceback_or_exception_text(tmp_path):
    """A bug inside the suite still answers with one line and exit 1; the exception's text
    (which may hold a token or a path) goes only to the log."""
    log = tmp_path / "hc.log"
    script = ("import sys\nfrom probes import cli\n"
              "def boom(argv):\n    cli._setup_log(cli.load())\n    raise RuntimeError('secret-token-xyz')\n"
              "cli.check = boom\nsys.exit(cli.main([]))\n")
    for env in (clean_env(), clean_env(HEALTHCHECK_LOG_FILE=str(log))):
        res = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True,
                             text=True, timeout=60, check=False)
        assert res.returncode == 1
        assert res.stdout == "unhealthy: healthcheck: internal error (RuntimeError); details in the log\n"
        assert res.stderr == ""
    assert "secret-token-xyz" in log.read_text()  # the detail is in the log, where it belongs
