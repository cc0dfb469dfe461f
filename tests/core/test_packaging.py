"""`pip install` gives the real `healthcheck` command, with everything the front door promises.

The wheel is built offline from a copy of the source tree and installed (no index, no
dependencies) into fresh `python -m venv --system-site-packages` environments; the installed
command then runs as Docker or a user would: a hard deadline on a hanging stub nvidia-smi,
exit 2 mapped to 1, a PYTHONPATH with its own `probes` package ignored, and the interpreter of
the environment it was installed into, found even through a symlink or in a path with spaces.
"""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import probes
from tests.conftest import ROOT, build_wheel, clean_env, suite_stub
from tests.servers import wait_gone
from tests.services.conftest import ScriptedServer

HARD_STOP = "unhealthy: healthcheck: no verdict within 4s (hard deadline): a probe is stuck; see HEALTHCHECK_LOG_FILE"


def sh(*argv: str | Path, timeout: float = 300, **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                          check=False, **kw)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{argv[:4]} exited {proc.returncode}: {proc.stdout[-1500:]}{proc.stderr[-1500:]}"
    return proc


def make_env(where: Path, wheel: Path) -> Path:
    """A fresh environment with the wheel installed offline; its bin directory."""
    sh(sys.executable, "-m", "venv", "--system-site-packages", where)
    sh(where / "bin" / "python", "-m", "pip", "install", "-q", "--no-index", "--no-deps",
       "--disable-pip-version-check", wheel)
    return where / "bin"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("scratch"))


@pytest.fixture(scope="module")
def bin_dir(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_env(tmp_path_factory.mktemp("env") / "venv", wheel)


def env_for(tmp: Path, **extra: str) -> dict[str, str]:
    """No ENABLE_*/HEALTHCHECK_*, no .venv on PATH: only the system and a stub bin dir."""
    stubs = tmp / "stubs"
    stubs.mkdir(exist_ok=True)
    env = clean_env(PATH=f"{stubs}:/usr/local/bin:/usr/bin:/bin", HEALTHCHECK_STATE_DIR=str(tmp / "state"),
                    **extra)
    for key in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(key, None)
    return env


def stub(tmp: Path, name: str, body: str) -> Path:
    path = tmp / "stubs" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(0o755)
    return path


def run(cmd: Path, *args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(cmd), *args], env=env, cwd="/", capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture
def ssh_port() -> Iterator[int]:
    """A server that sends an SSH identification line to every connection: the ssh probe passes."""
    srv = ScriptedServer(lambda conn: (conn.sendall(b"SSH-2.0-OpenSSH_9.2 packaging-test\r\n"), time.sleep(0.05)))
    yield srv.port
    srv.close()


def test_the_wheel_carries_the_one_front_door_and_the_version_from_one_place(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        script = f"gpu_healthcheck-{probes.__version__}.data/scripts/healthcheck"
        assert script in names, names
        assert zf.read(script) == (ROOT / "healthcheck").read_bytes(), "the repository's front door, unchanged"
        meta = email.message_from_bytes(zf.read(f"gpu_healthcheck-{probes.__version__}.dist-info/METADATA"))
        entry_points = zf.read(f"gpu_healthcheck-{probes.__version__}.dist-info/entry_points.txt").decode()
    assert meta["Version"] == probes.__version__
    # PEP 639's SPDX expression: setuptools deprecates the table form (it stops building in 2027).
    assert meta["License-Expression"] == "Apache-2.0" and meta["License"] is None
    requires = meta.get_all("Requires-Dist") or []
    assert [r for r in requires if r.startswith("prometheus")] == ['prometheus-client>=0.17; extra == "serve"'], \
        "only `healthcheck serve` needs prometheus-client: it is the `serve` extra"
    assert "healthcheck-probes = probes.cli:entry" in entry_points


def test_the_wheel_carries_the_worker_scaffold_beside_every_worker(wheel: Path) -> None:
    # Each worker loads worker_base.py by path from its own folder: the two must travel together.
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    framework = "probes/framework/"
    for worker in ("torch_worker.py", "model_worker.py", "nccl_worker.py", "checkpoint_child.py", "worker_base.py"):
        assert framework + worker in names, sorted(n for n in names if n.startswith(framework))


def test_installed_healthcheck_answers_help_and_a_real_run(bin_dir: Path, tmp_path: Path, ssh_port: int) -> None:
    env = env_for(tmp_path)
    helped = run(bin_dir / "healthcheck", "--help", env=env)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: healthcheck ") and "probes (layer, toggle):" in helped.stdout
    assert "Exit status: 0 healthy, 1 unhealthy" in helped.stdout

    ok = run(bin_dir / "healthcheck", "--only", "ssh", env={**env, "HEALTHCHECK_SSH_PORT": str(ssh_port)})
    assert ok.returncode == 0 and ok.stdout.startswith("healthy: "), ok.stdout + ok.stderr
    assert "PASS ssh" in ok.stdout

    # Linked from elsewhere (docs/image.md's recipe's /usr/local/bin/healthcheck), the same.
    link = tmp_path / "elsewhere" / "healthcheck"
    link.parent.mkdir()
    link.symlink_to(bin_dir / "healthcheck")
    refused = run(link, "--only", "ssh", env={**env, "HEALTHCHECK_SSH_PORT": "1"})
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stdout.startswith("unhealthy: ssh: connection refused"), refused.stdout
    assert refused.stderr == ""


def test_a_pythonpath_with_its_own_probes_package_cannot_shadow_the_suite(bin_dir: Path, tmp_path: Path,
                                                                         ssh_port: int) -> None:
    evil = tmp_path / "evil"
    (evil / "probes").mkdir(parents=True)
    marker = tmp_path / "shadowed"
    code = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    (evil / "probes" / "__init__.py").write_text(code)
    (evil / "probes" / "cli.py").write_text(code + "def main():\n    print('healthy: shadowed')\n    return 0\n")
    (evil / "sitecustomize.py").write_text(code)
    env = env_for(tmp_path, PYTHONPATH=str(evil), HEALTHCHECK_SSH_PORT=str(ssh_port))
    res = run(bin_dir / "healthcheck", "--only", "ssh", env=env)
    assert not marker.exists(), f"imported from PYTHONPATH: {marker.read_text()}"
    assert res.returncode == 0 and res.stdout.startswith("healthy: ") and "PASS ssh" in res.stdout, res.stdout


def test_the_hard_deadline_fires_on_a_hanging_nvidia_smi(bin_dir: Path, tmp_path: Path) -> None:
    # A wedged driver: ignores TERM and holds its output pipe open through a child.
    stub(tmp_path, "nvidia-smi", "trap '' TERM\nsleep 300 &\nsleep 300")
    env = env_for(tmp_path, ENABLE_GPU_CHECK="true", HEALTHCHECK_TIMEOUT="1")
    t0 = time.monotonic()
    res = run(bin_dir / "healthcheck", "--only", "nvidia-smi", env=env)
    elapsed = time.monotonic() - t0
    first = res.stdout.splitlines()[0] if res.stdout else ""
    assert res.returncode == 1, res.stdout + res.stderr
    # The suite's own 1 s deadline answers first; the front door's 4 s hard stop is the backstop.
    assert (first.startswith("unhealthy: nvidia-smi:") and "deadline" in first) or first == HARD_STOP, res.stdout
    assert elapsed < 4 + 1 + 10, f"{elapsed:.1f}s: past the hard deadline and its KILL"
    assert wait_gone(str(tmp_path / "stubs"), within=5) == [], "the stub outlived the run"


def test_a_suite_that_ignores_term_is_killed_at_the_hard_deadline(bin_dir: Path, tmp_path: Path) -> None:
    py = suite_stub(tmp_path / "stubs" / "py", "trap '' TERM\ndeadline 4\nwhile :; do sleep 0.1; done")
    env = env_for(tmp_path, HEALTHCHECK_PYTHON=str(py))
    t0 = time.monotonic()
    res = run(bin_dir / "healthcheck", env=env)
    elapsed = time.monotonic() - t0
    assert (res.returncode, res.stdout.strip()) == (1, HARD_STOP), res.stdout + res.stderr
    assert 4 + 1 <= elapsed < 4 + 1 + 10, f"{elapsed:.1f}s: TERM at 4 s, KILL a second later"
    assert wait_gone(str(py), within=5) == []


@pytest.mark.parametrize(("body", "said"), [("verdict 2", "status 2"),
                                            ("kill -SEGV $$", "status 139 (killed by signal 11) before its verdict")])
def test_exit_2_and_signals_become_1(bin_dir: Path, tmp_path: Path, body: str, said: str) -> None:
    py = suite_stub(tmp_path / "stubs" / "py", body)
    res = run(bin_dir / "healthcheck", env=env_for(tmp_path, HEALTHCHECK_PYTHON=str(py)))
    assert res.returncode == 1
    assert res.stdout == f"unhealthy: healthcheck: the suite ended with {said}\n"


def test_isolated_mode_and_serve_without_a_deadline(bin_dir: Path, tmp_path: Path) -> None:
    py = suite_stub(tmp_path / "stubs" / "py", 'echo "args: $* home=${_HEALTHCHECK_HOME-unset}"\n'
                    '[ "$4" != serve ] || exit 0  # serve is exec\'d: its own exit status')
    env = env_for(tmp_path, HEALTHCHECK_PYTHON=str(py), _HEALTHCHECK_HOME="/elsewhere")
    entry = ('-I -c import gc, os, sys; gc.disable() # no collection pauses (probes.cli.entry: on again for serve)'
             '\nsys.path[:0] = [home for home in [os.environ.pop("_HEALTHCHECK_HOME", "")] '
             'if home]\ntry: from probes.cli import entry\nexcept ImportError: sys.exit(250)\nentry(door=3)')
    # No source tree beside it: site-packages' suite, never a directory from the caller.
    served = run(bin_dir / "healthcheck", "serve", "--port", "1234", env=env)
    assert (served.returncode, served.stdout) == (0, f"args: {entry} serve --port 1234 home=unset\n")
    checked = run(bin_dir / "healthcheck", "--profile", "liveness", env=env)
    assert checked.stdout == f"args: {entry} --profile liveness home=unset\n", checked.stdout + checked.stderr


def test_an_environment_in_a_path_with_spaces(wheel: Path, tmp_path: Path, ssh_port: int) -> None:
    # The installer writes `#!/bin/sh` + `'''exec' "/path with spaces/python" ...` then.
    bin_dir = make_env(tmp_path / "with spaces" / ("v" * 100), wheel)
    assert (bin_dir / "healthcheck-probes").read_text().startswith("#!/bin/sh\n'''exec' ")
    res = run(bin_dir / "healthcheck", "--only", "ssh", env=env_for(tmp_path, HEALTHCHECK_SSH_PORT=str(ssh_port)))
    assert res.returncode == 0 and res.stdout.startswith("healthy: "), res.stdout + res.stderr


def test_without_an_interpreter_it_is_a_usage_error(bin_dir: Path, tmp_path: Path) -> None:
    lonely = tmp_path / "bin"
    lonely.mkdir()
    shutil.copy2(bin_dir / "healthcheck", lonely / "healthcheck")
    res = run(lonely / "healthcheck", env=env_for(tmp_path))
    assert res.returncode == 3 and res.stdout == ""
    assert res.stderr.startswith("healthcheck: no interpreter at "), res.stderr
    # Installed, but the environment's interpreter is gone: say so.
    (lonely / "healthcheck-probes").write_text(f"#!{tmp_path}/gone/python\nimport sys\n")
    res = run(lonely / "healthcheck", env=env_for(tmp_path))
    assert res.returncode == 3 and res.stderr.startswith("healthcheck: no interpreter named in "), res.stderr
    assert "reinstall gpu-healthcheck" in res.stderr
    assert os.access(bin_dir / "healthcheck", os.X_OK)
