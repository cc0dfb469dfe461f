"""Real servers and process checks shared by the tests and the benchmark.

A real OpenSSH server on a free loopback port, port helpers, and the search for
processes a test left behind. Not a conftest: bench/run.py imports it too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import psutil

SSHD = "/usr/sbin/sshd"


def free_port(host: str = "127.0.0.1") -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_port(host: str, port: int, timeout: float, proc: subprocess.Popen[Any] | None = None) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {host}:{port} after {timeout}s")


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def leftovers(marker: str) -> list[psutil.Process]:
    """Live (non-zombie) processes anywhere whose command line carries ``marker``; ``info``
    holds their command line, state and parent as found."""
    found = []
    for p in psutil.process_iter(["cmdline", "status", "ppid"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            continue
    return found


def described(procs: list[psutil.Process]) -> list[str]:
    """Leftovers as they were found: a later look (a Process's repr) would show what killing
    them made of them, a zombie."""
    return [f"pid {p.pid} (parent {p.info.get('ppid')}, {p.info.get('status')}): "
            f"{' '.join(p.info.get('cmdline') or [])[:200]}" for p in procs]


def wait_gone(marker: str, within: float = 1.0) -> list[psutil.Process]:
    """SIGKILL is delivered asynchronously: give the kernel a moment before calling it a leak."""
    end = time.monotonic() + within
    while (left := leftovers(marker)) and time.monotonic() < end:
        time.sleep(0.05)
    return left


class Sshd:
    """A real OpenSSH server on a free port of 127.0.0.1 (and ::1), with its own host key."""

    @staticmethod
    def missing() -> str | None:
        """Why no sshd can be started here, or None."""
        if not os.path.exists(SSHD) or not shutil.which("ssh-keygen"):
            return "needs openssh-server (apt-get install -y openssh-server)"
        return None

    def __init__(self, root: Path, *, ipv6: bool = True, options: tuple[str, ...] = (),
                 key_name: str = "host_ed25519") -> None:
        self.root = root
        self.port = free_port()
        key = root / key_name
        self.host_key = key
        if not key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        os.makedirs("/run/sshd", exist_ok=True)  # privilege separation directory sshd insists on
        # MaxStartups: concurrent probes (the stress suite, the benchmark) must not be dropped.
        lines = [f"Port {self.port}", "ListenAddress 127.0.0.1", *(["ListenAddress ::1"] if ipv6 else []),
                 f"HostKey {key}", f"PidFile {root / 'sshd.pid'}", "UsePAM no", "StrictModes no",
                 "PasswordAuthentication no", "KbdInteractiveAuthentication no",
                 "MaxStartups 200:30:400", "LogLevel ERROR", *options]
        self.cfg = root / "sshd_config"
        self.cfg.write_text("\n".join(lines) + "\n")
        # OpenSSH 9.8+ penalises clients that disconnect before authenticating, as probes do.
        probe = root / "sshd_config_probe"
        probe.write_text("\n".join([*lines, "PerSourcePenaltyExemptList 127.0.0.1/8,::1"]) + "\n")
        if subprocess.run([SSHD, "-T", "-f", str(probe)], capture_output=True, check=False).returncode == 0:
            self.cfg.write_text(probe.read_text())
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Sshd:
        with open(self.root / "sshd.log", "ab") as log:
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.cfg)], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        wait_port("127.0.0.1", self.port, 15, self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


def _others_may_reach(path: str) -> bool:
    """Whether a user who is neither owner nor group may reach ``path`` (every directory above it o+x)."""
    parts = Path(os.path.realpath(path)).parents
    return all(os.stat(p).st_mode & 0o001 for p in parts)


def python_for_others() -> tuple[str, dict[str, str]]:
    """An interpreter another uid may run with this one's packages, and the environment it needs:
    this one where others may reach its standard library, else the system's python3.X of the same
    version on this one's site-packages (a pyenv interpreter under root's 0700 home)."""
    if _others_may_reach(sysconfig.get_paths()["stdlib"]) and _others_may_reach(sys.executable):
        return sys.executable, {}
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    packages = sysconfig.get_paths()["purelib"]
    if not os.path.exists(system) or not _others_may_reach(packages):
        raise RuntimeError(f"no interpreter another uid may run: {sys.executable} is not reachable, "
                           f"nor is there {system}")
    return system, {"PYTHONPATH": packages}


class Jupyter:
    """A real Jupyter Server on a free port of 127.0.0.1 with its own runtime dir, started at once;
    with ``uid``, run as that uid (group the same number, no passwd entry needed), which then owns
    ``root`` and the dirs in it (``root`` must be reachable by that uid: not under pytest's 0700 tmp)."""

    def __init__(self, root: Path, *, token: str, base_url: str = "/", certfile: str | None = None,
                 keyfile: str | None = None, uid: int | None = None) -> None:
        self.root = root
        self.port = free_port()
        self.base_url = base_url
        self.runtime = root / "runtime"
        self.uid = uid
        python, more = sys.executable, {}
        if uid is not None:
            for path in (root, self.runtime, root / "config", root / "data"):
                path.mkdir(mode=0o700, exist_ok=True)
                os.chown(path, uid, uid)
            python, more = python_for_others()
        self.env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(self.runtime),
                    "JUPYTER_CONFIG_DIR": str(root / "config"), "JUPYTER_DATA_DIR": str(root / "data"),
                    "JUPYTER_PLATFORM_DIRS": "1", "JUPYTER_NO_CONFIG": "1", "HOME": str(root), **more}
        argv = [python, "-m", "jupyter_server", f"--ServerApp.port={self.port}",
                "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
                "--ServerApp.open_browser=False", f"--ServerApp.base_url={base_url}",
                f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0"]
        if os.geteuid() == 0 and uid is None:
            argv.append("--allow-root")
        if certfile:
            argv += [f"--ServerApp.certfile={certfile}", f"--ServerApp.keyfile={keyfile}"]
        self.log = open(root / "jupyter.log", "ab")  # noqa: SIM115
        as_uid: dict[str, Any] = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
        self.proc = subprocess.Popen(argv, env=self.env, cwd=root, stdout=self.log, stderr=self.log, **as_uid)
        wait_port("127.0.0.1", self.port, 60, self.proc)
        end = time.monotonic() + 30
        while not list(self.runtime.glob("jpserver-*.json")):
            if time.monotonic() > end:
                raise RuntimeError("Jupyter Server wrote no runtime file")
            time.sleep(0.05)

    def stop(self) -> None:
        stop(self.proc)
        self.log.close()
