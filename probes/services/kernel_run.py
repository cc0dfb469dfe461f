"""jupyter-kernel's client and one kernel's run, watched, and removed on every path from a record in
the state dir (docs/probes.md, "The notebook path")."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import threading
import time
from datetime import datetime

from probes import pidstat, untrusted
from probes.context import Context, logger
from probes.services import jupyter, net
from probes.services.common import host_header, json_or_none
from probes.state import State, drop_scratch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

KERNEL_ID = r"[0-9A-Za-z-]{1,64}"  # patterns are compiled (and cached by re) on first use
MAX_OUTPUT, MAX_FRAME = 64 * 1024, 1024 * 1024  # characters of the cell's stdout kept; of one message read
RECORD = "kernel-"  # the record of a kernel asked for: kernel-<id>.json in the state dir
ASK_EVERY = 1.0  # seconds between asking the server about a starting kernel
STOP_WAIT = 0.4  # seconds for the server, then the processes, on SIGTERM: the front door kills a second later
# The command run again: the connection file is opened as the kernel's user in the scratch dir (its
# working directory until then: root's state dir above is closed to that user) and handed on as
# descriptor 3; the kernel then runs in $0, the user's home, where the server starts its kernels.
LAUNCH = 'exec 3<kernel.json || exit 126; cd -- "$0" 2>/dev/null || cd /; exec "$@"'
# An exception line: "ModuleNotFoundError: No module named 'x'" (a warning only when nothing else).
RAISED = r"[A-Za-z_][\w.]*(Error|Exception|Exit)\b:?"
WARNED = r"[A-Za-z_][\w.]*Warning\b:?"
FRAME = r'File "([^"]+)", line \d+'
# Words Python adds that name nothing: dropped before a long line is cut, so its names stay.
FILLER = r" \(most likely due to a circular import\)|(?<=') (?:if|since) it has the same name as [^)]*"
# Kernels asked for and not yet removed, for end_all: id -> (server, state, record, processes seen).
_live: dict[str, tuple[Server, State, dict[str, Any], dict[int, int]]] = {}
_stopping: list[bool] = []


class Server:
    """``token`` is never shown (nor in a repr: no record). ``pid``: from a trusted runtime file;
    ``uid``: whose listening socket answers."""

    def __init__(self, host: str, port: int, base_url: str, secure: bool, token: str, pid: int | None,
                 uid: int | None = None) -> None:
        self.host, self.port, self.base_url, self.secure = host, port, base_url, secure
        self.token, self.pid, self.uid = token, pid, uid

    def path(self, tail: str) -> str:
        return jupyter.quote_path(self.base_url + tail, jupyter.PATH_CHARS - {"%"})


def server(ctx: Context) -> tuple[Server, str | None, str]:
    """The server as the jupyter probe finds it (a token only for its owner's listener; ``uid`` when one
    alone listens), the runtime file that said so, and why the token file's token was withheld, or ""."""
    own = ctx.config.of(jupyter.JupyterSettings)
    found, _ = jupyter.find_runtime_file(ctx.config, secret=True)
    if found is not None:  # trusted: its owner alone listens on its port
        where = (found["host"], found["port"], found["base_url"], found["secure"])
        pid, held, source = found["pid"], {found["owner"]}, found["file"]
        if found["token"]:
            return Server(*where, found["token"], pid, found["owner"]), source, ""
    else:
        where = (ctx.config.host, own.jupyter_port, own.jupyter_base_url, bool(own.jupyter_tls))
        pid, held, source = None, net.listeners().get(own.jupyter_port, set()), None
    token, owner = jupyter.token_file(own.jupyter_token_file)
    withheld = jupyter.held_by(where[1], held, owner, "the token file") if token and owner is not None else ""
    uid = next(iter(held)) if len(held) == 1 else None
    return Server(*where, "" if withheld else token, pid, uid), source, withheld


def rest(srv: Server, method: str, tail: str, deadline: float, body: Any = None) -> dict[str, Any]:
    """``net.exchange``'s outcome, with ``doc``, the JSON answer; the server's last_activity stays."""
    got = net.exchange(srv.host, srv.port, f"{srv.path(tail)}?no_track_activity=1", srv.secure, deadline,
                       method=method, headers=f"Authorization: token {srv.token}\r\n" if srv.token else "",
                       body=b"" if body is None else json.dumps(body).encode())
    if got["outcome"] == "response":
        got["doc"] = json_or_none(got.pop("body"))
    return got


def activity(srv: Server, deadline: float) -> tuple[int, float] | None:
    """``GET api/status``: how many kernels the server runs and when it was last active (epoch)."""
    got = rest(srv, "GET", "api/status", deadline)
    doc = got.get("doc") if got.get("status") == 200 else None
    kernels, when = (doc.get("kernels"), doc.get("last_activity")) if isinstance(doc, dict) else (None, None)
    if type(kernels) is not int or not isinstance(when, str) or len(when) > 40:
        return None
    try:  # "2026-11-28T04:35:48.404000Z"; before Python 3.11 fromisoformat takes no "Z"
        stamp = datetime.fromisoformat(when.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (kernels, stamp.timestamp()) if stamp.tzinfo is not None else None


def command(entry: Any) -> dict[str, Any]:
    """The ``argv`` and ``env`` of a kernelspec in the server's listing, each kept only as text."""
    spec = entry.get("spec") if isinstance(entry, dict) else None
    argv, env = (spec.get("argv"), spec.get("env")) if isinstance(spec, dict) else (None, None)
    return {"argv": [a for a in argv[:64] if isinstance(a, str)] if isinstance(argv, list) else [],
            "env": {k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str)}
            if isinstance(env, dict) else {}}


def first_cause(text: str) -> str:
    """The line of a process's output that names the cause (docs/probes.md, "kernel-died"); one over
    200 characters loses Python's filler words, then its middle, never the names at its ends."""
    if not (lines := [ln.strip() for ln in text.splitlines() if ln.strip()]):
        return ""
    at = ([i for i, ln in enumerate(lines) if re.match(RAISED, ln)] or
          [i for i, ln in enumerate(lines) if re.match(WARNED, ln)] or [len(lines) - 1])[-1]
    frames = [m.group(1) for ln in lines[:at] if (m := re.match(FRAME, ln)) and m.group(1)[:1] != "<"]
    where = f" (in {frames[-1]})" if frames and "/" not in lines[at] else ""
    line = untrusted.clean(lines[at] + where, 800)
    line = re.sub(FILLER, "", line) if len(line) > 200 else line
    return f"{line[:97]} ... {line[-97:]}" if len(line) > 200 else line


def scanner(kernel_id: str) -> Callable[[], dict[int, int]]:
    """What finds the kernel's live processes, ``{pid: start}``: those whose command line names its
    connection file. Another's older than a second (a younger may not have exec'd yet) is not read again."""
    mark, others, tick = f"kernel-{kernel_id}.json".encode(), set(), os.sysconf("SC_CLK_TCK")

    def scan() -> dict[int, int]:
        found: dict[int, int] = {}
        try:
            entries = [int(e) for e in os.listdir("/proc") if e.isdigit()]
        except OSError:
            return found
        settled = (time.clock_gettime(time.CLOCK_BOOTTIME) - 1.0) * tick  # start times count from boot
        for pid in (e for e in entries if e not in others):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    line = fh.read(65536)
            except OSError:
                continue
            st = pidstat.stat(pid)
            if st is None or st.state in pidstat.DEAD:
                continue
            if mark in line:
                found[pid] = st.start
            elif st.start < settled:
                others.add(pid)
        return found

    return scan


def live(pairs: Mapping[int, int], until: float = 0.0) -> dict[int, int]:
    """Those of ``pairs`` (pid -> start) still alive, waiting for them to end until ``until``."""
    while True:
        pairs = {pid: start for pid, start in pairs.items() if (st := pidstat.stat(pid)) is not None
                 and st.start == start and st.state not in pidstat.DEAD}
        if not pairs or time.monotonic() >= until:
            return dict(pairs)
        time.sleep(0.01)


def _beside(call: Callable[[], Any], scan: Callable[[], dict[int, int]], seen: dict[int, int], until: float,
            srv: Server | None = None, kid: str = "") -> tuple[Any, bool]:
    """Run ``call()`` in a thread until it returns or ``until``, adding the kernel's processes to ``seen``;
    with ``srv``, also whether the kernel died meanwhile (docs/probes.md, "The notebook path")."""
    thread = threading.Thread(target=call, daemon=True, name="jupyter-kernel")
    thread.start()
    ask = time.monotonic() + ASK_EVERY
    while thread.is_alive() and time.monotonic() < until:
        now = scan()
        if srv is not None and seen and not any(now.get(pid) == start for pid, start in seen.items()) \
                and thread.is_alive():
            return thread, True
        seen.update(now)
        if srv is not None and time.monotonic() >= ask:
            got = rest(srv, "GET", f"api/kernels/{kid}", min(until, time.monotonic() + ASK_EVERY))
            state = got["doc"].get("execution_state") if isinstance(got.get("doc"), dict) else None
            if got.get("status") == 404 or state in ("dead", "restarting"):
                return thread, True
            ask = time.monotonic() + ASK_EVERY
        thread.join(0.02)  # a kernel that fails an import dies at once
    return thread, False


def _cell(ws: Any, srv: Server, kid: str, code: str, deadline: float, box: dict[str, Any]) -> None:
    """The cell over the kernel's channels, read until its execute_reply and idle status or the
    server's word that the kernel died; ``box`` says what happened. Never raises."""
    msg_id = os.urandom(16).hex()
    opts: dict[str, Any] = {"timeout": max(deadline - time.monotonic(), 0.001), "suppress_origin": True,
                            "http_no_proxy": ["*"],
                            "header": [f"Authorization: token {srv.token}"] if srv.token else []}
    if srv.secure and net.is_loopback(srv.host):
        import ssl  # Jupyter's certificate is usually self-signed; on loopback nobody sits between

        opts["sslopt"] = {"cert_reqs": ssl.CERT_NONE, "check_hostname": False}
    try:
        path = srv.path(f"api/kernels/{kid}/channels")
        ws.connect(f"{'wss' if srv.secure else 'ws'}://{host_header(srv.host, srv.port)}{path}", **opts)
        box["stage"] = "execute"
        ws.send(json.dumps({
            "header": {"msg_id": msg_id, "username": "healthcheck", "session": os.urandom(8).hex(),
                       "date": "", "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}}))
        while not (box["replied"] and box["idle"]) and not box["died"]:
            ws.settimeout(max(deadline - time.monotonic(), 0.001))
            frame = ws.recv()  # a binary frame carries buffers: none of ours
            msg = json_or_none(frame) if isinstance(frame, str) and len(frame) <= MAX_FRAME else None
            msg = msg if isinstance(msg, dict) else {}
            header, content, parent = (msg[k] if isinstance(msg.get(k), dict) else {}
                                       for k in ("header", "content", "parent_header"))
            kind, state, text = header.get("msg_type"), content.get("execution_state"), content.get("text")
            if kind == "status" and state in ("dead", "restarting", "autorestarting"):
                box["died"] = f"the server reported the kernel {state}"
            elif parent.get("msg_id") != msg_id:
                continue
            elif kind == "stream" and content.get("name") == "stdout" and isinstance(text, str):
                box["stdout"] = (box["stdout"] + text)[:MAX_OUTPUT]
            elif kind == "error":
                box["error"] = {"ename": untrusted.clean(content.get("ename", "?"), 60),
                                "evalue": untrusted.clean(content.get("evalue", ""), 160)}
            elif kind == "status" and state == "idle":
                box["idle"] = True
            elif kind == "execute_reply":
                box["replied"] = True
        if not box["died"]:
            box["stage"] = "done"
    except Exception as exc:  # said in fixed words: an exception's text could quote a header or a URL
        status, kind = getattr(exc, "status_code", None), type(exc).__name__
        late = isinstance(exc, (TimeoutError, net.timeout)) or kind == "WebSocketTimeoutException"
        box["failed"] = (f"the server refused the channels with HTTP {status}" if isinstance(status, int)
                         else "timeout" if late
                         else "the server closed the channels" if kind == "WebSocketConnectionClosedException"
                         else f"the channels failed ({kind})")


def run(ctx: Context, srv: Server, name: str, spec: dict[str, Any], code: str, share: float,
        end: float) -> dict[str, Any]:
    """Start a kernel of ``name``, run ``code`` in it by ``share``, remove it by ``end``."""
    import uuid  # not on a cached pass's path: it loads platform

    if _stopping:
        return {"outcome": "timeout", "stage": "start"}
    kid = str(uuid.uuid4())
    seen: dict[int, int] = {}
    box: list[dict[str, Any]] = []
    rec = _note(ctx.state, srv, kid, seen)
    started, scan = time.monotonic(), scanner(kid)
    # Looked for from the start: a kernel that fails an import can be gone before the answer.
    _beside(lambda: box.append(rest(srv, "POST", "api/kernels", share, {"name": name, "kernel_id": kid})),
            scan, seen, float("inf"))
    got = box[0]
    doc = got["doc"] if isinstance(got.get("doc"), dict) else {}
    out: dict[str, Any] = {}
    given = doc.get("id") if got.get("status") in (200, 201) else None
    if isinstance(given, str) and re.fullmatch(KERNEL_ID, given):
        if given != kid:  # a server that does not take the id asked for answers its own
            _forget(ctx.state, kid)
            kid, scan = given, scanner(given)
        rec = _note(ctx.state, srv, kid, seen, answered=True)
    elif got["outcome"] == "response":  # refused: nothing was started
        _forget(ctx.state, kid)
        said = [doc[k] for k in ("message", "reason") if isinstance(doc.get(k), str) and doc[k].strip()]
        why = first_cause(said[0]) if said else f"HTTP {got['status']}"
        return {"outcome": "start-failed", "why": why, "interpreter": interpreter_problem(spec, srv)}
    elif got["outcome"] == "timeout":  # no answer: the server may still start it under our id
        out = {"outcome": "timeout", "stage": "start"}
    else:
        out = {"outcome": "start-failed", "why": got["outcome"],
               "interpreter": interpreter_problem(spec, srv)}
    try:
        if not out:
            import websocket  # websocket-client, the jupyter extra: only when a kernel is checked

            ws = websocket.WebSocket(enable_multithread=True, skip_utf8_validation=True)
            cell = {"stage": "connect", "stdout": "", "error": None, "replied": False, "idle": False,
                    "died": None, "failed": None}
            thread, died = _beside(lambda: _cell(ws, srv, kid, code, share, cell), scan, seen, share,
                                   srv, kid)
            if thread.is_alive():  # end its blocked call from here
                for stop in (ws.abort, lambda: ws.close(timeout=0.2)):
                    with contextlib.suppress(Exception):  # a connection that may never have opened
                        stop()
                thread.join(0.5)
            out = {"stage": cell["stage"]}
            if cell["stage"] == "done":
                out.update(outcome="reply", stdout=cell["stdout"], error=cell["error"],
                           observed=round(time.monotonic() - started, 3))
            elif died or cell["died"] or (cell["failed"] and seen and not live(seen)):
                out.update(outcome="died", **replay(ctx, spec, srv, min(share, time.monotonic() + 5.0)))
            elif cell["failed"] and cell["failed"] != "timeout" and time.monotonic() < share:
                out.update(outcome="channels-failed", why=cell["failed"])
            else:
                out["outcome"] = "timeout"
    finally:
        out["kernel_id"] = kid
        out["cleanup"] = remove(ctx.state, srv, kid, rec, seen, end)
        out["lingered"] = bool(out["cleanup"]["left"])  # deep.record keeps no result of such a run
    return out


def remove(state: State, srv: Server, kid: str, rec: dict[str, Any], seen: dict[int, int], end: float,
           wait: float = 2.0) -> dict[str, Any]:
    """DELETE the kernel; end its processes if the server has not within ``wait`` seconds (docs/probes.md).
    A 404 confirms only a start it answered (one still starting is not listed), or a 5-minute-old record."""
    def gone(got: dict[str, Any]) -> bool:
        status = got.get("status")
        return status in (200, 204) or (status == 404 and (rec.get("answered") is True
                                                           or time.time() - rec["time"] > 300))

    def tree() -> dict[int, int]:
        procs = pidstat.table(alive=True)
        roots = {pid for pid, start in left.items() if pid in procs and procs[pid].start == start}
        known.update({pid: procs[pid].start for pid in pidstat.below(procs, roots) - {os.getpid()}})
        return live(known)

    out: dict[str, Any] = {"deleted": False, "ended": 0, "left": 0}
    known: dict[int, int] = {}
    try:
        out["deleted"] = gone(rest(srv, "DELETE", f"api/kernels/{kid}", min(end, time.monotonic() + wait)))
        settle = min(end, time.monotonic() + (1.0 if out["deleted"] else 0.0))  # shut down, it may be exiting
        if left := live(scanner(kid)() | live(seen), settle):
            out["ended"], stop = len(left), max(end, time.monotonic() + 0.2)
            for pid, start in tree().items():
                pidstat.signal_same(pid, start, signal.SIGTERM)
            until = min(stop, time.monotonic() + 0.5)
            while time.monotonic() < until and tree():
                time.sleep(0.02)
            for pid, start in (killed := tree()).items():
                pidstat.signal_same(pid, start, signal.SIGKILL)
            out["left"] = len(live(killed, max(min(stop, time.monotonic() + 0.5), time.monotonic() + 0.05)))
        if not out["deleted"]:  # our DELETE timed out: with the processes gone, ask again
            out["deleted"] = gone(rest(srv, "DELETE", f"api/kernels/{kid}", max(end, time.monotonic() + 0.3)))
        if out["deleted"]:
            _forget(state, kid)
        out["recorded"] = state.enabled and not out["deleted"]  # for the next run to remove
    except Exception:
        logger().exception("removing kernel %s failed", kid)
    finally:
        _live.pop(kid, None)
    return out


def _note(state: State, srv: Server, kid: str, seen: dict[int, int], answered: bool = False
          ) -> dict[str, Any]:
    rec = {"server": [srv.host, srv.port, srv.base_url], "time": time.time(), "pid": os.getpid(),
           "start": getattr(pidstat.stat(os.getpid()), "start", None), "answered": answered}
    state.write_json(f"{RECORD}{kid}.json", rec)
    _live[kid] = (srv, state, rec, seen)
    return rec


def _forget(state: State, kid: str) -> None:
    state.remove(f"{RECORD}{kid}.json")
    _live.pop(kid, None)


def reap(state: State, srv: Server, deadline: float) -> None:
    """Remove the kernels that ended runs left on ``srv``, and this process's own that no run of it uses
    (``serve`` lives on). Another server's wait: its token is not ours."""
    if not state.enabled or state.path is None:
        return
    try:
        names = sorted(n for n in os.listdir(state.path) if n.startswith(RECORD) and n.endswith(".json"))
    except OSError:
        return
    for name in names[:64]:  # a run looks at so many records at most
        kid, rec = name[len(RECORD):-len(".json")], state.read_json(name)
        if rec is None or not re.fullmatch(KERNEL_ID, kid) or not isinstance(rec.get("time"), (int, float)):
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
    """The line that names why the kernel exits (``said``; None: it did not), from its command run
    again as the server's verified uid, never as root for another's; else ``unread``, why not."""
    from probes import proc

    me = os.geteuid()
    if srv.uid is None:
        return {"unread": "the server's user is not known"}
    if srv.uid != me and me != 0:
        return {"unread": f"the suite may not run as the server's user (uid {srv.uid})"}
    if (work := ctx.state.scratch("kernel")) is None:
        return {"unread": "no state dir holds its connection file"}
    import pwd

    try:
        entry = pwd.getpwuid(srv.uid)
    except KeyError:
        entry = None
    user = None if srv.uid == me else (srv.uid, entry.pw_gid if entry else srv.uid)
    if (env := _server_env(srv)) is None:  # ours, with the server's user's name and home (its ~/.local)
        env = dict(os.environ)
        if entry is not None and srv.uid != me:
            env.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name)
    env.update(spec["env"])
    try:
        with contextlib.ExitStack() as stack:  # free ports for the connection file, closed before it runs
            socks = {f"{kind}_port": stack.enter_context(socket.create_server(("127.0.0.1", 0)))
                     for kind in ("shell", "iopub", "stdin", "control", "hb")}
            ports = {name: int(sock.getsockname()[1]) for name, sock in socks.items()}
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(fd := os.open(os.path.join(work, "kernel.json"), flags, 0o600), "w") as fh:
            if user is not None:
                os.fchown(fd, *user)
                os.chown(work, *user)
            json.dump({"transport": "tcp", "ip": "127.0.0.1", "signature_scheme": "hmac-sha256",
                       "key": os.urandom(16).hex(), **ports}, fh)
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
    return {"said": first_cause((done.stderr + b"\n" + done.stdout).decode("utf-8", "replace")) or None}


def interpreter_problem(spec: dict[str, Any], srv: Server) -> str | None:
    """What is wrong with the program a kernelspec names (a server often answers "Unhandled error")."""
    import shutil

    program = spec["argv"][0] if spec["argv"] else ""
    if not program:
        return "its argv is empty"
    if shutil.which(program, path=(_server_env(srv) or os.environ).get("PATH") or os.defpath):
        return None
    return f"its argv names {untrusted.clean(program, 80)}: gone, not executable or not on the server's PATH"


def _server_env(srv: Server) -> dict[str, str] | None:
    """The server's environment (its kernels inherit it), when we may read it."""
    try:
        with open(f"/proc/{srv.pid}/environ", "rb") as fh:
            pairs = [item.partition(b"=") for item in fh.read(256 * 1024).split(b"\0")]
    except OSError:  # no pid (no trusted runtime file), or not ours to read
        return None
    env = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, sep, v in pairs if sep and k}
    return env or None
