"""jupyter-kernel's run of one kernel: start it, run the cell while its processes and its server's
word are watched, read why it died, and remove it on every path (docs/probes.md, "The notebook
path", says why).

A kernel is recorded in the state dir before it is asked for (``kernel-<id>.json``: its server,
the time, and the run that asked, by pid and start time); the record goes once the server confirms
the kernel is gone. Each run first removes the kernels of recorded runs that were killed (``reap``).
"""

from __future__ import annotations

import os
import re
import time

from probes import pidstat, untrusted
from probes.context import logger
from probes.services import _kernel

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from probes.context import Context
    from probes.services._kernel import Server
    from probes.state import State

KERNEL_ID = re.compile(r"[0-9A-Za-z-]{1,64}")
MAX_NAMES = 32  # kernelspecs kept from a listing
MAX_ARGV = 64
MAX_RECORDS = 64  # records of kernels looked at by one run
RECORD = "kernel-"  # the record of a kernel asked for: kernel-<id>.json in the state dir
DELETE_WAIT = 2.0  # seconds the server gets to shut the kernel down before its processes are ended
SETTLE = 1.0  # seconds a kernel the server has shut down gets for its process to be gone
STOP_WAIT = 0.4  # the same, on SIGTERM: the front door kills the suite a second after it
ASK_EVERY = 1.0  # seconds between asking the server about a starting kernel
STALE = 300.0  # seconds after which a kernel never answered and not listed by the server is forgotten
REPLAY = 5.0  # seconds the kernelspec's command gets when run again to read why it died
# The command run again: the connection file is opened as the kernel's user in the scratch dir (its
# working directory until then: root's state dir above is closed to that user) and handed on as
# descriptor 3; the kernel then runs in $0, the user's home, where the server starts its kernels.
LAUNCH = 'exec 3<kernel.json || exit 126; cd -- "$0" 2>/dev/null || cd /; exec "$@"'
# Kernels asked for by this process and not yet removed: kernel id -> (server, state dir, record,
# processes seen: pid -> start), end_all's list.
_live: dict[str, tuple[Server, State, dict[str, Any], dict[int, int]]] = {}
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
    import uuid

    if _stopping:
        return {"outcome": "timeout", "stage": "start"}
    kid = str(uuid.uuid4())
    seen: dict[int, int] = {}
    rec = _note(ctx.state, srv, kid, seen)
    started, procs = time.monotonic(), _kernel.Procs(kid)
    # Looked for from the start: a kernel that fails an import can be gone before the answer.
    got = _looking(procs, seen, lambda: _kernel.rest(srv, "POST", "api/kernels", share,
                                                     {"name": name, "kernel_id": kid}))
    doc = got.get("doc")
    given = doc.get("id") if isinstance(doc, dict) else None
    if got["outcome"] == "response" and got.get("status") in (200, 201) and isinstance(given, str) \
            and KERNEL_ID.fullmatch(given):
        if given != kid:  # a server that does not take the id asked for answers its own
            _forget(ctx.state, kid)
            kid, procs = given, _kernel.Procs(given)
        rec = _note(ctx.state, srv, kid, seen, answered=True)
        out: dict[str, Any] = {}
    elif got["outcome"] == "response":  # refused: nothing was started
        _forget(ctx.state, kid)
        return {"outcome": "start-failed", "why": _kernel.server_reason(got),
                "interpreter": interpreter_problem(spec, srv)}
    else:  # no answer: the server may still start it under our id
        out = {"outcome": "timeout", "stage": "start"} if got["outcome"] == "timeout" else \
            {"outcome": "start-failed", "why": got["outcome"], "interpreter": interpreter_problem(spec, srv)}
    try:
        if not out:
            out.update(watch(srv, kid, code, share, procs, seen))
            if out["outcome"] == "reply":
                out["observed"] = round(time.monotonic() - started, 3)
            elif out["outcome"] == "died":
                out.update(replay(ctx, spec, srv, min(share, time.monotonic() + REPLAY)))
    finally:
        out["kernel_id"] = kid
        out["cleanup"] = remove(ctx.state, srv, kid, rec, seen, end)
        out["lingered"] = bool(out["cleanup"]["left"])
    return out


def _looking(procs: _kernel.Procs, seen: dict[int, int],
             call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``call()`` (which never raises), run in a thread while the kernel's processes are looked for."""
    import threading

    box: list[dict[str, Any]] = []
    thread = threading.Thread(target=lambda: box.append(call()), daemon=True, name="jupyter-kernel-start")
    thread.start()
    while thread.is_alive():
        seen.update(procs.scan())
        thread.join(_kernel.POLL)
    return box[0]


def watch(srv: Server, kid: str, code: str, share: float, procs: _kernel.Procs,
          seen: dict[int, int]) -> dict[str, Any]:
    """Run ``code`` over the kernel's channels in a thread while the kernel is watched (``seen``:
    every process of it seen, pid -> start). It has died when every process seen has ended
    before the reply, or when the server says so: ``dead`` or ``restarting`` in its model or
    on iopub, or the kernel gone from its list (its restarter gave up)."""
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
    ask = time.monotonic() + ASK_EVERY
    while not done.wait(_kernel.POLL) and time.monotonic() < share:
        now = procs.scan()
        if seen and not any(now.get(pid) == start for pid, start in seen.items()) and not done.is_set():
            died = "its process exited"
            break
        seen.update(now)
        if time.monotonic() >= ask:
            died = _server_says(srv, kid, share)
            if died:
                break
            ask = time.monotonic() + ASK_EVERY
    box = chan.box
    if not done.is_set():
        chan.close()
        done.wait(0.5)
    base = {"stage": box["stage"], "pids": len(seen)}
    if box["stage"] == "done":
        return {**base, "outcome": "reply", "stdout": box["stdout"], "error": box["error"],
                "reply": box["reply"]}
    died = died or box["died"]
    if died is None and box["failed"] and seen and not _kernel.live(seen):
        died = "its process exited"
    if died:
        return {**base, "outcome": "died", "how": died}
    if box["failed"] and box["failed"] != "timeout" and time.monotonic() < share:
        return {**base, "outcome": "channels-failed", "why": box["failed"]}
    return {**base, "outcome": "timeout"}


def _server_says(srv: Server, kid: str, deadline: float) -> str | None:
    """How the server's model of the kernel says it died, if it does."""
    got = _kernel.rest(srv, "GET", f"api/kernels/{kid}", min(deadline, time.monotonic() + ASK_EVERY))
    if got["outcome"] != "response":
        return None
    if got.get("status") == 404:
        return "the server removed it"
    doc = got.get("doc")
    state = doc.get("execution_state") if isinstance(doc, dict) else None
    return f"the server reported it {state}" if state in ("dead", "restarting") else None


def remove(state: State, srv: Server, kid: str, rec: dict[str, Any], seen: dict[int, int], end: float,
           wait: float = DELETE_WAIT) -> dict[str, Any]:
    """DELETE the kernel; if the server has not shut it down in ``wait`` seconds (or cannot),
    end its processes here and make sure the server forgets it; its record goes once the server
    confirms it is gone. Never raises."""
    out: dict[str, Any] = {"deleted": False, "ended": 0, "left": 0}
    try:
        got = _kernel.rest(srv, "DELETE", f"api/kernels/{kid}", min(end, time.monotonic() + wait))
        out["deleted"] = _gone(got, rec)
        left = _kernel.Procs(kid).scan() | _kernel.live(seen)
        settle = min(end, time.monotonic() + (SETTLE if out["deleted"] else 0.0))
        while left and time.monotonic() < settle:  # shut down: its process may still be exiting
            time.sleep(0.02)
            left = _kernel.live(left)
        if left:
            out["ended"] = len(left)
            out["left"] = len(_kernel.end(left, max(end, time.monotonic() + 0.2)))
        if not out["deleted"]:
            # The server may still be shutting it down (our DELETE timed out): once the
            # processes are gone it finishes; ask again so that it surely forgets the kernel.
            again = _kernel.rest(srv, "DELETE", f"api/kernels/{kid}", max(end, time.monotonic() + 0.3))
            out["deleted"] = _gone(again, rec)
        if out["deleted"]:
            _forget(state, kid)
        out["recorded"] = state.enabled and not out["deleted"]  # for the next run to remove
    except Exception:
        logger().exception("removing kernel %s failed", kid)
    finally:
        _live.pop(kid, None)
    return out


def _gone(got: dict[str, Any], rec: dict[str, Any]) -> bool:
    """Whether a DELETE's answer says the kernel is gone: 2xx, or 404 for a kernel whose start
    was answered (a server still starting one under our id lists it only once started)."""
    status = got.get("status") if got["outcome"] == "response" else None
    if status == 404:
        return rec.get("answered") is True or time.time() - rec["time"] > STALE
    return status in (200, 204)


def _note(state: State, srv: Server, kid: str, seen: dict[int, int],
          answered: bool = False) -> dict[str, Any]:
    """Record the kernel ``kid`` (before it is asked for, and once its start is answered)."""
    me = pidstat.stat(os.getpid())
    rec = {"server": [srv.host, srv.port, srv.base_url], "time": time.time(), "pid": os.getpid(),
           "start": me.start if me is not None else None, "answered": answered}
    state.write_json(f"{RECORD}{kid}.json", rec)
    _live[kid] = (srv, state, rec, seen)
    return rec


def _forget(state: State, kid: str) -> None:
    state.remove(f"{RECORD}{kid}.json")
    _live.pop(kid, None)


def reap(state: State, srv: Server, deadline: float) -> None:
    """Remove the kernels that earlier runs left on ``srv``: those of runs that are gone (killed
    before their removal), and this process's own that no run of it is using (``serve`` lives on:
    a start answered after its run gave up). Another server's records wait for a run against it
    (its token is not ours)."""
    if not state.enabled or state.path is None:
        return
    try:
        names = sorted(n for n in os.listdir(state.path) if n.startswith(RECORD) and n.endswith(".json"))
    except OSError:
        return
    for name in names[:MAX_RECORDS]:
        kid, rec = name[len(RECORD):-len(".json")], state.read_json(name)
        if rec is None or not KERNEL_ID.fullmatch(kid) or not isinstance(rec.get("time"), (int, float)):
            state.remove(name)  # damaged: it can name no kernel of ours
            continue
        owner = pidstat.stat(rec["pid"]) if isinstance(rec.get("pid"), int) else None
        alive = owner is not None and owner.start == rec.get("start") and owner.state not in pidstat.DEAD
        if rec.get("server") != [srv.host, srv.port, srv.base_url] or time.monotonic() >= deadline or (
                alive and (rec["pid"] != os.getpid() or kid in _live)):
            continue
        logger().info("removing kernel %s that an earlier run left", kid)
        remove(state, srv, kid, rec, {}, deadline)


def end_all() -> None:
    """SIGTERM to the suite, or its exit: remove every kernel still listed, quickly."""
    _stopping.append(True)
    for kid, (srv, state, rec, seen) in list(_live.items()):
        remove(state, srv, kid, rec, seen, time.monotonic() + STOP_WAIT, STOP_WAIT)


def replay(ctx: Context, spec: dict[str, Any], srv: Server, deadline: float) -> dict[str, Any]:
    """Run the kernelspec's command once more as a contained child, as the server's user with its
    environment, for the line of its output that names why it exits: ``said`` (None: it did not
    exit), or ``unread``, why it was not run. Root never runs what that user wrote: the command
    runs only as the server's verified uid (``srv.uid``), dropped to where the suite is root, or
    as root for a server that root runs."""
    import json

    from probes import proc
    from probes.state import drop_scratch

    me = os.geteuid()
    if srv.uid is None:
        return {"unread": "the server's user is not known"}
    if srv.uid != me and me != 0:
        return {"unread": f"the suite may not run as the server's user (uid {srv.uid})"}
    if not spec["argv"]:
        return {}
    work = ctx.state.scratch("kernel")
    if work is None:
        return {"unread": "no state dir holds its connection file"}
    user = None if srv.uid == me else (srv.uid, _gid_of(srv.uid))
    try:
        ports = dict(zip(("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"),
                         _free_ports(5)))
        fd = os.open(os.path.join(work, "kernel.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                     0o600)
        with os.fdopen(fd, "w") as fh:
            if user is not None:
                os.fchown(fd, *user)
                os.chown(work, *user)
            json.dump({"transport": "tcp", "ip": "127.0.0.1", "signature_scheme": "hmac-sha256",
                       "key": os.urandom(16).hex(), **ports}, fh)
        env = {**_server_env(srv, srv.uid), **spec["env"]}
        argv = [a.replace("{connection_file}", "/dev/fd/3") for a in spec["argv"]]
        done = proc.run(["/bin/sh", "-c", LAUNCH, env.get("HOME") or "/", *argv], deadline=deadline, env=env,
                        cwd=work, user=user)
    except OSError:
        return {"unread": "its connection file could not be written"}
    finally:
        drop_scratch(work)
    if done.timed_out or done.spawn_error:
        return {"said": None}
    logger().info("kernel replay exit %s: %s", done.returncode, untrusted.squeeze(done.stderr[-2000:], 600))
    text = (done.stderr + b"\n" + done.stdout).decode("utf-8", "replace")
    return {"said": _kernel.first_cause(text) or None}


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


def _gid_of(uid: int) -> int:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid
