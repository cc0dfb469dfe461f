"""Fixtures for the end-to-end tests: a real Docker engine and the built GPU dev image.

Stable interface (other e2e test modules rely on it):

- ``docker_engine`` (session): the engine's server version; skips (or, under ``make e2e``,
  fails) when no engine answers.
- ``image`` (session): the tag of the built image (``E2E_IMAGE``, default ``gpu-dev:e2e``);
  built from the repository's Dockerfile on the local CPU base when missing.
- ``start_container`` (function): ``start_container(*run_args, env=None, health=None,
  name=None, healthcheck=True, command=()) -> container id``. Starts ``docker run -d`` of the
  image; ``health`` is a ``Health`` of ``--health-*`` overrides (test speed comes from these,
  never from the Dockerfile); ``healthcheck=False`` adds ``--no-healthcheck``. Every container
  it starts is removed when the test ends. ``start_shared`` (module) is the same for a module's
  fixtures: a container that the tests which only read it share, removed when the module ends. Containers carry the label ``gpu-dev-e2e=<session>``
  (other sessions may share the engine, so nothing else is ever removed).
- Helpers: ``docker(*args)`` runs the CLI and returns CompletedProcess; ``health_of(cid)``
  returns ``.State.Health``; ``wait_for_health(cid, wanted, timeout)`` polls until the status
  is one of ``wanted`` and returns ``(status, seconds)``; ``exec_in(cid, *argv)``.

Every test container starts with ``ENABLE_GPU_CHECK=false`` and
``HEALTHCHECK_TORCH_DEVICE=cpu`` unless the test's ``env`` says otherwise: there is no GPU here;
and with ``SSH_AUTHORIZED_KEYS`` set to a public key (``USER_KEY``), as docs/image.md runs it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
LABEL = "gpu-dev-e2e"
SESSION = uuid.uuid4().hex[:12]
DEFAULT_IMAGE = "gpu-dev:e2e"
CPU_ENV = {"ENABLE_GPU_CHECK": "false", "HEALTHCHECK_TORCH_DEVICE": "cpu"}
# As docs/image.md runs it, a container has the user's public key (its private half exists
# nowhere): without one the ssh-keys probe warns that nobody can log in yet.
USER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKAkScCdCvGtUZqxZdyvU3UbAjv/xy/1ATDv6h4ggdd7 e2e-default"
DEFAULT_ENV = {**CPU_ENV, "SSH_AUTHORIZED_KEYS": USER_KEY}
# The HEALTHCHECK that docs/image.md and the README document: interval, timeout, start period and
# start interval in seconds, retries.
DOCUMENTED = (30, 35, 60, 5, 3)
# Measurements the tests take on the way (start-up and probe times), written for docs/image.md and docs/kubernetes.md.
TIMINGS_FILE = ROOT / ".e2e" / "timings.json"


@dataclasses.dataclass(frozen=True)
class Health:
    """``docker run --health-*`` overrides; None keeps the image's value."""

    interval: str | None = None
    timeout: str | None = None
    start_period: str | None = None
    start_interval: str | None = None
    retries: int | None = None

    def args(self) -> list[str]:
        out = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None:
                out.append(f"--health-{field.name.replace('_', '-')}={value}")
        return out


def docker(*args: str, check: bool = True, timeout: float = 120, input: str | None = None
           ) -> subprocess.CompletedProcess[str]:
    """Run the docker CLI; raise with its stderr when ``check`` and it fails."""
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, input=input)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:3])}... exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def exec_in(cid: str, *argv: str, check: bool = True, user: str | None = None, timeout: float = 60,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``docker exec`` (``-i`` when input is given)."""
    extra = ["-u", user] if user else []
    if input is not None:
        extra.append("-i")
    return docker("exec", *extra, cid, *argv, check=check, timeout=timeout, input=input)


def inspect(cid: str) -> dict[str, Any]:
    out = docker("inspect", cid).stdout
    data: list[dict[str, Any]] = json.loads(out)
    return data[0]


def health_of(cid: str) -> dict[str, Any]:
    """``.State.Health`` of a container: Status, FailingStreak, Log (last 5 results)."""
    state = inspect(cid)["State"]
    health: dict[str, Any] = state.get("Health") or {}
    if not state.get("Running"):
        health = {**health, "Exited": state.get("ExitCode")}
    return health


def wait_for_health(cid: str, wanted: str | tuple[str, ...], timeout: float,
                    poll: float = 0.25) -> tuple[str, float]:
    """Poll until the health status is one of ``wanted``; return (status, seconds waited).

    Fails with the last health log when the deadline passes or the container stops.
    """
    wanted = (wanted,) if isinstance(wanted, str) else wanted
    t0 = time.monotonic()
    health: dict[str, Any] = {}
    while True:
        health = health_of(cid)
        status = health.get("Status", "none")
        if status in wanted:
            return status, time.monotonic() - t0
        if "Exited" in health:
            logs = docker("logs", "--tail", "20", cid, check=False)
            raise AssertionError(f"container exited ({health['Exited']}) while waiting for {wanted}:\n"
                                 f"{logs.stdout}{logs.stderr}")
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"health still {status!r} after {timeout:.0f}s (wanted {wanted}); "
                                 f"last results: {json.dumps(health.get('Log', [])[-2:], indent=1)}")
        time.sleep(poll)


def last_output(cid: str) -> str:
    log = health_of(cid).get("Log") or []
    return str(log[-1]["Output"]) if log else ""


def record_timing(key: str, value: Any) -> None:
    """Keep a measurement (seconds) in .e2e/timings.json for the tuning sections of docs/image.md and
    docs/kubernetes.md; the lock keeps the other worker's measurement (make e2e runs two)."""
    import fcntl

    TIMINGS_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(TIMINGS_FILE.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            data = json.loads(TIMINGS_FILE.read_text())
        except (OSError, ValueError):
            data = {}
        data[key] = value
        TIMINGS_FILE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


@pytest.fixture(scope="session")
def docker_engine() -> str:
    """The engine's server version; the e2e tests need 25+ (--start-interval)."""
    required = os.environ.get("E2E_REQUIRE_ENGINE") == "1"
    if shutil.which("docker") is None:
        msg = "docker CLI not found: run `make e2e` (installs the engine as root)"
        if required:
            pytest.fail(msg)
        pytest.skip(msg)
    proc = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                          capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        msg = "no Docker engine answers: run `make e2e` (installs and starts one as root)"
        if required:
            pytest.fail(msg)
        pytest.skip(msg)
    version = proc.stdout.strip()
    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0
    if major < 25:
        pytest.fail(f"Docker Engine {version} is too old: 25+ is needed for HEALTHCHECK --start-interval")
    return version


@pytest.fixture(scope="session")
def image(docker_engine: str) -> str:
    """The tag of the GPU dev image under test, built on the local CPU base when missing."""
    tag = os.environ.get("E2E_IMAGE", DEFAULT_IMAGE)
    if docker("image", "inspect", tag, check=False).returncode != 0:
        build_image(tag, ROOT)
    return tag


def build_image(tag: str, context: Path) -> None:
    """``docker build`` of ``context`` as ``tag`` on the local CPU base image (built when missing)."""
    base = subprocess.run(["bash", str(HERE / "base-image.sh")], capture_output=True, text=True, timeout=1800)
    if base.returncode != 0:
        pytest.fail(f"building the CPU base image failed: {base.stderr.strip()[-2000:]}")
    build = subprocess.run(["docker", "build", "--network", "host", "--build-arg",
                            f"BASE_IMAGE={base.stdout.strip()}", "-t", tag, str(context)],
                           capture_output=True, text=True, timeout=1800, check=False)
    if build.returncode != 0:
        pytest.fail(f"docker build of {tag} failed: {build.stdout[-2000:]}{build.stderr[-2000:]}")


def _starter(image: str) -> tuple[Callable[..., str], list[str]]:
    """A function that starts containers of ``image`` (detached), and the ids it started."""
    started: list[str] = []

    def start(*run_args: str, env: dict[str, str] | None = None, health: Health | None = None,
              name: str | None = None, healthcheck: bool = True, command: tuple[str, ...] = ()) -> str:
        argv = ["run", "-d", "--label", f"{LABEL}={SESSION}"]
        if name:
            argv += ["--name", name]
        for key, value in {**DEFAULT_ENV, **(env or {})}.items():
            argv += ["-e", f"{key}={value}"]
        if not healthcheck:
            argv.append("--no-healthcheck")
        elif health is not None:
            argv += health.args()
        if not any(a.startswith("--shm-size") or a == "--ipc=host" for a in run_args):
            argv.append("--shm-size=1g")  # as docs/image.md runs it: Docker's 64 MiB makes the runtime probe warn
        argv += [*run_args, image, *command]
        cid = docker(*argv).stdout.strip()
        started.append(cid)
        return cid

    return start, started


@pytest.fixture
def start_container(image: str) -> Iterator[Callable[..., str]]:
    """Start containers of the image (detached); every one is removed when the test ends."""
    start, started = _starter(image)
    yield start
    if started:
        docker("rm", "-f", "-v", *started, check=False, timeout=120)


@pytest.fixture(scope="module")
def start_shared(image: str) -> Iterator[Callable[..., str]]:
    """start_container for a module's fixtures: containers that the tests which only read them share,
    removed when the module ends."""
    start, started = _starter(image)
    yield start
    if started:
        docker("rm", "-f", "-v", *started, check=False, timeout=120)
