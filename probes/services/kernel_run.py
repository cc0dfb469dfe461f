"""jupyter-kernel's run of one kernel: start it, run the cell while its processes are watched,
read why it died, and remove it on every path (docs/probes.md, "The notebook path", says why).
"""

from __future__ import annotations

import os
import re
import time

from probes import untrusted
from probes.context import logger
from probes.services import _kernel

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from probes.context import Context
    from probes.services._kernel import Server

KERNEL_ID = re.compile(r"[0-9A-Za-z-]{1,64}")
MAX_NAMES = 32  # kernelspecs kept from a listing
MAX_ARGV = 64
DELETE_WAIT = 2.0  # seconds the server gets to shut the kernel down before its processes are ended
SETTLE = 1.0  # seconds a kernel the server has shut down gets for its process to be gone
STOP_WAIT = 0.4  # the same, on SIGTERM: the front door kills the suite a second after it
REPLAY = 5.0  # seconds the kernelspec's command gets when run again to read why it died
# Kernels started by this process and not yet removed: kernel id -> server (end_all's list).
_live: dict[str, Server] = {}
_stopping: list[bool] = []


def kernelspecs(got: dict[str, Any]) -> tuple[list[str], str, dict[str, dict[str, Any]]] | None:
    """(names, default, name -> {argv, env}) of a ``GET api/kernelspecs`` answer, or None."""
    doc = got.get("doc")
    if got["outcome"] != "response" or got.get("status") != 200 or not isinstance(doc, dict):
        return None
    specs = doc.get("kernelspecs")
    if not isinstance(specs, dict):
        return None
    by_name: dict[str, dict[str, Any]] = {}
    for name, entry in list(specs.items())[:MAX_NAMES]:
        spec = entry.get("spec") if isinstance(entry, dict) else None
        spec = spec if isinstance(spec, dict) else {}
        argv = spec.get("argv")
        env = spec.get("env")
        by_name[name] = {
            "argv": [a for a in argv[:MAX_ARGV] if isinstance(a, str)] if isinstance(argv, list) else [],
            "env": {k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str)}
            if isinstance(env, dict) else {}}
    default = doc.get("default")
    default = default if isinstance(default, str) else ""
    return sorted(untrusted.clean(n, 40) for n in by_name), default, by_name


def run(ctx: Context, srv: Server, name: str, spec: dict[str, Any], code: str, share: float,
        end: float) -> dict[str, Any]:
    """Start a kernel of ``name``, run ``code`` in it by ``share``, remove it by ``end``."""
    if _stopping:
        return {"outcome": "timeout", "stage": "start"}
    started = time.monotonic()
    got = _kernel.rest(srv, "POST", "api/kernels", share, {"name": name})
    doc = got.get("doc")
    kid = doc.get("id") if isinstance(doc, dict) else None
    if got["outcome"] != "response" or got.get("status") not in (200, 201) or not isinstance(kid, str) \
            or not KERNEL_ID.fullmatch(kid):
        if got["outcome"] == "timeout":
            return {"outcome": "timeout", "stage": "start"}
        why = _kernel.server_reason(got) if got["outcome"] == "response" else got["outcome"]
        return {"outcome": "start-failed", "why": why, "interpreter": interpreter_problem(spec, srv)}
    _live[kid] = srv
    out: dict[str, Any] = {"kernel_id": kid}
    seen: set[int] = set()
    owners: list[int | None] = []
    try:
        out.update(watch(srv, kid, code, share, seen, owners))
        if out["outcome"] == "reply":
            out["observed"] = round(time.monotonic() - started, 3)
        elif out["outcome"] == "died":
            uid = _uid_of(srv.pid) if srv.pid is not None else (owners[0] if owners else None)
            out["said"] = replay(spec, srv, uid, min(share, time.monotonic() + REPLAY))
    finally:
        out["cleanup"] = remove(srv, kid, seen, end)
        out["lingered"] = bool(out["cleanup"]["left"])
    return out


def watch(srv: Server, kid: str, code: str, share: float, seen: set[int],
          owners: list[int | None]) -> dict[str, Any]:
    """Run ``code`` over the kernel's channels in a thread while its processes are watched: a
    kernel whose processes all end before the reply has died (``seen``: the pids seen;
    ``owners``: the uid of the first)."""
    import threading

    chan = _kernel.Channel(srv, kid)
    done = threading.Event()

    def body() -> None:
        try:
            chan.run(code, share)
        finally:
            done.set()

    threading.Thread(target=body, daemon=True, name="jupyter-kernel").start()
    died = None
    while not done.wait(_kernel.POLL):
        now = _kernel.kernel_pids(kid)
        if seen and not now and not done.is_set():
            died = "its process exited"
            break
        if now and not seen:
            owners.extend(_uid_of(pid) for pid in sorted(now)[:1])  # whom the server runs kernels as
        seen |= now
        if time.monotonic() >= share:
            break
    box = chan.box
    if not done.is_set():
        chan.close()
        done.wait(0.5)
    base = {"stage": box["stage"], "pids": len(seen)}
    if box["stage"] == "done":
        return {**base, "outcome": "reply", "stdout": box["stdout"], "error": box["error"],
                "reply": box["reply"]}
    died = died or box["died"]
    if died is None and box["failed"] and seen and not any(_kernel.alive(p) for p in seen):
        died = "its process exited"
    if died:
        return {**base, "outcome": "died", "how": died}
    if box["failed"] and box["failed"] != "timeout" and time.monotonic() < share:
        return {**base, "outcome": "channels-failed", "why": box["failed"]}
    return {**base, "outcome": "timeout"}


def remove(srv: Server, kid: str, seen: set[int], end: float, wait: float = DELETE_WAIT) -> dict[str, Any]:
    """DELETE the kernel; if the server has not shut it down in ``wait`` seconds (or cannot),
    end its processes here and make sure the server forgets it. Never raises."""
    out: dict[str, Any] = {"deleted": False, "ended": 0, "left": 0}
    try:
        got = _kernel.rest(srv, "DELETE", f"api/kernels/{kid}", min(end, time.monotonic() + wait))
        out["deleted"] = got["outcome"] == "response" and got.get("status") in (200, 204, 404)
        left = _kernel.kernel_pids(kid) | {p for p in seen if _kernel.alive(p)}
        settle = min(end, time.monotonic() + (SETTLE if out["deleted"] else 0.0))
        while left and time.monotonic() < settle:  # shut down: its process may still be exiting
            time.sleep(0.02)
            left = {p for p in left if _kernel.alive(p)}
        if left:
            out["ended"] = len(left)
            out["left"] = len(_kernel.end_tree(left, max(end, time.monotonic() + 0.2)))
        if not out["deleted"]:
            # The server may still be shutting it down (our DELETE timed out): once the
            # processes are gone it finishes; ask again so that it surely forgets the kernel.
            again = _kernel.rest(srv, "DELETE", f"api/kernels/{kid}", max(end, time.monotonic() + 0.3))
            out["deleted"] = again["outcome"] == "response" and again.get("status") in (200, 204, 404)
    except Exception:
        logger().exception("removing kernel %s failed", kid)
    finally:
        _live.pop(kid, None)
    return out


def end_all() -> None:
    """SIGTERM to the suite, or its exit: remove every kernel still listed, quickly."""
    _stopping.append(True)
    for kid, srv in list(_live.items()):
        remove(srv, kid, set(), time.monotonic() + STOP_WAIT, STOP_WAIT)


def replay(spec: dict[str, Any], srv: Server, uid: int | None, deadline: float) -> str | None:
    """Run the kernelspec's command once more as a contained child, as the server's user with its
    environment, and return the line of its output that names why it exits (None: it did not)."""
    import json
    import shutil
    import tempfile

    from probes import proc

    argv = list(spec["argv"])
    if not argv:
        return None
    work = tempfile.mkdtemp(prefix="healthcheck-kernel-")
    try:
        os.chmod(work, 0o711)  # noqa: S103 - the server's user must reach the connection file
        conn = os.path.join(work, "kernel.json")
        ports = _free_ports(5)
        with open(conn, "w") as fh:
            json.dump({"transport": "tcp", "ip": "127.0.0.1", "signature_scheme": "hmac-sha256",
                       "key": os.urandom(16).hex(), **dict(zip(("shell_port", "iopub_port", "stdin_port",
                                                              "control_port", "hb_port"), ports))}, fh)
        os.chmod(conn, 0o644)
        argv = [a.replace("{connection_file}", conn) for a in argv]
        env = {**_server_env(srv, uid), **spec["env"]}
        if uid is not None and os.geteuid() == 0 and uid != 0 and shutil.which("setpriv"):
            argv = ["setpriv", f"--reuid={uid}", f"--regid={_gid_of(uid)}", "--clear-groups", "--", *argv]
        done = proc.run(argv, deadline=deadline, env=env, cwd=work)
    except OSError:
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if done.timed_out or done.spawn_error:
        return f"cannot run {untrusted.clean(argv[0], 60)}" if done.spawn_error else None
    text = (done.stderr + b"\n" + done.stdout).decode("utf-8", "replace")
    logger().info("kernel replay exit %s: %s", done.returncode, untrusted.squeeze(done.stderr[-2000:], 600))
    return _kernel.first_cause(text) or None


def interpreter_problem(spec: dict[str, Any], srv: Server) -> str | None:
    """What is wrong with the program the kernelspec's argv names, if anything (the server's
    own answer to a start that failed is often just "Unhandled error")."""
    import shutil

    argv = spec["argv"]
    if not argv or not argv[0]:
        return "its argv is empty"
    program = argv[0]
    shown = untrusted.clean(program, 80)
    if "/" in program:
        if not os.path.exists(program):
            return f"its argv names {shown}, which does not exist"
        return None if os.access(program, os.X_OK) else f"its argv names {shown}, which is not executable"
    found = shutil.which(program, path=_server_env(srv, None).get("PATH") or os.defpath)
    return None if found else f"its argv names {shown}, which is not on the server's PATH"


def _free_ports(n: int) -> list[int]:
    import _socket

    socks, ports = [], []
    try:
        for _ in range(n):
            s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(int(s.getsockname()[1]))
    finally:
        for s in socks:
            s.close()
    return ports


def _server_env(srv: Server, uid: int | None) -> dict[str, str]:
    """The server's environment (its kernels inherit it) when we may read it, else ours with the
    home and name of ``uid`` (where its ~/.local lies)."""
    if srv.pid is not None:
        try:
            with open(f"/proc/{srv.pid}/environ", "rb") as fh:
                raw = fh.read(256 * 1024)
            env = {}
            for item in raw.split(b"\0"):
                key, sep, value = item.partition(b"=")
                if sep and key:
                    env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
            if env:
                return env
        except OSError:
            pass
    env = dict(os.environ)
    if uid is not None and uid != os.geteuid():
        import pwd

        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            return env
        env.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name)
    return env


def _uid_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _gid_of(uid: int) -> int:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid
