"""jupyter: Jupyter Server answers ``GET {base_url}api`` with its version, not only an open port
(docs/probes.md, "What is trusted in the runtime directory"). Command line:
``curl --noproxy '*' -ksS --max-time 3 http://127.0.0.1:8888/api``."""

from __future__ import annotations

import json  # noqa: F401  (each pass parses JSON, through untrusted.load_json)
import os
import time

from probes import spec, untrusted
from probes.config import Config
from probes.context import Context
from probes.result import Result, passed, verdict
from probes.services import net
from probes.services.common import CONNECT_TIMEOUT, UNREACHABLE, host_header, json_or_none
from probes.spec import ABSOLUTE_PATH, ALL_PROFILES, BOOL, PORT, TEXT, URL_PATH, Cause, cause, setting

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class JupyterSettings(spec.Declared):
    jupyter_port: int = setting("HEALTHCHECK_JUPYTER_PORT", PORT, 8888, "Jupyter Server port")
    jupyter_base_url: str = setting("HEALTHCHECK_JUPYTER_BASE_URL", URL_PATH, "/",
                                    "Jupyter base URL, when no trusted runtime file says otherwise")
    jupyter_tls: bool = setting("HEALTHCHECK_JUPYTER_TLS", BOOL, False,
                                "Jupyter serves HTTPS, when no trusted runtime file says otherwise")
    jupyter_runtime_dir: str | None = setting(
        "HEALTHCHECK_JUPYTER_RUNTIME_DIR", TEXT, None,
        "where `jpserver-*.json` files are looked for (see \"What is trusted in the runtime directory\")",
        shown_default="`$JUPYTER_RUNTIME_DIR`, else `~/.local/share/jupyter/runtime`")
    jupyter_token_file: str | None = setting(
        "HEALTHCHECK_JUPYTER_TOKEN_FILE", ABSOLUTE_PATH, None, "a file holding the server's token, for when "
        "no trusted runtime file gives it; its owner is whose server the port must be (see \"What is trusted "
        "in the runtime directory\"), and `jupyter-kernel` sends the token only to that user's listener",
        shown_default="none")


JUPYTER_REFUSED = cause(
    "refused", "nothing listening (the message lists what is, and names a refused runtime file and why)",
    "start Jupyter or set `HEALTHCHECK_JUPYTER_PORT` to its port; remove stale `jpserver-*.json`",
    action="restart-app", actor="tenant")
JUPYTER_STUCK = "Jupyter is hung or overloaded: restart it and check its log"
JUPYTER_HUNG = cause("hung", "accepted but no answer to `GET {base_url}api` before the deadline",
                     JUPYTER_STUCK, action="restart-app", actor="tenant")
JUPYTER_DEADLINE = cause("deadline", "answer incomplete at the deadline", JUPYTER_STUCK,
                         action="restart-app", actor="tenant")
NOT_JUPYTER = cause(
    "not-jupyter", "answered, but not 200 with a JSON `version` (404 = wrong base URL, 403 = Host check, "
    "3xx/401 = proxy or login page), not HTTP at all, or a reply over 144 KiB or with more than 1024 chunks",
    "check `HEALTHCHECK_JUPYTER_PORT`, `HEALTHCHECK_JUPYTER_BASE_URL` (Jupyter's `ServerApp.base_url`) "
    "and the server's log; probe Jupyter itself via `127.0.0.1` (or set `ServerApp.allow_remote_access`)",
    action="fix-config", actor="tenant")
# Another uid's listener where the notebook user's server should be: a program of the tenant's
# container or pod (a host-network neighbour too) took the port, most often while Jupyter was down.
JUPYTER_IMPOSTOR = cause(
    "impostor", "the port is held by another uid than the owner of the token file "
    "(`HEALTHCHECK_JUPYTER_TOKEN_FILE`), Jupyter's user: a stand-in would answer for Jupyter, so nothing "
    "is sent to it", "stop what holds the port (`ss -ltne` shows its uid) and restart Jupyter, or set "
    "`HEALTHCHECK_JUPYTER_PORT` to Jupyter's; the token file must be Jupyter's user's",
    action="fix-config", actor="tenant")
JUPYTER_HTTP_ERROR = cause("http-error", "HTTP 5xx", "Jupyter is failing: see its log",
                           action="restart-app", actor="tenant")
JUPYTER_TLS_MISMATCH = cause(
    "tls-mismatch", "plain HTTP sent to a TLS server, or HTTPS to a plain one",
    "set `HEALTHCHECK_JUPYTER_TLS=true` for a server with `ServerApp.certfile`, `false` for one without, or "
    "point `HEALTHCHECK_JUPYTER_RUNTIME_DIR` at the server's runtime directory; remove stale "
    "`jpserver-*.json`", action="fix-config", actor="tenant")
JUPYTER_TLS_ERROR = cause(
    "tls-error", "TLS handshake failed, or certificate not trusted (off loopback)", "check "
    "`ServerApp.certfile` and `keyfile`, and that Jupyter holds the port; probe over loopback "
    "(`HEALTHCHECK_HOST=127.0.0.1`), where a self-signed certificate is accepted", action="fix-config",
    actor="tenant")

SPEC = spec.Spec(
    "jupyter", layer="services", module=__name__, toggle="ENABLE_JUPYTER_CHECK", timeout=3.0,
    profiles=ALL_PROFILES, measurement="responseTime",
    about="Jupyter Server answers `GET {base_url}api` with its version", settings=JupyterSettings.SETTINGS,
    causes=(JUPYTER_REFUSED, JUPYTER_IMPOSTOR, JUPYTER_HUNG, JUPYTER_DEADLINE, NOT_JUPYTER,
            JUPYTER_HTTP_ERROR, JUPYTER_TLS_MISMATCH, JUPYTER_TLS_ERROR, CONNECT_TIMEOUT, UNREACHABLE),
)
NAME = SPEC.name

WILDCARD_HOSTS = ("", "0.0.0.0", "::", "*")  # noqa: S104  (addresses to listen on, not to connect to)
PATH_CHARS = frozenset("-._~/!$&'()*+,;=:@%0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
TOKEN_CHARS = frozenset("-._~+/=0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
MAX_RUNTIME_FILE, MAX_BASE_URL, MAX_TOKEN = 64 * 1024, 256, 512  # bytes, characters, characters
MAX_DIR_ENTRIES, MAX_CANDIDATES = 4096, 16  # entries of the runtime directory read; jpserver-*.json examined
MAX_NAME, SHOWN_REFUSED = 64, 5  # characters of a file name shown; refused files named in the facts
SPOKE_TLS = ("response", "timeout", "too-large", "bad-http", "closed")  # exchange's, after a handshake


def held_by(port: int, held: set[int], owner: int, whose: str) -> str:
    """Why ``port`` is not ``owner``'s server ("" when ``owner`` alone listens there)."""
    if held == {owner}:
        return ""
    if not held:
        return f"nothing here listens on port {port}, so whose server answers cannot be told"
    uids = ("uids " if len(held) > 1 else "uid ") + ", ".join(str(u) for u in sorted(held))
    alone = " alone," if owner in held else ""
    return f"port {port} is held by {uids}, not uid {owner}{alone} who owns {whose}"


def _read_runtime_file(name: str, dir_fd: int, config: Config, ports: dict[int, set[int]],
                       secret: bool) -> dict[str, Any]:
    """The fields used of one trusted jpserver-*.json file (its pid and token too when ``secret``)."""
    raw, st = untrusted.read_regular(name, MAX_RUNTIME_FILE, dir_fd=dir_fd)
    if st.st_nlink != 1:
        raise untrusted.Refused("a hard link")
    try:
        doc = untrusted.load_json(raw)
    except ValueError as exc:  # in fixed words: a parser's message could quote the file (and its token)
        why = "nested too deeply" if str(exc) == "nested too deeply" else "not valid JSON"
        raise untrusted.Refused(why) from None
    if not isinstance(doc, dict):
        raise untrusted.Refused("not a JSON object")
    port, pid, base_url = doc.get("port"), doc.get("pid"), doc.get("base_url", "/")
    if type(port) is not int or not 1 <= port <= 65535 or type(pid) is not int or pid <= 0:
        raise untrusted.Refused("no valid port and pid")
    if not isinstance(base_url, str) or len(base_url) > MAX_BASE_URL:
        raise untrusted.Refused("no valid base_url")
    said = doc.get("hostname")
    host = said.strip("[]") if isinstance(said, str) and said not in WILDCARD_HOSTS else config.host
    if host != config.host and not net.is_loopback(host) and host.lower() != config.host.strip("[]").lower():
        raise untrusted.Refused("its hostname is neither loopback nor HEALTHCHECK_HOST")
    owner, own_port = st.st_uid, config.of(JupyterSettings).jupyter_port
    if owner not in (0, os.geteuid()) and port != own_port:
        raise untrusted.Refused(f"owned by uid {owner} and names port {port}: a file of another "
                                f"user may only describe HEALTHCHECK_JUPYTER_PORT {own_port}")
    try:  # the process's real uid, from /proc/<pid>/status, which anyone may read
        with open(f"/proc/{pid}/status", "rb") as f:
            uid = next(int(ln.split()[1]) for ln in f.read(8192).splitlines() if ln.startswith(b"Uid:"))
    except (OSError, ValueError, IndexError, StopIteration):
        raise untrusted.Refused(f"stale: its process {pid} is gone") from None
    if uid != owner:
        raise untrusted.Refused(f"owned by uid {owner} but names a process of uid {uid}")
    if (held := ports.get(port, set())) != {owner}:
        raise untrusted.Refused(held_by(port, held, owner, "the file") if held else
                                f"stale: nothing listens on port {port}")
    base_url = base_url if base_url.startswith("/") else "/" + base_url
    return {"file": untrusted.clean(name, MAX_NAME), "port": port, "host": host, "owner": owner,
            "base_url": base_url if base_url.endswith("/") else base_url + "/",
            "secure": doc.get("secure") is True, "trusted_owner": owner in (0, os.geteuid()),
            "mtime": st.st_mtime, **({"pid": pid, "token": token(doc.get("token"))} if secret else {})}


def token(value: Any) -> str:
    """A runtime file's token if it can only be a token (it goes into a header line), else ""."""
    ok = isinstance(value, str) and 0 < len(value) <= MAX_TOKEN and all(ch in TOKEN_CHARS for ch in value)
    return value if ok else ""


def token_file(path: str | None) -> tuple[str, int | None]:
    """The token file's token or "", and its owner from the same fstat (None: no file was read)."""
    if not path:
        return "", None
    try:
        raw, st = untrusted.read_regular(path, 4096)
    except untrusted.Refused:
        return "", None
    return token(raw.decode("ascii", "replace").strip()), st.st_uid


def find_runtime_file(config: Config, secret: bool = False
                      ) -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
    """The trusted runtime file to use (docs/probes.md), and the refused ones as (cleaned name, reason)."""
    env = os.environ
    data = env.get("JUPYTER_DATA_DIR") or os.path.join(
        env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share"), "jupyter")
    where = config.of(JupyterSettings).jupyter_runtime_dir or env.get("JUPYTER_RUNTIME_DIR") or \
        os.path.join(data, "runtime")
    try:
        dir_fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None, []
    found: list[dict[str, Any]] = []
    refused: list[tuple[str, str]] = []
    try:
        with os.scandir(dir_fd) as entries:  # a flooded directory is read only so far
            names = [e.name for _, e in zip(range(MAX_DIR_ENTRIES), entries)
                     if e.name.startswith("jpserver-") and e.name.endswith(".json")][:MAX_CANDIDATES]
        ports = net.listeners() if names else {}
        for name in sorted(names):
            try:
                found.append(_read_runtime_file(name, dir_fd, config, ports, secret))
            except untrusted.Refused as exc:
                refused.append((untrusted.clean(name, MAX_NAME), str(exc)))
    except OSError:
        pass
    finally:
        os.close(dir_fd)
    own = config.of(JupyterSettings).jupyter_port  # its file first, then root's or ours, then the newest
    return max(found, key=lambda f: (f["port"] == own, f["trusted_owner"], f["mtime"]), default=None), refused


def quote_path(path: str, safe: frozenset[str] = PATH_CHARS) -> str:
    return "".join(ch if ch in safe else "".join(f"%{b:02X}" for b in ch.encode("utf-8")) for ch in path)


def gather(ctx: Context) -> dict[str, Any]:
    cfg, deadline, t0 = ctx.config, ctx.deadline, time.monotonic()
    own = cfg.of(JupyterSettings)
    found, refused = find_runtime_file(cfg)
    host, port, base_url, secure = (found["host"], found["port"], found["base_url"], found["secure"]) \
        if found else (cfg.host, own.jupyter_port, own.jupyter_base_url, bool(own.jupyter_tls))
    path = quote_path(base_url + "api")
    data: dict[str, Any] = {"source": found["file"] if found else None, "host": host, "port": port,
                            "base_url": base_url, "secure": secure, "path": path,
                            "budget": max(0.0, deadline - t0), "refused": refused}
    # Without a trusted file, the server should be the token file's owner's: another uid's listener is
    # a stand-in (Jupyter down, its port taken), and is sent nothing.
    owner = token_file(own.jupyter_token_file)[1] if found is None else None
    if owner is not None and (held := net.listeners().get(port, set())) and held != {owner}:
        return {**data, "outcome": "impostor", "impostor": held_by(port, held, owner, "the token file")}
    data.update(net.exchange(host, port, path, secure, deadline))
    outcome = data["outcome"]
    if not secure and outcome in ("tls-reply", "closed"):  # a TLS server may close: does it speak TLS?
        if outcome == "tls-reply" or net.exchange(host, port, path, True, deadline)["outcome"] in SPOKE_TLS:
            data.update(outcome="tls-mismatch", server_tls=True)
    elif secure and outcome in ("tls-failed", "tls-timeout"):
        plain = net.exchange(host, port, path, False, deadline)
        if plain["outcome"] == "response":
            data.update(outcome="tls-mismatch", server_tls=False)
        elif outcome == "tls-timeout" and plain["outcome"] == "timeout":
            data.update(plain)  # silent whatever we speak: hung
    if data["outcome"] == "refused":
        data["listening"] = net.nearby(port)
    return data


# gather's outcome, refined by what came with it, names one row: the cause and a template of what was seen.
NOT_200 = "not Jupyter: {where} answered {get} with HTTP {status}{src}"
SPOKE_PLAIN = "TLS mismatch: {where} speaks HTTPS but the probe spoke plain HTTP"
SPEAKS_PLAIN = "TLS mismatch: {where} speaks plain HTTP"
OUTCOMES: dict[str, tuple[Cause | None, str]] = {
    "ok": (None, "Jupyter Server {version} answered {get} at {scheme}://{where} in {ms:.0f} ms"),
    "http-5xx": (JUPYTER_HTTP_ERROR, "Jupyter at {where} answered {get} with HTTP {status}"),
    "http-404": (NOT_JUPYTER, NOT_200 + ": wrong base URL? the server has no {path}"),
    "http-403": (NOT_JUPYTER, NOT_200 + ": Jupyter refuses requests for a Host it does not trust"),
    "http-login": (NOT_JUPYTER, NOT_200 + ": a proxy or login page answers instead of Jupyter"),
    "http-other": (NOT_JUPYTER, NOT_200 + ": another web server holds the port"),
    "no-version": (NOT_JUPYTER, "not Jupyter: {where} answered {get} with HTTP 200 ({ctype}) "
                                "but no JSON version: another web server holds the port"),
    "impostor": (JUPYTER_IMPOSTOR, "{impostor} (nothing was sent)"),
    "refused": (JUPYTER_REFUSED, "nothing listening on {where} (connection refused{listening})"),
    "connect-timeout": (CONNECT_TIMEOUT, "connection to {where} not accepted within {budget:.1f}s"),
    "resolve": (UNREACHABLE, "cannot resolve host {host!r}{src}"),
    "unreachable": (UNREACHABLE, "cannot reach {where}{detail}"),
    "hung": (JUPYTER_HUNG, "hung: {where} accepted the connection but did not answer {get} "
                           "within {budget:.1f}s"),
    "partial": (JUPYTER_DEADLINE, "answer from {where} incomplete at the deadline "
                                  "({received} bytes in {budget:.1f}s)"),
    "tls-expected-by-file": (JUPYTER_TLS_MISMATCH, SPOKE_PLAIN + " ({source} says http)"),
    "tls-expected": (JUPYTER_TLS_MISMATCH, SPOKE_PLAIN),
    "plain-by-file": (JUPYTER_TLS_MISMATCH, SPEAKS_PLAIN + " but {source} says https"),
    "plain": (JUPYTER_TLS_MISMATCH, SPEAKS_PLAIN + " but HEALTHCHECK_JUPYTER_TLS is true"),
    "tls-verify": (JUPYTER_TLS_ERROR, "the TLS certificate of {where} is not trusted"),
    "tls-failed": (JUPYTER_TLS_ERROR, "TLS handshake with {where}{src} failed"),
    "too-large": (NOT_JUPYTER, "not Jupyter: {where} answered {get} with a reply too large ({why})"),
    "bad-http": (NOT_JUPYTER, "not Jupyter: {where} does not answer HTTP ({excerpt})"),
    "closed": (NOT_JUPYTER, "not Jupyter: {where} closed the connection without answering {get}"),
}


def outcome(data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    found = data["outcome"]
    if found == "timeout":
        return ("partial" if data.get("received") else "hung"), {}
    if found == "tls-mismatch":
        row = "tls-expected" if data["server_tls"] else "plain"
        return (f"{row}-by-file" if data["source"] else row), {}
    if found != "response":
        return ("tls-failed" if found == "tls-timeout" else found), {}
    status = int(data["status"])
    if status != 200:
        return ("http-5xx" if 500 <= status < 600 else f"http-{status}" if status in (404, 403)
                else "http-login" if status in (401, 407) or 300 <= status < 400 else "http-other"), {}
    doc = json_or_none(data["body"])
    version = doc.get("version") if isinstance(doc, dict) else None
    if not isinstance(version, str) or not version:
        return "no-version", {}
    version = "".join(ch for ch in version if ch.isalnum() or ch in ".+-_")[:32]
    return "ok", {"version": version, "ms": round(float(data["elapsed"]) * 1000, 1)}


def judge(data: dict[str, Any], ctx: Context) -> Result:
    row, extra = outcome(data)
    found, detail = OUTCOMES[row]
    source, listening, refused = data["source"], data.get("listening"), data.get("refused") or []
    message = detail.format(
        where=host_header(data["host"], data["port"]), host=data["host"], source=source,
        scheme="https" if data["secure"] else "http", src=f" (from {source})" if source else "",
        path=data["path"], get=f"GET {untrusted.clean(data['path'], 120)}", budget=float(data["budget"]),
        status=data.get("status"), ctype=untrusted.clean(data.get("content_type") or "", 40) or "no type",
        received=data.get("received"), detail=f" ({data['detail']})" if data.get("detail") else "",
        listening=(f"; listening here: {', '.join(listening)}" if listening
                   else "; no TCP port is listening here" if listening == [] else ""),
        why=data.get("why"), impostor=data.get("impostor"), excerpt=data.get("excerpt"), **extra)
    facts = {"port": data["port"], "base_url": untrusted.clean(data["base_url"]), "secure": data["secure"],
             "runtime_file": source, "runtime_files_refused": dict(refused[:SHOWN_REFUSED])}
    if found is None:
        return passed(NAME, message, observed=extra["ms"], unit="ms",
                      facts={**facts, "version": extra["version"]})
    result = verdict(NAME, found, message, facts=facts)
    if refused:  # name one file the probe did not use, and why (never its content)
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        result = result._replace(message=f"{result.message}; not used: {': '.join(refused[0])}{more}")
    return result


def on_deadline(ctx: Context) -> Result:
    where = host_header(ctx.config.host, ctx.config.of(JupyterSettings).jupyter_port)
    return verdict(NAME, JUPYTER_DEADLINE, f"no answer from Jupyter at {where} before the deadline")
