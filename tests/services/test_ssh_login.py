"""ssh-login: a real key login with the system OpenSSH client against a real sshd on loopback."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from probes.result import Result, Status
from probes.services import ssh_login
from probes.state import State
from tests.conftest import ROOT, clean_env, run_cli
from tests.servers import Sshd, wait_gone
from tests.services.conftest import make_ctx, needs_root


def keypair(where: Path, name: str = "probe") -> Path:
    key = where / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "probe", "-f", str(key)], check=True)
    return key


class Login:
    """An sshd that authorizes a probe key for root from <root>/authorized_keys, forced to /bin/true."""

    def __init__(self, root: Path, *options: str, command: str = "/bin/true") -> None:
        self.root = root
        self.key = keypair(root)
        self.secret = self.key.read_text()
        pub = (root / "probe.pub").read_text().strip()
        self.authorized = root / "authorized_keys"
        self.authorized.write_text(f'restrict,from="127.0.0.1,::1",command="{command}" {pub}\n')
        self.sshd = Sshd(root, options=(*options, f"AuthorizedKeysFile {self.authorized}"))
        self.sshd.start()

    def probe(self, timeout: float = 5.0, state: State | None = None, **config: Any) -> Result:
        """One run of the probe (readiness unless ``profile`` says otherwise), with the state dir
        <root>/state unless ``state`` is given."""
        settings: dict[str, Any] = {"ssh_port": self.sshd.port, "ssh_probe_key": str(self.key),
                                    "ssh_probe_user": "root", "ssh_host_keys": f"{self.sshd.host_key}.pub"}
        ctx = make_ctx(timeout, **{**settings, **config})
        ctx = ctx._replace(state=state or State.open(str(self.root / "state")))
        result = ssh_login.judge(ssh_login.gather(ctx), ctx)
        assert time.monotonic() <= ctx.deadline + 0.5, "the probe overran its deadline"
        assert "\n" not in result.message
        assert self.secret_part() not in repr(result) and self.secret_part() not in json.dumps(result.to_dict())
        return result

    def secret_part(self) -> str:
        return self.secret.splitlines()[2]  # a line of the private key's base64 body


@pytest.fixture
def login(tmp_path: Path) -> Iterator[Login]:
    needs_root()
    why = Sshd.missing() or (None if shutil.which("ssh") else "needs the ssh client")
    if why:
        pytest.skip(why)
    made: list[Login] = []

    def make(*options: str, **kw: Any) -> Login:
        root = tmp_path / f"sshd{len(made)}"
        root.mkdir()
        made.append(Login(root, *options, **kw))
        return made[-1]

    yield make  # type: ignore[misc]
    for one in made:
        one.sshd.stop()


def test_good_login_passes_in_seconds(login: Any) -> None:
    r = login().probe()
    assert (r.status, r.unit) == (Status.PASS, "s"), r.message
    assert 0 < r.observed < 5 and "logged in as root" in r.message


def test_a_failing_forced_command_is_a_login_failure(login: Any) -> None:
    r = login(command="/bin/false").probe()
    assert (r.status, r.reason) == (Status.FAIL, "ssh-login-failed"), r.message
    assert "exit 1" in r.message


def test_sshd_that_refuses_the_key(login: Any) -> None:
    srv = login()
    srv.sshd.stop()
    srv.sshd = Sshd(srv.root, options=("AuthorizedKeysFile none",)).start()
    r = srv.probe()
    assert (r.status, r.reason) == (Status.FAIL, "ssh-auth-failed"), r.message
    assert "Permission denied" in r.message


def test_host_key_mismatch(login: Any, tmp_path: Path) -> None:
    srv = login()
    other = keypair(tmp_path, "not-the-containers")
    r = srv.probe(ssh_host_keys=f"{other}.pub")
    assert (r.status, r.reason) == (Status.FAIL, "ssh-hostkey"), r.message
    assert "not the container's own" in r.message


def test_another_sshd_on_the_port_with_a_different_key(login: Any) -> None:
    srv, impostor = login(), login()
    r = srv.probe(ssh_port=impostor.sshd.port)
    assert r.reason == "ssh-hostkey", r.message


def test_stall_in_key_exchange_ends_at_the_deadline_with_nothing_left(login: Any, scripted: Any) -> None:
    srv = login()

    def stall(conn: socket.socket) -> None:
        conn.sendall(b"SSH-2.0-OpenSSH_9.2p1 Stall\r\n")
        time.sleep(5)

    server = scripted(stall)
    t0 = time.monotonic()
    r = srv.probe(timeout=1.5, ssh_port=server.port)
    assert time.monotonic() - t0 < 2.0
    assert (r.status, r.reason) == (Status.FAIL, "deadline"), r.message
    assert wait_gone(str(srv.key)) == []


def test_group_readable_key_is_refused_before_the_client_runs(login: Any) -> None:
    srv = login()
    os.chmod(srv.key, 0o640)
    r = srv.probe()
    assert r.reason == "ssh-probe-key" and "mode 0640" in r.message


def test_no_host_keys(login: Any, tmp_path: Path) -> None:
    r = login().probe(ssh_host_keys=str(tmp_path / "nothing.pub"))
    assert r.reason == "no-host-keys"


def test_no_known_hosts_is_left_anywhere(login: Any, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    srv = login()
    home_ssh = Path.home() / ".ssh" / "known_hosts"
    before = home_ssh.read_bytes() if home_ssh.exists() else None
    assert srv.probe(state=State.open(str(state))).status is Status.PASS
    assert not list(state.rglob("ssh-login-*"))
    assert (home_ssh.read_bytes() if home_ssh.exists() else None) == before


def test_cli_runs_it_when_the_key_is_set_and_never_shows_the_key(login: Any, tmp_path: Path) -> None:
    srv = login()
    log = tmp_path / "log"
    env = clean_env(HEALTHCHECK_SSH_PORT=str(srv.sshd.port), HEALTHCHECK_SSH_PROBE_KEY=str(srv.key),
                    HEALTHCHECK_SSH_PROBE_USER="root", HEALTHCHECK_SSH_HOST_KEYS=f"{srv.sshd.host_key}.pub",
                    HEALTHCHECK_STATE_DIR=str(tmp_path / "state"), HEALTHCHECK_LOG_FILE=str(log))
    out = run_cli("--only", "ssh,ssh-login", "--json", "-v", env=env, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    check = json.loads(out.stdout)["checks"]["ssh-login:login"][0]
    assert check["status"] == "pass" and check["observedUnit"] == "s"
    srv.authorized.write_text("")
    env["HEALTHCHECK_PROFILE"] = "startup"  # readiness would answer from the pass before
    out = run_cli("--only", "ssh,ssh-login", "--json", "-v", env=env, timeout=60)
    assert out.returncode == 1, out.stdout
    assert json.loads(out.stdout)["checks"]["ssh-login:login"][0]["reason"] == "ssh-auth-failed"
    text = run_cli("--only", "ssh,ssh-login", "-v", env=env, timeout=60).stdout
    assert text.startswith("unhealthy: ssh-login: sshd at") and "refused the probe key" in text
    for seen in (out.stdout, out.stderr, text, log.read_text()):
        assert srv.secret_part() not in seen


def test_off_unless_the_key_is_set(tmp_path: Path) -> None:
    env = clean_env(HEALTHCHECK_STATE_DIR=str(tmp_path))
    out = run_cli("--skip", "ssh", "--json", env=env, timeout=60)
    assert "ssh-login" not in out.stdout


def test_host_keys_setting_must_be_absolute_paths(tmp_path: Path) -> None:
    env = clean_env(HEALTHCHECK_SSH_HOST_KEYS="relative.pub", HEALTHCHECK_STATE_DIR=str(tmp_path))
    out = run_cli("--only", "ssh", env=env, timeout=60)
    assert out.returncode == 3 and "HEALTHCHECK_SSH_HOST_KEYS" in out.stdout + out.stderr


def test_a_full_disk_is_not_checked_rather_than_unhealthy(login: Any, tmp_path: Path) -> None:
    # Principle 14: a full /tmp and state directory give an honest "not checked", never an error.
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed: cannot mount a private tmpfs")
    srv = login()
    full = tmp_path / "full"
    full.mkdir()
    env = clean_env(HEALTHCHECK_SSH_PORT=str(srv.sshd.port), HEALTHCHECK_SSH_PROBE_KEY=str(srv.key),
                    HEALTHCHECK_SSH_PROBE_USER="root", HEALTHCHECK_SSH_HOST_KEYS=f"{srv.sshd.host_key}.pub",
                    HEALTHCHECK_STATE_DIR=f"{full}/state", TMPDIR=str(full))
    script = ('mount -t tmpfs -o size=64k hc-test-full "$1" && mkdir -m 700 "$1/state" && '
              '{ head -c 1048576 /dev/zero >"$1/fill" 2>/dev/null; '
              'exec "$0" -m probes --only ssh,ssh-login --json; }')
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                           sys.executable, str(full)], env=env, capture_output=True, text=True, timeout=60,
                          cwd=str(ROOT), check=False)
    if "mount" in done.stderr and done.returncode not in (0, 1):
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace: {done.stderr.strip()[:200]}")
    assert done.returncode == 0, done.stdout + done.stderr
    check = json.loads(done.stdout)["checks"]["ssh-login:login"][0]
    assert (check["status"], check["reason"]) == ("warn", "could-not"), check


def logins(srv: Login) -> int:
    """How many times sshd ran the forced command (see counting)."""
    done = srv.root / "logins"
    return len(done.read_text().split()) if done.exists() else 0


def counting(login: Any) -> Login:
    """A login whose forced command records each run in <root>/logins."""
    srv = login(command="/bin/true")
    srv.authorized.write_text(srv.authorized.read_text().replace(
        'command="/bin/true"', f'command="echo . >> {srv.root}/logins"'))
    return srv


def test_readiness_reuses_a_passing_login_and_startup_logs_in_again(login: Any) -> None:
    """Readiness answers from a pass younger than the TTL, saying its age; startup logs in; an
    expired or damaged entry, one for other host keys and a failed login are never reused."""
    srv = counting(login)
    first = srv.probe()
    assert first.status is Status.PASS and "cached" not in first.message and logins(srv) == 1, first.message
    again = srv.probe()
    assert again.status is Status.PASS and logins(srv) == 1, "readiness logged in again within the TTL"
    assert again.message.endswith("s old)") and "(cached, " in again.message, again.message
    assert again.observed == first.observed
    assert srv.probe(profile="startup").status is Status.PASS and logins(srv) == 2
    assert srv.probe().status is Status.PASS and logins(srv) == 2
    cache = srv.root / "state" / ssh_login.CACHE
    entry = json.loads(cache.read_text())
    entry["finished"] -= 601  # older than the default TTL (600 s)
    cache.write_text(json.dumps(entry))
    assert srv.probe().status is Status.PASS and logins(srv) == 3
    assert srv.probe(ssh_login_ttl=0.0).status is Status.PASS and logins(srv) == 4
    more = f"{srv.sshd.host_key}.pub,{keypair(srv.root, 'another-host-key')}.pub"
    assert srv.probe(ssh_host_keys=more).status is Status.PASS and logins(srv) == 5
    entry = json.loads(cache.read_text())
    for damaged in ({**entry, "data": {"elapsed": "0.1"}}, {**entry, "data": []}, "{not json"):
        cache.write_text(damaged if isinstance(damaged, str) else json.dumps(damaged))
        before = logins(srv)
        assert srv.probe().status is Status.PASS and logins(srv) == before + 1, damaged
    # A failing login is never answered from the pass before it, nor reused itself.
    authorized = srv.authorized.read_text()
    srv.authorized.write_text("")
    assert srv.probe(profile="startup").reason == "ssh-auth-failed"
    assert srv.probe().reason == "ssh-auth-failed"
    srv.authorized.write_text(authorized)
    before = logins(srv)
    assert srv.probe().status is Status.PASS and logins(srv) == before + 1


def test_without_a_state_dir_the_login_is_not_checked_and_nothing_goes_to_tmp(login: Any) -> None:
    srv = login()
    tmp = set(Path("/tmp").glob("ssh-login-*"))
    r = srv.probe(state=State.off("no writable state dir (a test)"))
    assert (r.status, r.reason) == (Status.WARN, "could-not"), r.message
    assert "a test" in r.message
    assert set(Path("/tmp").glob("ssh-login-*")) == tmp


def test_a_killed_runs_scratch_goes_with_the_next_run(login: Any, tmp_path: Path) -> None:
    """The suite SIGKILLed while its client is logged in: its known hosts directory (and the client)
    are gone after the next run, wherever the scratch directory was."""
    srv = login()
    hold = srv.root / "hold"
    hold.touch()
    srv.authorized.write_text(srv.authorized.read_text().replace(
        'command="/bin/true"', f'command="[ ! -e {hold} ] || sleep 4"'))
    state = tmp_path / "state"
    env = clean_env(HEALTHCHECK_SSH_PORT=str(srv.sshd.port), HEALTHCHECK_SSH_PROBE_KEY=str(srv.key),
                    HEALTHCHECK_SSH_PROBE_USER="root", HEALTHCHECK_SSH_HOST_KEYS=f"{srv.sshd.host_key}.pub",
                    HEALTHCHECK_STATE_DIR=str(state))
    argv = [sys.executable, "-m", "probes", "--only", "ssh,ssh-login", "--profile", "startup"]
    suite = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 10
        while not list(state.rglob("ssh-login-*")) and time.monotonic() < end:
            time.sleep(0.01)
        assert list(state.rglob("ssh-login-*")), "the run made no scratch directory"
        time.sleep(0.3)  # the client is logged in
    finally:
        suite.kill()
        suite.wait()
    hold.unlink()
    out = run_cli("--only", "ssh,ssh-login", "--profile", "startup", env=env, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert not list(state.rglob("ssh-login-*")), list(state.rglob("*"))
    assert wait_gone(str(srv.key)) == []


def test_a_read_only_tmp_changes_nothing(login: Any, tmp_path: Path) -> None:
    """/tmp read-only (readOnlyRootFilesystem) and a writable state dir: the login runs."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed: cannot mount in a private mount namespace")
    srv = login()
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    env = clean_env(HEALTHCHECK_SSH_PORT=str(srv.sshd.port), HEALTHCHECK_SSH_PROBE_KEY=str(srv.key),
                    HEALTHCHECK_SSH_PROBE_USER="root", HEALTHCHECK_SSH_HOST_KEYS=f"{srv.sshd.host_key}.pub",
                    HEALTHCHECK_STATE_DIR=str(state))
    env.pop("TMPDIR", None)
    script = ('mount --bind /tmp /tmp && mount -o remount,bind,ro /tmp && '
              'mount -t tmpfs -o mode=0700 hc-test-state "$1" && ! touch /tmp/hc-test-rw 2>/dev/null && '
              'exec "$0" -m probes --only ssh,ssh-login --json')
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                           sys.executable, str(state)], env=env, capture_output=True, text=True, timeout=60,
                          cwd=str(ROOT), check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    check = json.loads(done.stdout)["checks"]["ssh-login:login"][0]
    assert check["status"] == "pass", check
