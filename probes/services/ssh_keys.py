"""ssh-keys: what sshd would refuse of the SSH user's key files (StrictModes) and account, where the
client sees only "Permission denied (publickey)" (OpenSSH ``auth.c``; docs/probes.md). Command line:
``stat -c '%U %a %n' ~dev/.ssh/authorized_keys``."""

from __future__ import annotations

import glob
import os
import stat
import time

from probes.context import Context
from probes.record import Record
from probes.result import Result, passed, verdict
from probes.spec import TEXT, Declared, Spec, cause, setting
from probes.untrusted import Refused, clean, read_regular

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


class SshKeysSettings(Declared):
    ssh_user: str | None = setting("HEALTHCHECK_SSH_USER", TEXT, None,
                                   "the user whose key files and account are checked as sshd would",
                                   shown_default="`$DEV_USER`, else the check is skipped")


KEYS_ACCOUNT = cause(
    "ssh-account", "the account cannot log in: no such user, login shell missing or `nologin`, "
    "account expired, or password locked (`!`) while sshd runs without PAM",
    "create the account or fix it (`usermod -s /bin/bash USER`, `usermod -e '' USER`, `usermod -U USER`)",
    action="fix-config", actor="tenant")
# The message gives the command that mends the path it names (remedy=False).
KEYS_STRICT_MODES = cause(
    "ssh-strict-modes", "sshd's StrictModes refuses the key file: it, `~/.ssh` or the home directory is "
    "group/other-writable or owned by another user, or the file is not a regular file (the message names "
    "the path, owner and mode)", "the command the message gives, e.g. `chmod g-w /home/dev`",
    action="fix-config", actor="tenant")
KEYS_NONE = cause(
    "ssh-no-keys", "no authorized keys file, or it is empty or holds no public key that parses: nobody can "
    "log in with a key yet", "give keys (`SSH_AUTHORIZED_KEYS` in the image) or fix the file's lines", "warn",
    action="fix-config", actor="tenant")
# A home directory on a network or host mount that hangs: the node's storage, not the container.
KEYS_HUNG = cause("deadline", "the key files were not read before the deadline (a hung file system)",
                  "check the home directory's mount", action="retry", actor="operator")
KEYS_NO_USER = cause("no-user", "neither `HEALTHCHECK_SSH_USER` nor `DEV_USER` is set",
                     "set `HEALTHCHECK_SSH_USER` (or `DEV_USER`) to the user who logs in over SSH", "skip",
                     action="fix-config", actor="tenant")

SPEC = Spec(
    "ssh-keys", layer="services", module=__name__, toggle="ENABLE_SSH_CHECK", timeout=2.0,
    profiles=("startup", "readiness"), measurement="strict-modes", about="the SSH user's home, `~/.ssh` "
    "and `authorized_keys` pass sshd's StrictModes, hold a key, and the account may log in",
    settings=SshKeysSettings.SETTINGS,
    causes=(KEYS_ACCOUNT, KEYS_STRICT_MODES, KEYS_NONE, KEYS_HUNG, KEYS_NO_USER),
)
NAME = SPEC.name


class System(Record):  # where accounts and sshd's configuration are read; nss: look up users not in passwd
    passwd: str = "/etc/passwd"
    shadow: str = "/etc/shadow"
    sshd_config: str = "/etc/ssh/sshd_config"
    nss: bool = True


MAX_DB, MAX_KEYS_FILE = 4 << 20, 1 << 20  # bytes of an account or sshd configuration file; of authorized_keys
# Public key types sshd accepts in authorized_keys (sshkey.c keytypes), each with its certificate type.
KEYS = ("ssh-ed25519", "ssh-rsa", "ssh-dss", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521", "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")
KEY_TYPES = frozenset({*KEYS, "ssh-ed448", *(key.split("@")[0] + "-cert-v01@openssh.com" for key in KEYS)})


def sshd_options(path: str, found: dict[str, str], files: list[str]) -> dict[str, str]:
    """sshd's first value of each keyword (lower case) before any Match, Includes read where they stand;
    a file that cannot be read is passed over (a non-root run sees sshd's defaults)."""
    files.append(path)
    try:
        raw, _ = read_regular(path, MAX_DB, owners=(0,))
    except Refused:
        return found
    for line in raw.decode("utf-8", "replace").splitlines():
        words = line.split("#", 1)[0].replace("=", " ", 1).split()
        key = words[0].lower() if words else ""
        if key == "match":
            break  # the rest of this file applies to some connections only
        if key == "include":
            for pattern in words[1:]:
                for name in sorted(glob.glob(os.path.join("/etc/ssh", pattern))):  # an absolute one stays
                    if len(files) < 64:  # configuration files read in all
                        sshd_options(name, found, files)
        elif len(words) > 1:
            found.setdefault(key, " ".join(words[1:]))
    return found


def _entry(path: str, user: str, fields: int) -> list[str] | None:
    try:
        raw, _ = read_regular(path, MAX_DB, owners=(0,))
    except Refused:
        return None
    rows = (line.split(":") for line in raw.decode("utf-8", "replace").splitlines())
    return next((parts for parts in rows if parts[0] == user and len(parts) >= fields), None)


def account(user: str, system: System) -> dict[str, Any] | None:
    """uid, home, shell and, where readable, the password field and expiry day of ``user``."""
    row = _entry(system.passwd, user, 7)
    if row is None and system.nss:
        import pwd

        try:
            pw = pwd.getpwnam(user)
        except (KeyError, OSError):
            return None
        row = [pw.pw_name, pw.pw_passwd, str(pw.pw_uid), str(pw.pw_gid), "", pw.pw_dir, pw.pw_shell]
    if row is None or not row[2].isdigit():
        return None
    info: dict[str, Any] = {"uid": int(row[2]), "home": row[5], "shell": row[6] or "/bin/sh",
                            "password": row[1] if row[1] != "x" else None, "expire": None}
    shadow = _entry(system.shadow, user, 8)  # None when not root: only the shell is judged then
    if shadow is not None:
        info.update(password=shadow[1], expire=int(shadow[7]) if shadow[7].isdigit() else None)
    return info


def _unsafe(path: str, st: os.stat_result, uid: int, user: str) -> dict[str, Any] | None:
    if st.st_uid in (0, uid) and not st.st_mode & 0o022:
        return None
    who = ("g" if st.st_mode & 0o020 else "") + ("o" if st.st_mode & 0o002 else "")
    return {"path": path, "owner": st.st_uid, "mode": f"{stat.S_IMODE(st.st_mode):04o}",
            "fix": f"chown {user} {path}" if st.st_uid not in (0, uid) else f"chmod {who}-w {path}"}


def keys_file(path: str, uid: int, user: str, home: str) -> dict[str, Any]:
    """What sshd would make of one authorized keys file: missing, refused by StrictModes
    (``auth_secure_path``), or read (its keys counted)."""
    try:
        lst = os.lstat(path)
    except OSError:
        return {"path": path, "state": "missing"}
    if stat.S_ISLNK(lst.st_mode) and lst.st_uid not in (0, uid):
        return {"path": path, "state": "unsafe", "why": f"a symbolic link owned by uid {lst.st_uid}",
                "problem": {"path": path, "owner": lst.st_uid, "mode": "link",
                            "fix": f"replace the symbolic link {path} with {user}'s own file"}}
    real = os.path.realpath(path)  # sshd judges the resolved path, as here
    try:
        raw, st = read_regular(real, MAX_KEYS_FILE)
    except Refused as exc:
        if str(exc) != "not a regular file":
            return {"path": path, "state": "unreadable", "why": str(exc)}
        return {"path": path, "state": "unsafe", "why": str(exc),
                "problem": {"path": real, "owner": None, "mode": None,
                            "fix": f"make {real} a regular file owned by {user}"}}
    real_home, here, problem = os.path.realpath(home), real, _unsafe(real, st, uid, user)
    while problem is None and here not in (real_home, "/"):
        here = os.path.dirname(here)
        try:
            problem = _unsafe(here, os.stat(here), uid, user)
        except OSError:
            problem = {"path": here, "owner": None, "mode": None, "fix": f"check {here}"}
    if problem is not None:
        return {"path": path, "state": "unsafe", "problem": problem}
    return {"path": path, "state": "ok", "keys": count_keys(raw), "size": len(raw)}


def count_keys(raw: bytes) -> int:
    """Lines of an authorized_keys file that hold a public key sshd could parse: after the line's
    options (if any), one of its key types and the base64 blob whose first field names that type."""
    import binascii

    count = 0
    for line in raw.decode("utf-8", "replace").splitlines():
        words = line.split() if not line.lstrip().startswith("#") else []
        for kind, blob in zip(words, words[1:]):
            try:
                key = binascii.a2b_base64(blob.encode("ascii"))
            except (ValueError, UnicodeError):
                continue
            size = int.from_bytes(key[:4], "big")
            if kind in KEY_TYPES and len(key) > 4 + size and key[4:4 + size] == kind.encode():
                count += 1
                break
    return count


def gather(ctx: Context, environ: Mapping[str, str] = os.environ,
           system: System | None = None) -> dict[str, Any]:
    system = system or System()
    if not (user := ctx.config.of(SshKeysSettings).ssh_user or environ.get("DEV_USER")):
        return {"outcome": "no-user"}
    if (info := account(user, system)) is None:
        return {"outcome": "no-such-user", "user": user}
    options = sshd_options(system.sshd_config, {}, [])
    # AuthorizedKeysFile (sshd's default unless set), %h, %u and %% expanded, relative to the home.
    words = options.get("authorizedkeysfile", ".ssh/authorized_keys .ssh/authorized_keys2").split()
    words = [] if [w.lower() for w in words] == ["none"] else words
    paths = [os.path.join(info["home"], w.replace("%%", "\0").replace("%h", info["home"]).replace("%u", user)
                          .replace("\0", "%")) for w in words]
    shell, problem = info["shell"], None
    try:
        st = os.stat(shell)
        if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
            problem = f"login shell {clean(shell, 80)} is not an executable file"
        elif os.path.basename(shell) in ("nologin", "false"):
            problem = f"login shell is {clean(shell, 80)}: no session can start"
    except OSError:
        problem = f"login shell {clean(shell, 80)} does not exist"
    return {"outcome": "checked", "user": user, **info, "today": int(time.time() // 86400),
            "use_pam": options.get("usepam", "no").lower() == "yes",
            "strict": options.get("strictmodes", "yes").lower() != "no", "shell_problem": problem,
            "files": [keys_file(p, info["uid"], user, info["home"]) for p in paths]}


def judge(data: dict[str, Any], ctx: Context) -> Result:
    if data["outcome"] == "no-user":
        return verdict(NAME, KEYS_NO_USER, "no SSH user to check")
    user = clean(data["user"], 64)
    if data["outcome"] == "no-such-user":
        return verdict(NAME, KEYS_ACCOUNT, f"SSH user {user} does not exist")
    expire, problem = data.get("expire"), data["shell_problem"]
    if not problem and expire is not None and expire <= data["today"]:
        problem = "the account expired (shadow's expiry day has passed)"
    elif not problem and (data.get("password") or "").startswith("!") and not data["use_pam"]:
        problem = "the account is locked (password field starts with '!') and sshd runs without PAM"
    if problem:
        return verdict(NAME, KEYS_ACCOUNT, f"{user} cannot log in over SSH: {problem}")
    files = data["files"]
    unsafe = next((f for f in files if f["state"] == "unsafe"), None) if data["strict"] else None
    if unsafe is not None:
        p = unsafe["problem"]
        what = unsafe.get("why") or f"owner uid {p['owner']}, mode {p['mode']}"
        return verdict(NAME, KEYS_STRICT_MODES, f"sshd (StrictModes) refuses every key of {user}: "
                       f"{clean(p['path'], 120)} ({what}): run `{clean(p['fix'], 160)}`", remedy=False,
                       facts={"path": clean(p["path"], 200), "owner": p["owner"], "mode": p["mode"]})
    if keys := sum(f.get("keys", 0) for f in files):
        return passed(NAME, f"{user}: {keys} authorized key(s), sshd's StrictModes accept the key files",
                      observed=keys, unit="keys")
    # The file that says most: one read, else one that could not be, else the first.
    ranked = [f for state in ("ok", "unreadable") for f in files if f["state"] == state] + files
    f, path = (ranked[0], clean(ranked[0]["path"], 120)) if ranked else ({"state": None}, "")
    why = ("AuthorizedKeysFile is none" if not files
           else f"{path} is empty" if f["state"] == "ok" and not f["size"]
           else f"{path} holds no public key that parses" if f["state"] == "ok"
           else f"{path} not read ({clean(f['why'], 60)})" if f["state"] == "unreadable"
           else f"no authorized keys file ({path})")
    return verdict(NAME, KEYS_NONE, f"nobody can log in as {user} with a key yet: {why}", observed=0,
                   unit="keys")


def on_deadline(ctx: Context) -> Result:
    return verdict(NAME, KEYS_HUNG, "the SSH key files were not read before the deadline "
                   "(a hung file system?)")
