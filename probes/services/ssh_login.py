"""ssh-login: a real SSH key login over loopback succeeds and its forced command exits 0 (opt-in).

A banner proves that sshd answers; only a login proves that a user can get in. How the system
OpenSSH client is run so that nothing of the caller's SSH set-up plays a part, and the known hosts
file written for the run: docs/probes.md ("ssh-login"); the probe principal: docs/image.md. The
private key is never read by the suite; the client's messages reach the result only as a reason.
Readiness reuses a pass younger than HEALTHCHECK_SSH_LOGIN_TTL; startup always logs in.
Command line: ``ssh -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes -o IdentityAgent=none
-o UserKnownHostsFile=FILE -o StrictHostKeyChecking=yes -i KEY -p 22 -l USER 127.0.0.1 true``.
"""

from __future__ import annotations

import os
import stat
import time

from probes import deadlines, services
from probes.context import Context
from probes.result import Result, Status, passed, verdict
from probes.state import drop_scratch, life_identity
from probes.untrusted import Refused, clean, read_regular, squeeze

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

HOST_ALIAS = "healthcheck-probe"  # the name the known hosts file and the client agree on
# ssh_host_*_key.pub in the first of these that has any, unless HEALTHCHECK_SSH_HOST_KEYS says
# otherwise: /etc/ssh, or on a read-only root where the image's entrypoint makes them (docs/image.md).
HOST_KEY_DIRS = ("/etc/ssh", "/run/ssh-host-keys/etc/ssh")
HOST_KEYS = f"{HOST_KEY_DIRS[0]}/ssh_host_*_key.pub"
MAX_HOST_KEY = 16 << 10  # bytes of one public host key file
SPEC = services.LOGIN_SPEC
NAME = SPEC.name
CACHE = "ssh-login.json"  # the last passing login, reused by readiness while younger than its TTL


def key_problem(path: str) -> str | None:
    """Why the client would not (or should not) use the private key at ``path``; never reads it."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be read ({os.strerror(exc.errno or 0)})"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not {os.geteuid()}"
    if st.st_mode & 0o077:
        return f"is readable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def known_hosts(host_keys: str | None) -> list[str]:
    """``HOST_ALIAS keytype base64`` for each public host key that can be read."""
    if host_keys:
        paths = host_keys.split(",")
    else:
        import glob

        paths = []
        for where in HOST_KEY_DIRS:
            paths = sorted(glob.glob(os.path.join(where, "ssh_host_*_key.pub")))
            if paths:
                break
    lines = []
    for path in paths:
        try:
            raw, _ = read_regular(path, MAX_HOST_KEY, owners=(0, os.geteuid()))
        except Refused:
            continue
        words = raw.decode("ascii", "replace").split()
        if len(words) >= 2:
            lines.append(f"{HOST_ALIAS} {words[0]} {words[1]}")
    return lines


def client_argv(s: services.SshLoginSettings, host: str, hosts_file: str, deadline_left: float) -> list[str]:
    opts = {"BatchMode": "yes", "IdentitiesOnly": "yes", "IdentityAgent": "none",
            "IdentityFile": str(s.ssh_probe_key),
            "PreferredAuthentications": "publickey", "PasswordAuthentication": "no",
            "KbdInteractiveAuthentication": "no", "UserKnownHostsFile": hosts_file,
            "GlobalKnownHostsFile": "/dev/null", "StrictHostKeyChecking": "yes", "HostKeyAlias": HOST_ALIAS,
            "UpdateHostKeys": "no", "CheckHostIP": "no", "ControlMaster": "no", "ControlPath": "none",
            "ForwardAgent": "no", "ForwardX11": "no", "ClearAllForwardings": "yes", "RequestTTY": "no",
            "ConnectTimeout": str(max(1, int(deadline_left))), "LogLevel": "VERBOSE"}
    argv = ["ssh", "-F", "/dev/null", "-n"]
    for key, value in opts.items():
        argv += ["-o", f"{key}={value}"]
    return [*argv, "-p", str(s.ssh_port), "-l", s.ssh_probe_user, "--", host, "true"]


def gather(ctx: Context) -> dict[str, Any]:
    s = ctx.config.of(services.SshLoginSettings)
    key = s.ssh_probe_key
    if key is None:
        return {"outcome": "no-key"}
    problem = key_problem(key)
    if problem is not None:
        return {"outcome": "probe-key", "key": key, "problem": problem}
    lines = known_hosts(s.ssh_host_keys)
    if not lines:
        return {"outcome": "no-host-keys", "where": s.ssh_host_keys or HOST_KEYS}
    if not ctx.state.enabled:  # the known hosts file goes nowhere else (never /tmp)
        return {"outcome": "could-not", "why": ctx.state.disabled_reason}
    from probes.framework import deep

    # What decides the answer, and this container's life: a restarted container logs in again.
    cache_key = {"host": ctx.config.host, "port": s.ssh_port, "user": s.ssh_probe_user, "key": key,
                 "host_keys": lines, "identity": life_identity()}
    base = {"outcome": "ran", "user": s.ssh_probe_user, "where": f"{ctx.config.host}:{s.ssh_port}"}
    fresh = deep.fresh_pass(ctx.state.read_json(CACHE), cache_key, s.ssh_login_ttl) \
        if ctx.config.profile_rules.reuses_cache else None
    elapsed = fresh[0].get("elapsed") if fresh else None
    if fresh and isinstance(elapsed, float) and elapsed >= 0:  # anything else is damage: a miss
        return {**base, "returncode": 0, "timed_out": False, "spawn_error": None, "stderr": b"",
                "elapsed": elapsed, "cache": {"how": "ttl", "age": round(fresh[2], 1)}}
    data = {**base, **login(ctx, s, lines)}
    if data["outcome"] == "ran" and judge(data, ctx).status is Status.PASS:
        ctx.state.write_json(CACHE, {"key": cache_key, "finished": time.time(), "status": Status.PASS.value,
                                     "data": {"elapsed": data["elapsed"]}})
    else:  # a failing login is never answered by an older pass
        ctx.state.remove(CACHE)
    return data


def login(ctx: Context, s: services.SshLoginSettings, lines: list[str]) -> dict[str, Any]:
    """One real login, its known hosts file in a private directory of this run (State.scratch)."""
    from probes import proc

    scratch = ctx.state.scratch(NAME)
    if scratch is None:
        return {"outcome": "could-not", "why": "no private directory could be made in the state dir"}
    hosts_file = os.path.join(scratch, "known_hosts")
    try:
        try:
            fd = os.open(hosts_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write("\n".join(lines) + "\n")
        except OSError:  # a full disk: not checked, which is not unhealthy
            return {"outcome": "could-not", "why": "the state dir is full"}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": scratch, "LC_ALL": "C"}
        done = proc.run(client_argv(s, ctx.config.host, hosts_file, ctx.remaining()),
                        deadline=ctx.deadline - deadlines.MARGIN, env=env, cwd=scratch, max_output=4096)
    finally:
        drop_scratch(scratch)
    return {"returncode": done.returncode, "timed_out": done.timed_out, "spawn_error": done.spawn_error,
            "stderr": done.stderr, "elapsed": done.elapsed}


HOSTKEY_WORDS = (b"Host key verification failed", b"IDENTIFICATION HAS CHANGED", b"No matching host key",
                 b"no matching host key")


def classify(returncode: int | None, stderr: bytes) -> str:
    """The reason for a login that did not exit 0, from the client's exit status and messages."""
    authenticated = b"Authenticated to " in stderr
    if any(w in stderr for w in HOSTKEY_WORDS) and not authenticated:
        return "ssh-hostkey"
    if b"Permission denied" in stderr and not authenticated:
        return "ssh-auth-failed"
    return "ssh-login-failed"


def _last_words(stderr: bytes) -> str:
    """The client's last error line, cleaned: a hint, never a secret (the key is never read)."""
    lines = [ln for ln in stderr.splitlines()
             if ln.strip() and not ln.startswith((b"debug", b"Authenticated"))]
    return squeeze(lines[-1], 120) if lines else "no message"


def judge(data: dict[str, Any], ctx: Context) -> Result:
    outcome = data["outcome"]
    if outcome == "no-key":
        return verdict(NAME, services.LOGIN_PROBE_KEY,
                       "HEALTHCHECK_SSH_PROBE_KEY is not set: the login probe has no key")
    if outcome == "probe-key":
        return verdict(NAME, services.LOGIN_PROBE_KEY,
                       f"the probe key {clean(data['key'], 120)} {data['problem']}")
    if outcome == "no-host-keys":
        return verdict(NAME, services.LOGIN_NO_HOST_KEYS, "no public host key read from "
                       f"{clean(data['where'], 120)}: nothing to check the server against")
    if outcome == "could-not":
        return verdict(NAME, services.LOGIN_COULD_NOT, "login not checked: no private place for the known "
                       f"hosts file ({clean(data.get('why'), 200)})")
    if data["spawn_error"]:
        return verdict(NAME, services.LOGIN_NO_CLIENT,
                       f"cannot run the ssh client ({clean(data['spawn_error'], 60)})")
    where, user = data["where"], clean(data["user"], 32)
    if data["timed_out"]:
        return verdict(NAME, services.SSHD_STUCK, f"no SSH login as {user} at {where} before the deadline "
                       f"({data['elapsed']:.1f}s)")
    elapsed = round(float(data["elapsed"]), 3)
    if data["returncode"] == 0:
        cached = f" (cached, {data['cache']['age']:.0f}s old)" if data.get("cache") else ""
        return passed(NAME, f"logged in as {user} at {where} with the probe key in {elapsed:.2f}s{cached}",
                      observed=elapsed, unit="s")
    reason = classify(data["returncode"], data["stderr"])
    said = _last_words(data["stderr"])
    if reason == "ssh-hostkey":
        return verdict(NAME, services.LOGIN_HOSTKEY, f"the server at {where} offered a host key "
                       f"that is not the container's own ({said})", observed=elapsed, unit="s")
    if reason == "ssh-auth-failed":
        return verdict(NAME, services.LOGIN_AUTH_FAILED, f"sshd at {where} refused the probe key for {user} "
                       f"({said})", observed=elapsed, unit="s")
    return verdict(NAME, services.LOGIN_FAILED, f"login as {user} at {where} did not run its command "
                   f"(exit {data['returncode']}: {said})", observed=elapsed, unit="s")


def on_deadline(ctx: Context) -> Result:
    return verdict(NAME, services.SSHD_STUCK, "no SSH login before the deadline")
