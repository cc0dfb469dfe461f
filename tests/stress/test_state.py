"""The state dir under pressure: 50 concurrent runs share one torch run and leave it valid;
a read-only or full state dir turns caching off and never crashes a run.

Whole processes through the front door, with the real torch on the CPU (through a wrapper
that counts how often the worker starts), a real sshd and a real Jupyter Server, and the
GPU faked at the driver boundary (stub nvidia-smi, fake libnvidia-ml.so.1) when the fake
library can be built.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from probes import config
from tests.conftest import ROOT, clean_env
from tests.stress.conftest import VENV_PY, fake_nvml_env, write_exe

pytestmark = pytest.mark.stress

CONCURRENT = 50


def counting_python(d: Path) -> tuple[Path, Path]:
    """A stand-in for the image's python that records each start, then runs the real one."""
    count = d / "torch-starts"
    count.touch()
    count.chmod(0o666)
    wrapper = write_exe(d / "python-counting", f'echo $$ >> {count}\nexec {VENV_PY} "$@"')
    return wrapper, count


def starts(count: Path) -> int:
    return len(count.read_text().split())


def healthcheck(env: dict[str, str], *args: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    return subprocess.Popen([*prefix, str(ROOT / "healthcheck"), *args], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(p: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def assert_state_valid(state: Path) -> None:
    st = os.lstat(state)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)
    names = os.listdir(state)
    temps = [n for n in names if n.endswith(".tmp") or n.startswith(".")]
    assert not temps, f"temporary files left in the state dir: {temps}"
    for n in names:
        if n.endswith(".json"):
            data = json.loads((state / n).read_text())  # raises on a torn write
            assert isinstance(data, dict), n


@pytest.fixture
def full_env(tmp_path: Path, sshd_port: int, jupyter_server: tuple[int, Path]) -> tuple[dict[str, str], Path]:
    """Every probe enabled: GPU faked (or off without the fake library), torch on the CPU."""
    torch_py, count = counting_python(tmp_path)
    env = clean_env(HEALTHCHECK_PYTHON=VENV_PY, HEALTHCHECK_TORCH_PYTHON=str(torch_py),
                    HEALTHCHECK_TORCH_DEVICE="cpu", HEALTHCHECK_TORCH_TTL="3600",
                    HEALTHCHECK_STATE_DIR=str(tmp_path / "state"), HEALTHCHECK_SSH_PORT=str(sshd_port),
                    HEALTHCHECK_JUPYTER_PORT=str(jupyter_server[0]),
                    HEALTHCHECK_JUPYTER_RUNTIME_DIR=str(jupyter_server[1]),
                    HEALTHCHECK_GPU_COUNT="1", NO_PROXY="*",
                    # a kernel per run is not what this stresses (tests/services/test_jupyter_kernel.py)
                    ENABLE_JUPYTER_KERNEL_CHECK="false")
    nvml = fake_nvml_env()
    if nvml is not None:
        from tests.fakes.nvidia_smi_stub import write_stub

        write_stub(tmp_path / "bin", "ok", gpus=1)
        (tmp_path / "scenario").write_text("gpus 1\n")
        env.update(nvml, FAKE_NVML_SCENARIO=str(tmp_path / "scenario"),
                   PATH=f"{tmp_path / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}")
    else:
        env["ENABLE_GPU_CHECK"] = "false"
    return env, count


def test_fifty_concurrent_runs_share_one_torch_run_and_leave_state_valid(
        full_env: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    env, count = full_env
    # Every probe this configuration runs must pass (from the registry: a new probe counts too).
    # ssh-keys needs a dev user, which this machine has not (tests/services/test_ssh_keys.py): skipped here.
    expected = {p: {s.name for s in config.load(env, profile=p, skip="ssh-keys").selected()}
                for p in ("readiness", "liveness")}
    assert {"torch-cuda", "jupyter", "ssh"} <= expected["liveness"] <= expected["readiness"]
    for wave in (1, 2):
        profiles = ["liveness" if i % 5 == 4 else "readiness" for i in range(CONCURRENT)]
        procs = [healthcheck(env, "--profile", prof, "--skip", "ssh-keys") for prof in profiles]
        problems = []
        for prof, p in zip(profiles, procs):
            code, out, err = finish(p)
            lines = out.splitlines()
            passed = {ln.split()[1] for ln in lines[1:] if ln.startswith("PASS ")}
            if code != 0 or not lines or not lines[0].startswith("healthy") or passed != expected[prof]:
                problems.append(f"{prof}: exit {code}: {out[:300]!r} {err[-200:]!r}")
        assert not problems, f"wave {wave}: {len(problems)} of {CONCURRENT} wrong: {problems[:3]}"
        # One costly check at a time: the first wave shares one worker, the second reuses its result.
        assert starts(count) == 1, f"wave {wave}: the torch worker started {starts(count)} times"
        assert_state_valid(tmp_path / "state")


# ---------------------------------------------------------------- read-only and full state dirs

@pytest.fixture
def torch_only_env() -> Iterator[tuple[dict[str, str], Path]]:
    """Only torch-cuda (readiness, CPU): the probe that uses the cache."""
    shared = Path(tempfile.mkdtemp(prefix="hcstress-state-"))
    shared.chmod(0o755)  # reachable by `nobody` too
    torch_py, count = counting_python(shared)
    env = clean_env(HEALTHCHECK_PYTHON=VENV_PY, HEALTHCHECK_TORCH_PYTHON=str(torch_py),
                    HEALTHCHECK_TORCH_DEVICE="cpu", HEALTHCHECK_TORCH_TTL="3600",
                    ENABLE_GPU_CHECK="false", ENABLE_JUPYTER_CHECK="false", ENABLE_SSH_CHECK="false")
    yield env, count
    shutil.rmtree(shared, ignore_errors=True)


def run_twice(env: dict[str, str], prefix: tuple[str, ...] = ()) -> list[str]:
    outs = []
    for _ in range(2):
        code, out, err = finish(healthcheck(env, "--profile", "readiness", prefix=prefix))
        assert code == 0, f"exit {code}: {out!r} {err!r}"
        assert out.startswith("healthy"), out
        assert "Traceback" not in out + err, err
        assert "PASS torch-cuda" in out, out
        outs.append(out)
    return outs


def test_state_dir_below_a_file_turns_caching_off(torch_only_env: tuple[dict[str, str], Path],
                                                  tmp_path: Path) -> None:
    env, count = torch_only_env
    (tmp_path / "file").write_text("not a directory")
    env["HEALTHCHECK_STATE_DIR"] = str(tmp_path / "file" / "state")
    for out in run_twice(env):
        assert "caching off" in out, out
    assert starts(count) == 2, "without a state dir every run starts its own worker"


@contextlib.contextmanager
def tmpfs(path: Path, options: str) -> Iterator[None]:
    path.mkdir(exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root (mount -t tmpfs)")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()[:120]}")
    try:
        yield
    finally:
        for _ in range(20):
            if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode == 0:
                break
            time.sleep(0.1)


def test_read_only_mount_turns_caching_off(torch_only_env: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    env, count = torch_only_env
    with tmpfs(tmp_path / "ro", "ro,size=64k,mode=0755"):
        env["HEALTHCHECK_STATE_DIR"] = str(tmp_path / "ro" / "healthcheck")
        for out in run_twice(env):
            assert "caching off" in out, out
    assert starts(count) == 2


def test_unwritable_dir_as_non_root_turns_caching_off(torch_only_env: tuple[dict[str, str], Path]) -> None:
    env, count = torch_only_env
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or not setpriv:
        pytest.skip("needs root and setpriv (util-linux) to run the check as nobody")
    import pwd

    nobody = pwd.getpwnam("nobody")
    prefix = (setpriv, f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups", "--")
    # The front door's own test ([ -x ]) and an import, as nobody.
    probe = subprocess.run([*prefix, "bash", "-c", '[ -x "$1" ] && "$1" -I -c "import probes"', "_", VENV_PY],
                           capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"nobody cannot run the suite's interpreter {os.path.realpath(VENV_PY)} "
                    "(a parent directory is private); the read-only mount test covers this case")
    base = Path(tempfile.mkdtemp(prefix="hcstress-ro-"))
    try:
        base.chmod(0o755)
        state = base / "state"
        state.mkdir(mode=0o500)
        os.chown(state, nobody.pw_uid, nobody.pw_gid)
        state.chmod(0o500)  # owned by the user, mode right, but not writable
        env.update(HEALTHCHECK_STATE_DIR=str(state), HOME=str(base))
        for out in run_twice(env, prefix):
            assert "caching off" in out, out
        assert starts(count) == 2
        assert os.listdir(state) == []
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_full_state_dir_keeps_answering(torch_only_env: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    env, count = torch_only_env
    mnt = tmp_path / "full"
    with tmpfs(mnt, "size=16k,mode=0755"):
        state = mnt / "healthcheck"
        state.mkdir(mode=0o700)
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * 4096):
                    pass
        finally:
            os.close(fd)
        env["HEALTHCHECK_STATE_DIR"] = str(state)
        run_twice(env)
        assert_state_valid(state)
        # Nothing could be stored, so nothing was reused.
        assert starts(count) == 2
