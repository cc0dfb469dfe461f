"""ssh-login: a real SSH key login over loopback runs its forced command (opt-in): a banner shows that
sshd answers, only a login that a user gets in (docs/probes.md; the probe principal: docs/image.md).
Command line: ``ssh -F /dev/null -o BatchMode=yes -o UserKnownHostsFile=FILE -o
StrictHostKeyChecking=yes -i KEY -l USER 127.0.0.1 true``."""

from __future__ import annotations

import glob
import os
import stat
import time

from probes import deadlines, proc
from probes.context import Context
from probes.framework import deep
from probes.result import Result, Status, passed, verdict
from probes.services.common import SSHD_STUCK
from probes.services.ssh import SshSettings
from probes.spec import ABSOLUTE_PATH, NUMBER, TEXT, Spec, cause, setting
from probes.state import drop_scratch, life_identity
from probes.untrusted import Refused, clean, read_regular, squeeze

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def parse_host_keys(text: str) -> str:
    paths = [p.strip() for p in text.split(",")]
    if not all(p.startswith("/") for p in paths):
        raise ValueError("is not a list of absolute paths (accepted: /etc/ssh/ssh_host_ed25519_key.pub,...)")
    return ",".join(paths)


class SshLoginSettings(SshSettings):  # ssh's port, and ssh-login's own settings
    ssh_probe_key: str | None = setting(
        "HEALTHCHECK_SSH_PROBE_KEY", ABSOLUTE_PATH, None,
        "the probe principal's private key (root-only); setting it turns the `ssh-login` probe on",
        shown_default="unset (the image sets `/run/healthcheck-ssh/id_ed25519`)")
    ssh_probe_user: str = setting("HEALTHCHECK_SSH_PROBE_USER", TEXT, "healthcheck",
                                  "the user the probe logs in as")
    ssh_host_keys: str | None = setting(
        "HEALTHCHECK_SSH_HOST_KEYS", TEXT, None,
        "comma-separated public host key files the server's key must be one of",
        shown_default="`/etc/ssh/ssh_host_*_key.pub`", parse=parse_host_keys)
    ssh_login_ttl: float = setting("HEALTHCHECK_SSH_LOGIN_TTL", NUMBER, 600.0,
                                   "seconds a passing ssh-login result is reused by readiness",
                                   low=0, high=86400, low_inclusive=True)


LOGIN_AUTH_FAILED = cause(
    "ssh-auth-failed", "sshd refused the probe key (publickey): the key is not authorized, or StrictModes, "
    "the account or AuthorizedKeysFile turned it away", "see sshd's log; the `ssh-keys` probe names a "
    "StrictModes problem; restore the probe's authorized key (restart the container)",
    action="restart-container", actor="tenant")
LOGIN_FAILED = cause("ssh-login-failed", "authenticated, but the session did not run or its command failed "
                                         "(account, shell, PAM, MaxSessions)",
                     "see sshd's log and the probe user's account and shell", action="fix-config",
                     actor="tenant")
LOGIN_HOSTKEY = cause(
    "ssh-hostkey", "the server's host key is none of the container's own public host keys",
    "another server answers on the SSH port, or the host keys changed under sshd: restart sshd",
    action="restart-app", actor="tenant")
LOGIN_PROBE_KEY = cause("ssh-probe-key", "the probe key is missing, a link, not owned by the suite's user, "
                                         "or readable by others (the client refuses it)",
                        "fix `HEALTHCHECK_SSH_PROBE_KEY` (the suite's own file, `chmod 600`)",
                        action="fix-config", actor="tenant")
LOGIN_NO_HOST_KEYS = cause("no-host-keys", "no public host key could be read to check the server against",
                           "set `HEALTHCHECK_SSH_HOST_KEYS`, or generate host keys (`ssh-keygen -A`)",
                           action="fix-config", actor="tenant")
LOGIN_NO_CLIENT = cause("no-client", "the `ssh` client is not installed", "install openssh-client",
                        action="fix-config", actor="tenant")
LOGIN_COULD_NOT = cause("could-not", "the run's known hosts file could not be written "
                                     "(no state dir, or a full one: it is never written to /tmp)",
                        "give the suite a writable `HEALTHCHECK_STATE_DIR`", "warn",
                        action="fix-config", actor="tenant")

SPEC = Spec(
    "ssh-login", layer="services", module=__name__, toggle="ENABLE_SSH_LOGIN_CHECK",
    timeout=5.0, profiles=("startup", "readiness"), requires=("ssh",), measurement="login", default_on=False,
    on_with="ssh_probe_key", follows="ENABLE_SSH_CHECK",
    about="a real SSH key login of a restricted loopback-only probe principal "
          "runs its forced command (opt-in)", settings=SshLoginSettings.SETTINGS,
    causes=(LOGIN_AUTH_FAILED, LOGIN_FAILED, LOGIN_HOSTKEY, LOGIN_PROBE_KEY, LOGIN_NO_HOST_KEYS,
            LOGIN_NO_CLIENT, SSHD_STUCK, LOGIN_COULD_NOT),
)
NAME = SPEC.name

HOST_ALIAS = "healthcheck-probe"  # the name the known hosts file and the client agree on
# ssh_host_*_key.pub in the first of these that has any, unless HEALTHCHECK_SSH_HOST_KEYS says
# otherwise: /etc/ssh, or on a read-only root where the image's entrypoint makes them (docs/image.md).
HOST_KEY_DIRS, HOST_KEYS = ("/etc/ssh", "/run/ssh-host-keys/etc/ssh"), "ssh_host_*_key.pub"
CACHE = "ssh-login.json"  # the last passing login, reused by readiness while younger than its TTL
HOSTKEY_WORDS = (b"host key verification failed", b"identification has changed", b"no matching host key")
# The client with nothing of the caller's SSH set-up: only the probe key, no agent, publickey only.
OPTIONS = {"BatchMode": "yes", "IdentitiesOnly": "yes", "IdentityAgent": "none",
           "PreferredAuthentications": "publickey", "PasswordAuthentication": "no",
           "KbdInteractiveAuthentication": "no", "GlobalKnownHostsFile": "/dev/null",
           "StrictHostKeyChecking": "yes", "HostKeyAlias": HOST_ALIAS, "UpdateHostKeys": "no",
           "CheckHostIP": "no", "ControlMaster": "no", "ControlPath": "none", "ForwardAgent": "no",
           "ForwardX11": "no", "ClearAllForwardings": "yes", "RequestTTY": "no", "LogLevel": "VERBOSE"}


def key_problem(path: str) -> str | None:
    """Why the client would not (or should not) use the private key at ``path``; never reads it."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be read ({os.strerror(exc.errno or 0)})"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not {os.geteuid()}"
    return f"is readable by others (mode {stat.S_IMODE(st.st_mode):04o})" if st.st_mode & 0o077 else None


def known_hosts(host_keys: str | None) -> list[str]:
    """``HOST_ALIAS keytype base64`` for each public host key that can be read."""
    if host_keys:
        paths = host_keys.split(",")
    else:
        found = (sorted(glob.glob(f"{where}/{HOST_KEYS}")) for where in HOST_KEY_DIRS)
        paths = next((p for p in found if p), [])
    lines = []
    for path in paths:
        try:
            raw, _ = read_regular(path, 16 << 10, owners=(0, os.geteuid()))
        except Refused:
            continue
        words = raw.decode("ascii", "replace").split()
        if len(words) >= 2:
            lines.append(f"{HOST_ALIAS} {words[0]} {words[1]}")
    return lines


def gather(ctx: Context) -> dict[str, Any]:
    s = ctx.config.of(SshLoginSettings)
    if (key := s.ssh_probe_key) is None:
        return {"outcome": "no-key"}
    if (problem := key_problem(key)) is not None:
        return {"outcome": "probe-key", "key": key, "problem": problem}
    if not (lines := known_hosts(s.ssh_host_keys)):
        return {"outcome": "no-host-keys", "where": s.ssh_host_keys or f"{HOST_KEY_DIRS[0]}/{HOST_KEYS}"}
    if not ctx.state.enabled:  # the known hosts file goes nowhere else (never /tmp)
        return {"outcome": "could-not", "why": ctx.state.disabled_reason}
    # What decides the answer, and this container's life: a restarted container logs in again.
    cache_key = {"host": ctx.config.host, "port": s.ssh_port, "user": s.ssh_probe_user, "key": key,
                 "host_keys": lines, "identity": life_identity()}
    base = {"outcome": "ran", "user": s.ssh_probe_user, "where": f"{ctx.config.host}:{s.ssh_port}"}
    fresh = deep.fresh_pass(ctx.state.read_json(CACHE), cache_key, s.ssh_login_ttl) \
        if ctx.config.profile_rules.reuses_cache else None
    if fresh and deep.finite(elapsed := fresh[0].get("elapsed")) and elapsed >= 0:  # else damage: a miss
        return {**base, "returncode": 0, "timed_out": False, "spawn_error": None, "stderr": b"",
                "elapsed": elapsed, "cache": {"how": "ttl", "age": round(fresh[2], 1)}}
    # One real login, its known hosts file in a private directory of this run (State.scratch).
    if (scratch := ctx.state.scratch(NAME)) is None:
        return {"outcome": "could-not", "why": "no private directory could be made in the state dir"}
    hosts_file = os.path.join(scratch, "known_hosts")
    try:
        try:
            with open(hosts_file, "x") as f:
                f.write("\n".join(lines) + "\n")
        except OSError:  # a full disk: not checked, which is not unhealthy
            return {"outcome": "could-not", "why": "the state dir is full"}
        opts = {**OPTIONS, "IdentityFile": key, "UserKnownHostsFile": hosts_file,
                "ConnectTimeout": str(max(1, int(ctx.remaining())))}
        argv = ["ssh", "-F", "/dev/null", "-n", *(a for k, v in opts.items() for a in ("-o", f"{k}={v}")),
                "-p", str(s.ssh_port), "-l", s.ssh_probe_user, "--", ctx.config.host, "true"]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": scratch, "LC_ALL": "C"}
        done = proc.run(argv, deadline=ctx.deadline - deadlines.MARGIN, env=env, cwd=scratch, max_output=4096)
    finally:
        drop_scratch(scratch)
    data = {**base, "returncode": done.returncode, "timed_out": done.timed_out,
            "spawn_error": done.spawn_error, "stderr": done.stderr, "elapsed": done.elapsed}
    if judge(data, ctx).status is Status.PASS:
        ctx.state.write_json(CACHE, {"key": cache_key, "finished": time.time(), "status": Status.PASS.value,
                                     "data": {"elapsed": data["elapsed"]}})
    else:  # a failing login is never answered by an older pass
        ctx.state.remove(CACHE)
    return data


def judge(data: dict[str, Any], ctx: Context) -> Result:
    outcome = data["outcome"]
    if outcome == "no-key":
        return verdict(NAME, LOGIN_PROBE_KEY, "HEALTHCHECK_SSH_PROBE_KEY is not set: the probe has no key")
    if outcome == "probe-key":
        return verdict(NAME, LOGIN_PROBE_KEY, f"the probe key {clean(data['key'], 120)} {data['problem']}")
    if outcome == "no-host-keys":
        return verdict(NAME, LOGIN_NO_HOST_KEYS, "no public host key read from "
                       f"{clean(data['where'], 120)}: nothing to check the server against")
    if outcome == "could-not":
        return verdict(NAME, LOGIN_COULD_NOT, "login not checked: no private place for the known hosts file "
                       f"({clean(data.get('why'), 200)})")
    if data["spawn_error"]:
        return verdict(NAME, LOGIN_NO_CLIENT, f"cannot run the ssh client ({clean(data['spawn_error'], 60)})")
    where, user, stderr = data["where"], clean(data["user"], 32), data["stderr"]
    if data["timed_out"]:
        return verdict(NAME, SSHD_STUCK, f"no SSH login as {user} at {where} before the deadline "
                       f"({data['elapsed']:.1f}s)")
    elapsed = round(float(data["elapsed"]), 3)
    if data["returncode"] == 0:
        cached = f" (cached, {data['cache']['age']:.0f}s old)" if data.get("cache") else ""
        return passed(NAME, f"logged in as {user} at {where} with the probe key in {elapsed:.2f}s{cached}",
                      observed=elapsed, unit="s")
    # The client's last error line, cleaned: a hint, never a secret (the key is never read).
    lines = [ln for ln in stderr.splitlines()
             if ln.strip() and not ln.startswith((b"debug", b"Authenticated"))]
    said = squeeze(lines[-1], 120) if lines else "no message"
    authenticated = b"Authenticated to " in stderr
    if any(w in stderr.lower() for w in HOSTKEY_WORDS) and not authenticated:
        return verdict(NAME, LOGIN_HOSTKEY, f"the server at {where} offered a host key that is not the "
                       f"container's own ({said})", observed=elapsed, unit="s")
    if b"Permission denied" in stderr and not authenticated:
        return verdict(NAME, LOGIN_AUTH_FAILED, f"sshd at {where} refused the probe key for {user} ({said})",
                       observed=elapsed, unit="s")
    return verdict(NAME, LOGIN_FAILED, f"login as {user} at {where} did not run its command "
                   f"(exit {data['returncode']}: {said})", observed=elapsed, unit="s")


def on_deadline(ctx: Context) -> Result:
    return verdict(NAME, SSHD_STUCK, "no SSH login before the deadline")
