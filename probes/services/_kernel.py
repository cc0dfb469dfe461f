"""jupyter-kernel's client: the kernel REST API, one cell over the kernel's channels, and the
kernel's processes (docs/probes.md, "The notebook path").

REST goes through ``_http.exchange`` with the token in an ``Authorization: token`` header and
``no_track_activity=1`` (the check is not the user's activity: docs/probes.md says why). The
cell goes over the websocket ``{base_url}api/kernels/<id>/channels`` (Jupyter messaging protocol
v5, JSON text frames): ``execute_request`` on shell, then the iopub messages and the shell
``execute_reply`` whose ``parent_header.msg_id`` is ours. Imported only when the probe runs:
websocket-client costs its import here (docs/development.md, "Start-up policy").
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

from probes import untrusted
from probes.pidstat import DEAD, below, signal_same, stat, table
from probes.record import Record
from probes.services import _net, jupyter
from probes.services._http import exchange

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

PATH_CHARS = jupyter.PATH_CHARS - {"%"}
MAX_OUTPUT = 64 * 1024  # characters of the cell's stdout kept
MAX_FRAME = 1024 * 1024  # a message larger than this is not ours to read
POLL = 0.02  # seconds between looks at the kernel's processes: one that fails an import lives ~40 ms
TERM_GRACE = 0.5  # a kernel gets this long to exit on SIGTERM before it is killed
UNTRACKED = "no_track_activity=1"  # Jupyter Server leaves its last_activity alone for such a request


class Server(Record):
    """Where the server is and how to speak to it; ``token`` is never shown."""

    __slots__ = ("host", "port", "base_url", "secure", "token", "pid", "uid")

    host: str
    port: int
    base_url: str
    secure: bool
    token: str
    pid: int | None  # from a trusted runtime file
    uid: int | None  # whose listening socket answers on the port, when known

    def __init__(self, host: str, port: int, base_url: str, secure: bool, token: str,
                 pid: int | None, uid: int | None = None) -> None:
        self.host = host
        self.port = port
        self.base_url = base_url
        self.secure = secure
        self.token = token
        self.pid = pid
        self.uid = uid

    def path(self, tail: str) -> str:
        """``{base_url}{tail}``, anything outside the URL path characters percent-encoded."""
        return jupyter.quote_path(self.base_url + tail, PATH_CHARS)

    def headers(self) -> str:
        return f"Authorization: token {self.token}\r\n" if self.token else ""


def rest(server: Server, method: str, tail: str, deadline: float, body: Any = None) -> dict[str, Any]:
    """One REST call: gather's outcome (``_http.exchange``'s), with ``doc``, the JSON answer, when any."""
    raw = b"" if body is None else json.dumps(body).encode()
    got = exchange(server.host, server.port, f"{server.path(tail)}?{UNTRACKED}", server.secure, deadline,
                   method=method, headers=server.headers(), body=raw)
    if got["outcome"] == "response":
        try:
            got["doc"] = untrusted.load_json(got["body"]) if got["body"] else None
        except ValueError:
            got["doc"] = None
        del got["body"]
    return got


def server_reason(got: dict[str, Any]) -> str:
    """The reason a server gave in a JSON error answer (``message`` or ``reason``), cleaned and bounded."""
    doc = got.get("doc")
    if isinstance(doc, dict):
        for key in ("message", "reason"):
            if isinstance(doc.get(key), str) and doc[key].strip():
                return first_cause(doc[key], 200)
    return f"HTTP {got.get('status')}"


# An exception line: "ModuleNotFoundError: No module named 'x'" (a warning only when nothing else).
_RAISED = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Exit)\b:?")
_WARNED = re.compile(r"[A-Za-z_][\w.]*Warning\b:?")
_FRAME = re.compile(r'File "([^"]+)", line \d+')
# Words Python adds that name nothing: dropped before a long line is cut, so its names stay.
_FILLER = re.compile(r" \(most likely due to a circular import\)"
                     r"|(?<=') (?:if|since) it has the same name as [^)]*")


def first_cause(text: str, limit: int = 200) -> str:
    """The line of a process's output that names the cause: its last exception line
    ("ModuleNotFoundError: No module named 'x'"), else its last line. A line that names no file
    gets the file of the traceback's last frame (a local ``random.py`` that shadows the standard
    library's); a long one loses Python's filler words first, then its middle, never the names
    at its ends (the module, the library's path)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    picked = [i for i, ln in enumerate(lines) if _RAISED.match(ln)] or \
        [i for i, ln in enumerate(lines) if _WARNED.match(ln)]
    at = picked[-1] if picked else len(lines) - 1
    if at < 0:
        return ""
    line = lines[at]
    frames = [m.group(1) for m in map(_FRAME.match, lines[:at]) if m and not m.group(1).startswith("<")]
    if frames and "/" not in line:
        line += f" (in {frames[-1]})"
    line = untrusted.clean(line, 4 * limit)
    if len(line) > limit:
        line = _FILLER.sub("", line)
    if len(line) > limit:
        half = (limit - 5) // 2
        line = f"{line[:half]} ... {line[-half:]}"
    return line


# ---------------------------------------------------------------- the kernel's processes

class Procs:
    """The kernel's live processes, ``{pid: start}``: those whose command line names its connection
    file ``kernel-<id>.json`` (the kernel, a wrapper around it). A process older than a second
    that is another's is not read again (a younger one may not have exec'd yet): a look costs
    little more than a listing of /proc, often enough to see a kernel that dies at start."""

    def __init__(self, kernel_id: str) -> None:
        self.mark = f"kernel-{kernel_id}.json".encode()
        self.others: set[int] = set()
        self.tick = os.sysconf("SC_CLK_TCK")

    def scan(self) -> dict[int, int]:
        found: dict[int, int] = {}
        try:
            entries = os.listdir("/proc")
        except OSError:
            return found
        settled = (time.clock_gettime(time.CLOCK_BOOTTIME) - 1.0) * self.tick  # start times count from boot
        for entry in entries:
            if not entry.isdigit() or int(entry) in self.others:
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    line = fh.read(65536)
            except OSError:
                continue
            st = stat(int(entry))
            if st is None or st.state in DEAD:
                continue
            if self.mark in line:
                found[int(entry)] = st.start
            elif st.start < settled:
                self.others.add(int(entry))
        return found


def live(pairs: Mapping[int, int]) -> dict[int, int]:
    """Those of ``pairs`` (pid -> start) that are still the process seen, and alive."""
    out = {}
    for pid, start in pairs.items():
        st = stat(pid)
        if st is not None and st.start == start and st.state not in DEAD:
            out[pid] = start
    return out


def end(pairs: Mapping[int, int], deadline: float) -> dict[int, int]:
    """End the kernel's processes (pid -> start) and everything below them in the parent tree,
    each only while its pid still names the process seen: SIGTERM, TERM_GRACE seconds (within
    ``deadline``), then SIGKILL. Returns what is still alive (none, unless we may not signal it
    or it is stuck in the kernel)."""
    known: dict[int, int] = {}

    def tree() -> dict[int, int]:
        procs = table(alive=True)
        roots = {pid for pid, start in pairs.items() if pid in procs and procs[pid].start == start}
        known.update({pid: procs[pid].start for pid in below(procs, roots) - {os.getpid()}})
        return live(known)

    for pid, start in tree().items():
        signal_same(pid, start, signal.SIGTERM)
    until = min(deadline, time.monotonic() + TERM_GRACE)
    while time.monotonic() < until and tree():
        time.sleep(0.02)
    left = tree()
    for pid, start in left.items():
        signal_same(pid, start, signal.SIGKILL)
    until = max(min(deadline, time.monotonic() + 0.5), time.monotonic() + 0.05)
    while left and time.monotonic() < until:
        time.sleep(0.01)
        left = live(left)
    return left


# ---------------------------------------------------------------- one cell over the channels

def _message(session: str, code: str) -> tuple[str, str]:
    import uuid

    msg_id = uuid.uuid4().hex
    return msg_id, json.dumps({
        "header": {"msg_id": msg_id, "username": "healthcheck", "session": session, "date": "",
                   "msg_type": "execute_request", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True}})


class Channel:
    """The kernel's channels over one websocket, run in a thread while the caller watches the
    kernel's processes; ``box`` says what happened (``stage``, then ``stdout``, ``error``,
    ``reply``, or ``died``/``failed``), ``close()`` ends a blocked call from another thread."""

    def __init__(self, server: Server, kernel_id: str) -> None:
        import websocket  # websocket-client: ~15 ms, only when a kernel is checked

        self.ws = websocket.WebSocket(enable_multithread=True, skip_utf8_validation=True)
        self.url = (f"{'wss' if server.secure else 'ws'}://{_net.host_header(server.host, server.port)}"
                    f"{server.path(f'api/kernels/{kernel_id}/channels')}")
        self.server = server
        self.box: dict[str, Any] = {"stage": "connect", "stdout": "", "error": None, "reply": None,
                                    "idle": False, "died": None, "failed": None}

    def _options(self, deadline: float) -> dict[str, Any]:
        opts: dict[str, Any] = {"timeout": max(_net.remaining(deadline), _net.MIN_TIMEOUT),
                                "suppress_origin": True, "http_no_proxy": ["*"]}
        if self.server.token:
            opts["header"] = [f"Authorization: token {self.server.token}"]
        if self.server.secure and jupyter.is_loopback(self.server.host):
            import ssl  # Jupyter's certificate is usually self-signed; on loopback nobody sits between

            opts["sslopt"] = {"cert_reqs": ssl.CERT_NONE, "check_hostname": False}
        return opts

    def run(self, code: str, deadline: float) -> None:
        """Connect (the server answers once the kernel has replied to kernel_info), send the cell,
        read until its execute_reply and its idle status arrive; never raises."""
        box = self.box
        try:
            self.ws.connect(self.url, **self._options(deadline))
            box["stage"] = "execute"
            msg_id, text = _message(os.urandom(8).hex(), code)
            self.ws.send(text)
            while box["reply"] is None or not box["idle"]:
                self.ws.settimeout(max(_net.remaining(deadline), _net.MIN_TIMEOUT))
                if _net.remaining(deadline) <= 0:
                    raise TimeoutError
                self._take(self.ws.recv(), msg_id)
                if box["died"]:
                    return
            box["stage"] = "done"
        except Exception as exc:  # websocket-client's errors, socket timeouts, a handshake refused
            if box["stage"] != "done":
                box["failed"] = _why(exc)

    def _take(self, frame: Any, msg_id: str) -> None:
        """One frame: keep what belongs to our request (and the server's word that the kernel died)."""
        if not isinstance(frame, str) or len(frame) > MAX_FRAME:
            return  # a binary frame carries buffers: none of ours
        try:
            msg = untrusted.load_json(frame.encode())
        except ValueError:
            return
        if not isinstance(msg, dict):
            return
        header, content, parent = (msg.get(k) for k in ("header", "content", "parent_header"))
        kind = header.get("msg_type") if isinstance(header, dict) else None
        content = content if isinstance(content, dict) else {}
        parent = parent if isinstance(parent, dict) else {}
        box = self.box
        if kind == "status" and content.get("execution_state") in ("dead", "restarting", "autorestarting"):
            box["died"] = "the server reported the kernel " + str(content.get("execution_state"))
            return
        if parent.get("msg_id") != msg_id:
            return
        if kind == "stream" and content.get("name") == "stdout" and isinstance(content.get("text"), str):
            box["stdout"] = (box["stdout"] + content["text"])[:MAX_OUTPUT]
        elif kind == "error":
            box["error"] = {"ename": untrusted.clean(content.get("ename", "?"), 60),
                            "evalue": untrusted.clean(content.get("evalue", ""), 160)}
        elif kind == "status" and content.get("execution_state") == "idle":
            box["idle"] = True
        elif kind == "execute_reply":
            box["reply"] = untrusted.clean(content.get("status", "?"), 20)

    def close(self) -> None:
        try:
            self.ws.abort()
        except Exception:  # noqa: S110 - ending a connection that may never have opened
            pass
        try:
            self.ws.close(timeout=0.2)
        except Exception:  # noqa: S110
            pass


def _why(exc: BaseException) -> str:
    """A failed connection in fixed words (an exception's text could quote a header or a URL)."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return f"the server refused the channels with HTTP {status}"
    if isinstance(exc, TimeoutError) or type(exc).__name__ in ("WebSocketTimeoutException", "timeout"):
        return "timeout"
    if type(exc).__name__ == "WebSocketConnectionClosedException":
        return "the server closed the channels"
    return f"the channels failed ({type(exc).__name__})"
