"""ssh-keys: what sshd's StrictModes and account checks would refuse, named with the exact fix.

The key files are real files and directories owned by a real (made-up) uid through chown; only
the account database and sshd's configuration are files of our own (the same formats as
/etc/passwd, /etc/shadow and /etc/ssh/sshd_config), the boundary a test cannot own.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from probes.result import Result, Status
from probes.services import ssh_keys
from tests.conftest import clean_env, run_cli
from tests.services.conftest import make_ctx, needs_root

UID = 54321  # the SSH user: not root, not the suite's uid
OTHER = 4242  # somebody else


@pytest.fixture(scope="module")
def pubkey(tmp_path_factory: pytest.TempPathFactory) -> str:
    key = tmp_path_factory.mktemp("key") / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dev@test", "-f", str(key)], check=True)
    return (key.parent / "id.pub").read_text()


class Box:
    """A home directory for ``dev`` (uid UID), its account files and an sshd_config."""

    def __init__(self, root: Path, key: str) -> None:
        self.root = root
        self.home = root / "home" / "dev"
        self.ssh = self.home / ".ssh"
        self.keys = self.ssh / "authorized_keys"
        self.ssh.mkdir(parents=True)
        self.keys.write_text(key)
        for p, mode in ((self.home, 0o755), (self.ssh, 0o700), (self.keys, 0o600)):
            os.chown(p, UID, UID)
            os.chmod(p, mode)
        self.account(shell="/bin/bash", password="!", expire="")
        self.config("UsePAM yes")

    def account(self, *, shell: str, password: str, expire: str) -> None:
        (self.root / "passwd").write_text(f"root:x:0:0::/root:/bin/bash\ndev:x:{UID}:{UID}::{self.home}:{shell}\n")
        (self.root / "shadow").write_text(f"root:*:19000:0:99999:7:::\ndev:{password}:19000:0:99999:7::{expire}:\n")

    def config(self, *lines: str) -> None:
        (self.root / "sshd_config").write_text("\n".join(lines) + "\n")

    def system(self) -> ssh_keys.System:
        return ssh_keys.System(str(self.root / "passwd"), str(self.root / "shadow"),
                               str(self.root / "sshd_config"), nss=False)

    def check(self, user: str = "dev") -> Result:
        t0 = time.monotonic()
        result = ssh_keys.judge(ssh_keys.gather(make_ctx(ssh_user=user), {}, self.system()), make_ctx())
        assert time.monotonic() - t0 < 1.0
        assert "\n" not in result.message
        return result


@pytest.fixture
def box(tmp_path: Path, pubkey: str) -> Box:
    needs_root()
    return Box(tmp_path, pubkey)


def test_good_key_files_pass(box: Box) -> None:
    r = box.check()
    assert (r.status, r.observed, r.unit) == (Status.PASS, 1, "keys"), r.message


@pytest.mark.parametrize("which", ["home", "ssh", "keys"])
def test_group_writable_path_fails_naming_it_and_the_fix(box: Box, which: str) -> None:
    path = getattr(box, which)
    os.chmod(path, os.stat(path).st_mode | 0o020)
    r = box.check()
    assert (r.status, r.reason) == (Status.FAIL, "ssh-strict-modes"), r.message
    mode = f"{os.stat(path).st_mode & 0o7777:04o}"
    assert f"{path} (owner uid {UID}, mode {mode})" in r.message
    assert f"run `chmod g-w {path}`" in r.message
    assert r.facts["path"] == str(path) and r.facts["mode"] == mode


def test_world_writable_home_after_chmod_0777(box: Box) -> None:
    os.chmod(box.home, 0o777)
    r = box.check()
    assert r.reason == "ssh-strict-modes" and f"chmod go-w {box.home}" in r.message, r.message


def test_home_owned_by_another_user_says_chown(box: Box) -> None:
    os.chown(box.home, OTHER, OTHER)
    r = box.check()
    assert r.reason == "ssh-strict-modes"
    assert f"owner uid {OTHER}" in r.message and f"chown dev {box.home}" in r.message


def test_directories_above_home_are_not_sshds_business(box: Box) -> None:
    os.chmod(box.home.parent, 0o777)
    assert box.check().status is Status.PASS


def test_key_file_outside_home_is_checked_up_to_the_root(box: Box, pubkey: str) -> None:
    keys = box.root / "keys" / "dev"
    keys.parent.mkdir()
    keys.write_text(pubkey)
    box.config("UsePAM yes", f"AuthorizedKeysFile {box.root}/keys/%u")
    os.chmod(keys.parent, 0o775)
    r = box.check()
    assert r.reason == "ssh-strict-modes" and f"chmod g-w {keys.parent}" in r.message, r.message
    os.chmod(keys.parent, 0o755)
    # sshd walks on to /: the test's own /tmp (sticky, 1777) is what it would refuse next.
    r = box.check()
    assert r.reason == "ssh-strict-modes" and "(owner uid 0, mode 1777): run `chmod go-w /tmp`" in r.message


def test_symlinked_key_file_owned_by_another_user(box: Box, pubkey: str) -> None:
    elsewhere = box.root / "theirs"
    elsewhere.write_text(pubkey)
    box.keys.unlink()
    box.keys.symlink_to(elsewhere)
    os.chown(box.keys, OTHER, OTHER, follow_symlinks=False)
    r = box.check()
    assert (r.status, r.reason) == (Status.FAIL, "ssh-strict-modes"), r.message
    assert f"{box.keys} (a symbolic link owned by uid {OTHER})" in r.message


def test_users_own_link_to_a_file_of_another_user_is_judged_at_the_target(box: Box, pubkey: str) -> None:
    target = box.ssh / "real_keys"
    target.write_text(pubkey)
    os.chown(target, OTHER, OTHER)
    box.keys.unlink()
    box.keys.symlink_to(target)
    os.chown(box.keys, UID, UID, follow_symlinks=False)
    r = box.check()
    assert r.reason == "ssh-strict-modes" and f"chown dev {target}" in r.message, r.message


def test_fifo_in_place_of_the_key_file_never_blocks(box: Box) -> None:
    box.keys.unlink()
    os.mkfifo(box.keys)
    r = box.check()
    assert r.reason == "ssh-strict-modes" and "not a regular file" in r.message, r.message


def test_empty_key_file_warns(box: Box) -> None:
    box.keys.write_text("")
    r = box.check()
    assert (r.status, r.reason) == (Status.WARN, "ssh-no-keys")
    assert f"{box.keys} is empty" in r.message


def test_unparseable_key_file_warns(box: Box, pubkey: str) -> None:
    kind, blob, _ = pubkey.split(" ", 2)
    box.keys.write_text(f"# a comment\n{kind} AAAA-not-base64\nssh-rsa {blob}\nhello world\n")
    r = box.check()
    assert (r.status, r.reason) == (Status.WARN, "ssh-no-keys")
    assert "holds no public key that parses" in r.message


def test_keys_with_options_are_counted(box: Box, pubkey: str) -> None:
    box.keys.write_text(f'restrict,from="127.0.0.1,::1",command="/bin/echo a b" {pubkey}\n{pubkey}')
    assert box.check().observed == 2


def test_no_key_file_warns(box: Box) -> None:
    box.keys.unlink()
    r = box.check()
    assert r.reason == "ssh-no-keys" and "no authorized keys file" in r.message


def test_locked_account_without_pam_fails(box: Box) -> None:
    box.config("UsePAM no")
    r = box.check()
    assert (r.status, r.reason) == (Status.FAIL, "ssh-account"), r.message
    assert "locked" in r.message


def test_locked_password_with_pam_is_still_a_key_login(box: Box) -> None:
    # useradd leaves '!' in shadow; Debian's sshd (UsePAM yes) lets such a user in with a key.
    assert box.check().status is Status.PASS


def test_included_configuration_is_read(box: Box) -> None:
    (box.root / "conf.d").mkdir()
    (box.root / "conf.d" / "10-no-pam.conf").write_text("UsePAM no\n")
    box.config(f"Include {box.root}/conf.d/*.conf", "UsePAM yes")
    assert box.check().reason == "ssh-account"


def test_expired_account_fails(box: Box) -> None:
    box.account(shell="/bin/bash", password="!", expire="1")
    r = box.check()
    assert r.reason == "ssh-account" and "expired" in r.message


@pytest.mark.parametrize("shell", ["/bin/no-such-shell", "/usr/sbin/nologin"])
def test_missing_or_nologin_shell_fails(box: Box, shell: str) -> None:
    if shell.endswith("nologin") and not os.path.exists(shell):
        pytest.skip("no nologin here")
    box.account(shell=shell, password="!", expire="")
    r = box.check()
    assert r.reason == "ssh-account" and shell in r.message, r.message


def test_unknown_user_fails(box: Box) -> None:
    r = box.check("nobody-here")
    assert (r.status, r.reason) == (Status.FAIL, "ssh-account")


def test_no_user_skips_and_dev_user_is_the_default() -> None:
    ctx = make_ctx()
    r = ssh_keys.judge(ssh_keys.gather(ctx, environ={}), ctx)
    assert (r.status, r.reason) == (Status.SKIP, "no-user")
    data = ssh_keys.gather(ctx, environ={"DEV_USER": "no-such-user-here"})
    assert data["user"] == "no-such-user-here"
    data = ssh_keys.gather(make_ctx(ssh_user="root"), environ={"DEV_USER": "x"})
    assert data["user"] == "root"


def test_cli_runs_it_in_readiness_not_in_liveness(tmp_path: Any) -> None:
    env = clean_env(HEALTHCHECK_SSH_USER="no-such-user-here", HEALTHCHECK_STATE_DIR=str(tmp_path))
    out = run_cli("--only", "ssh-keys", "--json", env=env, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    check = json.loads(out.stdout)["checks"]["ssh-keys:strict-modes"][0]
    assert check["status"] == "fail" and "no-such-user-here does not exist" in check["output"]
    out = run_cli("--profile", "liveness", "--json", "--skip", "jupyter,ssh", env=env, timeout=60)
    assert "ssh-keys" not in out.stdout


def test_home_reached_through_a_symbolic_link_is_judged_at_its_real_path(box: Box) -> None:
    # /home -> /data/home: sshd resolves the key file's path and stops at the resolved home.
    (box.root / "link").symlink_to(box.root / "home")
    box.home = box.root / "link" / "dev"
    box.account(shell="/bin/bash", password="!", expire="")
    r = box.check()
    assert r.status is Status.PASS, r.message
