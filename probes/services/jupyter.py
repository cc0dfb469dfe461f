"""jupyter: Jupyter Server answers its unauthenticated ``GET {base_url}api`` with its version.

That endpoint needs no token and does not reset the server's idle timers; an open port is not
enough (the kernel completes the TCP handshake for a hung server). Where the server is, and which
runtime files are trusted: docs/probes.md, "What is trusted in the runtime directory". The request
goes through the strict client of ``_http``. Command line: ``curl --noproxy '*' -ksS --max-time 3
http://127.0.0.1:8888/api``.
"""

from __future__ import annotations

import _socket  # not socket: see probes/services/_net.py
import os
import time

from probes import services, untrusted
from probes.config import Config
from probes.context import Context
from probes.result import Result, passed, verdict
from probes.services import _net
from probes.services._http import MAX_REPLY, _speaks_tls, exchange
from probes.spec import Cause

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SPEC = services.JUPYTER_SPEC
NAME = SPEC.name

WILDCARD_HOSTS = ("", "0.0.0.0", "::", "*")  # noqa: S104  (addresses to listen on, not to connect to)
PATH_CHARS = frozenset("-._~/!$&'()*+,;=:@%0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


# ---------------------------------------------------------------- where the server is
#
# The runtime directory usually belongs to the notebook user while the probe may run as root:
# every jpserver-*.json in it is untrusted, used only when _read_runtime_file finds nothing to
# refuse (the rules and why: docs/probes.md). No psutil here: this runs on every liveness probe.

MAX_RUNTIME_FILE = 64 * 1024
MAX_BASE_URL = 256  # characters; Jupyter's are a few dozen
MAX_DIR_ENTRIES = 4096  # entries of the runtime directory looked at: a flooded directory cannot stall us
MAX_CANDIDATES = 16  # jpserver-*.json files examined
MAX_NAME = 64  # characters of a file name shown in messages and facts
SHOWN_REFUSED = 5  # refused files named in the facts
LOOPBACK_NAMES = ("localhost",)
MAX_TOKEN = 512
TOKEN_CHARS = frozenset("-._~+/=0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def runtime_dir(config: Config, environ: Any = None) -> str:
    env = os.environ if environ is None else environ
    given = config.of(services.JupyterSettings).jupyter_runtime_dir
    if given:
        return given
    if env.get("JUPYTER_RUNTIME_DIR"):
        return str(env["JUPYTER_RUNTIME_DIR"])
    data = env.get("JUPYTER_DATA_DIR") or os.path.join(
        env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share"), "jupyter")
    return os.path.join(data, "runtime")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is "localhost" or a loopback address literal (127/8, ::1, ::ffff:127/104)."""
    name = host.strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return _socket.inet_pton(_socket.AF_INET, name)[0] == 127
    except (OSError, ValueError):
        pass
    try:
        packed = _socket.inet_pton(_socket.AF_INET6, name)
    except (OSError, ValueError):
        return False
    return packed == bytes(15) + b"\x01" or (packed[:12] == bytes(10) + b"\xff\xff" and packed[12] == 127)


def _connect_host(hostname: str, config: Config) -> str | None:
    """Where to connect for a runtime file's hostname, or None if the configuration does not allow it."""
    if hostname in WILDCARD_HOSTS:
        return config.host
    name = hostname.strip("[]")
    if is_loopback(name) or name.lower() == config.host.strip("[]").lower():
        return name
    return None


# /proc/net/tcp and tcp6 list every socket of this network namespace with the uid that owns it,
# and anyone may read them: unlike /proc/<pid>/fd, they need no CAP_SYS_PTRACE, which root lacks
# in Docker's default set and in the image's. The kernel lists its listening sockets first, so
# reading stops at the first other line: a busy host's thousands of connections are not read.
def listeners() -> dict[int, set[int]]:
    """The uids owning TCP sockets in LISTEN state, by port (IPv4 and IPv6)."""
    by_port: dict[int, set[int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, "rb") as f:
                next(f, None)  # the header
                for line in f:
                    # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
                    fields = line.split()
                    if len(fields) < 8 or fields[3] != b"0A":  # 0A: LISTEN
                        break
                    by_port.setdefault(int(fields[1].rpartition(b":")[2], 16), set()).add(int(fields[7]))
        except (OSError, ValueError):
            continue
    return by_port


def held_by(port: int, held: set[int], owner: int, whose: str) -> str:
    """Why ``port`` is not ``owner``'s server: "port 8888 is held by uid 4242, not uid 1000 who owns
    the token file"; "" when ``owner`` alone listens there."""
    if held == {owner}:
        return ""
    if not held:
        return f"nothing here listens on port {port}, so whose server answers cannot be told"
    uids = ("uids " if len(held) > 1 else "uid ") + ", ".join(str(u) for u in sorted(held))
    alone = " alone," if owner in held else ""
    return f"port {port} is held by {uids}, not uid {owner}{alone} who owns {whose}"


def _proc_uid(pid: int) -> int | None:
    """The real uid of a live process (from /proc/<pid>/status, which anyone may read), or None."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f.read(8192).splitlines():
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read_runtime_file(name: str, dir_fd: int, config: Config, ports: dict[int, set[int]],
                       secret: bool = False) -> dict[str, Any]:
    """The fields we use from one jpserver-*.json file (its token only when ``secret``, for
    jupyter-kernel); ``Refused`` says why not."""
    raw, st = untrusted.read_regular(name, MAX_RUNTIME_FILE, dir_fd=dir_fd)
    if st.st_nlink != 1:
        raise untrusted.Refused("a hard link")
    try:
        doc = untrusted.load_json(raw)
    except ValueError as exc:
        # Fixed words only: a parser's message could quote the file (and its token).
        reason = "nested too deeply" if str(exc) == "nested too deeply" else "not valid JSON"
        raise untrusted.Refused(reason) from None
    del raw
    if not isinstance(doc, dict):
        raise untrusted.Refused("not a JSON object")
    port, pid, base_url = doc.get("port"), doc.get("pid"), doc.get("base_url", "/")
    if type(port) is not int or not 1 <= port <= 65535 or type(pid) is not int or pid <= 0:
        raise untrusted.Refused("no valid port and pid")
    if not isinstance(base_url, str) or len(base_url) > MAX_BASE_URL:
        raise untrusted.Refused("no valid base_url")
    hostname = doc.get("hostname")
    hostname = hostname if isinstance(hostname, str) else ""
    host = _connect_host(hostname, config)
    if host is None:
        raise untrusted.Refused("its hostname is neither loopback nor HEALTHCHECK_HOST")
    owner = st.st_uid
    trusted_owner = owner in (0, os.geteuid())
    own_port = config.of(services.JupyterSettings).jupyter_port
    if not trusted_owner and port != own_port:
        raise untrusted.Refused(f"owned by uid {owner} and names port {port}: a file of another "
                                f"user may only describe HEALTHCHECK_JUPYTER_PORT {own_port}")
    pid_uid = _proc_uid(pid)
    if pid_uid is None:
        raise untrusted.Refused(f"stale: its process {pid} is gone")
    if pid_uid != owner:
        raise untrusted.Refused(f"owned by uid {owner} but names a process of uid {pid_uid}")
    held = ports.get(port, set())
    if not held:
        raise untrusted.Refused(f"stale: nothing listens on port {port}")
    if held != {owner}:
        raise untrusted.Refused(held_by(port, held, owner, "the file"))
    return {
        "file": untrusted.clean(name, MAX_NAME),
        "port": port,
        "base_url": _normal_base_url(base_url),
        "secure": doc.get("secure") is True,
        "host": host,
        "owner": owner,
        "trusted_owner": trusted_owner,
        "mtime": st.st_mtime,
        **({"pid": pid, "token": token(doc.get("token"))} if secret else {}),
    }


def token(value: Any) -> str:
    """A runtime file's token if it can only be a token (it goes into a header line), else ""."""
    ok = isinstance(value, str) and 0 < len(value) <= MAX_TOKEN and all(ch in TOKEN_CHARS for ch in value)
    return value if ok else ""


def token_file(path: str | None) -> tuple[str, int | None]:
    """The token in HEALTHCHECK_JUPYTER_TOKEN_FILE (one line; a regular file of at most 4 KiB,
    never through a link, never blocking) or "", and the file's owner from the same fstat (None
    when there is no file we can read): the server should be that user's."""
    if not path:
        return "", None
    try:
        raw, st = untrusted.read_regular(path, 4096)
    except untrusted.Refused:
        return "", None
    return token(raw.decode("ascii", "replace").strip()), st.st_uid


def _candidate_names(dir_fd: int) -> list[str]:
    names: list[str] = []
    with os.scandir(dir_fd) as entries:
        for i, entry in enumerate(entries):
            if i >= MAX_DIR_ENTRIES or len(names) >= MAX_CANDIDATES:
                break
            if entry.name.startswith("jpserver-") and entry.name.endswith(".json"):
                names.append(entry.name)
    return sorted(names)


def find_runtime_file(config: Config, environ: Any = None, secret: bool = False
                      ) -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
    """The trusted runtime file of the server to probe (the configured port first, then root's
    or our own, then the newest), and the refused files as (cleaned name, reason). With
    ``secret`` it carries the server's pid and token (jupyter-kernel's; never shown)."""
    try:
        dir_fd = os.open(runtime_dir(config, environ),
                         os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None, []
    found: list[dict[str, Any]] = []
    refused: list[tuple[str, str]] = []
    try:
        names = _candidate_names(dir_fd)
        ports = listeners() if names else {}
        for name in names:
            try:
                found.append(_read_runtime_file(name, dir_fd, config, ports, secret))
            except untrusted.Refused as exc:
                refused.append((untrusted.clean(name, MAX_NAME), str(exc)))
    except OSError:
        pass
    finally:
        os.close(dir_fd)
    if not found:
        return None, refused
    port = config.of(services.JupyterSettings).jupyter_port
    best = max(found, key=lambda f: (f["port"] == port, f["trusted_owner"], f["mtime"]))
    return best, refused


def _normal_base_url(raw: str) -> str:
    path = raw if raw.startswith("/") else "/" + raw
    return path if path.endswith("/") else path + "/"


def quote_path(path: str, safe: frozenset[str] = PATH_CHARS) -> str:
    """``path`` with anything outside ``safe`` percent-encoded."""
    return "".join(ch if ch in safe else "".join(f"%{b:02X}" for b in ch.encode("utf-8")) for ch in path)


def _request_path(base_url: str) -> str:
    return quote_path(base_url + "api")


# ---------------------------------------------------------------- probe

def gather(ctx: Context) -> dict[str, Any]:
    cfg = ctx.config
    deadline = ctx.deadline
    t0 = time.monotonic()
    found, refused = find_runtime_file(cfg)
    impostor = ""
    if found is not None:
        target = {"source": found["file"], "host": found["host"], "port": found["port"],
                  "base_url": found["base_url"], "secure": found["secure"]}
    else:
        own = cfg.of(services.JupyterSettings)
        target = {"source": None, "host": cfg.host, "port": own.jupyter_port,
                  "base_url": own.jupyter_base_url, "secure": bool(own.jupyter_tls)}
        # Whose server it should be: the token file's owner. Another uid's listener is a stand-in
        # (Jupyter down, its port taken), and is sent nothing.
        _, owner = token_file(own.jupyter_token_file)
        held = listeners().get(own.jupyter_port, set()) if owner is not None else set()
        if held and owner is not None:
            impostor = held_by(own.jupyter_port, held, owner, "the token file")
    path = _request_path(target["base_url"])
    data: dict[str, Any] = {**target, "path": path, "budget": max(0.0, deadline - t0), "refused": refused}
    if impostor:
        return {**data, "outcome": "impostor", "impostor": impostor}
    data.update(exchange(target["host"], target["port"], path, target["secure"], deadline))
    outcome = data["outcome"]
    if not target["secure"] and (outcome == "tls-reply" or (outcome == "closed" and not data["received"])):
        if outcome == "tls-reply" or _speaks_tls(target["host"], target["port"], deadline):
            data.update(outcome="tls-mismatch", server_tls=True)
    elif target["secure"] and outcome in ("tls-failed", "tls-timeout"):
        plain = exchange(target["host"], target["port"], path, False, deadline)
        if plain["outcome"] == "response":
            data.update(outcome="tls-mismatch", server_tls=False)
        elif outcome == "tls-timeout" and plain["outcome"] == "timeout":
            data.update(plain)  # silent whatever we speak: hung
    if data["outcome"] == "refused":
        data["listening"] = _net.listening(target["port"])
    return data


# ---------------------------------------------------------------- judge: an outcome table
#
# gather's outcome, refined by what came with it, names one row: the cause and what was seen, a
# str.format template over the fields of _fields (plus the version and time of a pass). The
# message is that detail and the cause's remedy (probes.result.verdict).

LOGIN_STATUSES = (401, 407)
NOT_200 = "not Jupyter: {where} answered {get} with HTTP {status}{src}"
SPOKE_PLAIN = "TLS mismatch: {where} speaks HTTPS but the probe spoke plain HTTP"
SPEAKS_PLAIN = "TLS mismatch: {where} speaks plain HTTP"
CLOSED = "not Jupyter: {where} closed the connection "
OUTCOMES: dict[str, tuple[Cause | None, str]] = {
    "ok": (None, "Jupyter Server {version} answered {get} at {scheme}://{where} in {ms:.0f} ms"),
    "http-5xx": (services.JUPYTER_HTTP_ERROR, "Jupyter at {where} answered {get} with HTTP {status}"),
    "http-404": (services.NOT_JUPYTER, NOT_200 + ": wrong base URL? the server has no {path}"),
    "http-403": (services.NOT_JUPYTER, NOT_200 + ": Jupyter refuses requests for a Host it does not trust"),
    "http-login": (services.NOT_JUPYTER, NOT_200 + ": a proxy or login page answers instead of Jupyter"),
    "http-other": (services.NOT_JUPYTER, NOT_200 + ": another web server holds the port"),
    "no-version": (services.NOT_JUPYTER, "not Jupyter: {where} answered {get} with HTTP 200 ({ctype}) "
                                         "but no JSON version: another web server holds the port"),
    "impostor": (services.JUPYTER_IMPOSTOR, "{impostor} (nothing was sent)"),
    "refused": (services.JUPYTER_REFUSED, "nothing listening on {where} (connection refused{listening})"),
    "connect-timeout": (services.CONNECT_TIMEOUT, "connection to {where} not accepted within {budget:.1f}s"),
    "resolve": (services.UNREACHABLE, "cannot resolve host {host!r}{src}"),
    "unreachable": (services.UNREACHABLE, "cannot reach {where}{detail}"),
    "hung": (services.JUPYTER_HUNG, "hung: {where} accepted the connection but did not answer {get} "
                                    "within {budget:.1f}s"),
    "partial": (services.JUPYTER_DEADLINE, "answer from {where} incomplete at the deadline "
                                           "({received} bytes in {budget:.1f}s)"),
    "tls-expected-by-file": (services.JUPYTER_TLS_MISMATCH, SPOKE_PLAIN + " ({source} says http)"),
    "tls-expected": (services.JUPYTER_TLS_MISMATCH, SPOKE_PLAIN),
    "plain-by-file": (services.JUPYTER_TLS_MISMATCH, SPEAKS_PLAIN + " but {source} says https"),
    "plain": (services.JUPYTER_TLS_MISMATCH, SPEAKS_PLAIN + " but HEALTHCHECK_JUPYTER_TLS is true"),
    "tls-verify": (services.JUPYTER_TLS_ERROR, "the TLS certificate of {where} is not trusted"),
    "tls-failed": (services.JUPYTER_TLS_ERROR, "TLS handshake with {where}{src} failed"),
    "too-large": (services.NOT_JUPYTER, "not Jupyter: {where} answered {get} with a reply too large "
                                        "({why}; {max_kib} KiB in all at most)"),
    "bad-http": (services.NOT_JUPYTER, "not Jupyter: {where} does not answer HTTP ({excerpt})"),
    "closed-mid-answer": (services.NOT_JUPYTER, CLOSED + "mid-answer to {get}"),
    "closed": (services.NOT_JUPYTER, CLOSED + "without answering {get}"),
}
# gather's outcomes that name their row as they are.
AS_GATHERED = ("impostor", "refused", "connect-timeout", "resolve", "unreachable", "tls-verify", "too-large",
               "bad-http")


def _response(data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The row of an HTTP answer, and for a pass the version and time."""
    status = int(data["status"])
    if 500 <= status < 600:
        return "http-5xx", {}
    if status != 200:
        if status in (404, 403):
            return f"http-{status}", {}
        return ("http-login" if status in LOGIN_STATUSES or 300 <= status < 400 else "http-other"), {}
    try:
        doc = untrusted.load_json(data["body"])
    except ValueError:
        doc = None
    version = doc.get("version") if isinstance(doc, dict) else None
    if not isinstance(version, str) or not version:
        return "no-version", {}
    version = "".join(ch for ch in version if ch.isalnum() or ch in ".+-_")[:32]
    return "ok", {"version": version, "ms": round(float(data["elapsed"]) * 1000, 1)}


def outcome(data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The OUTCOMES row for what gather found, and fields only that row needs."""
    found = data["outcome"]
    if found == "response":
        return _response(data)
    if found in AS_GATHERED:
        return found, {}
    if found == "timeout":
        return ("partial" if data.get("received") else "hung"), {}
    if found == "tls-mismatch":
        row = "tls-expected" if data["server_tls"] else "plain"
        return (f"{row}-by-file" if data["source"] else row), {}
    if found in ("tls-failed", "tls-timeout"):
        return "tls-failed", {}
    return ("closed-mid-answer" if data.get("received") else "closed"), {}


def _fields(data: dict[str, Any]) -> dict[str, Any]:
    """What the message templates may name, every outside text cleaned."""
    source, listening = data["source"], data.get("listening")
    return {
        "where": _net.host_header(data["host"], data["port"]),
        "host": data["host"],
        "scheme": "https" if data["secure"] else "http",
        "source": source,
        "src": f" (from {source})" if source else "",
        "path": data["path"],
        "get": f"GET {untrusted.clean(data['path'], 120)}",
        "budget": float(data["budget"]),
        "status": data.get("status"),
        "ctype": untrusted.clean(data.get("content_type") or "", 40) or "no type",
        "received": data.get("received"),
        "detail": f" ({data['detail']})" if data.get("detail") else "",
        "listening": (f"; listening here: {', '.join(listening)}" if listening
                      else "; no TCP port is listening here" if listening == [] else ""),
        "why": data.get("why"),
        "impostor": data.get("impostor"),
        "excerpt": data.get("excerpt"),
        "max_kib": MAX_REPLY // 1024,
    }


def judge(data: dict[str, Any], ctx: Context) -> Result:
    row, extra = outcome(data)
    found, detail = OUTCOMES[row]
    fields = {**_fields(data), **extra}
    refused = data.get("refused") or []
    facts = {"port": data["port"], "base_url": untrusted.clean(data["base_url"]), "secure": data["secure"],
             "runtime_file": data["source"], "runtime_files_refused": dict(refused[:SHOWN_REFUSED])}
    message = detail.format(**fields)
    if found is None:
        return passed(NAME, message, observed=fields["ms"], unit="ms",
                      facts={**facts, "version": fields["version"]})
    result = verdict(NAME, found, message, facts=facts)
    if refused:  # name one file the probe did not use, and why (never its content)
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        name, why = refused[0]
        result = result._replace(message=f"{result.message}; not used: {name}: {why}{more}")
    return result


def on_deadline(ctx: Context) -> Result:
    where = _net.host_header(ctx.config.host, ctx.config.of(services.JupyterSettings).jupyter_port)
    return verdict(NAME, services.JUPYTER_DEADLINE, f"no answer from Jupyter at {where} before the deadline")
