"""ssh: sshd answers with an SSH protocol identification line (docs/probes.md, "ssh").

An open port is not enough: the kernel completes the TCP handshake for a hung sshd, so the probe
waits for the banner itself. RFC 4253 4.2: the server speaks first and may send other lines before
its identification line, each at most 255 bytes with CR LF. Our own line goes out only after the
banner (both sides identify), or after a silence (SPEAK_SHARE) so that a request/response service
on the port answers something plainly not SSH. Command line:
``timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/22; head -c 255 <&3'``.

OpenSSH 9.8+ penalises addresses whose connections close before authenticating
(``PerSourcePenalties``): keep the probe on loopback, which the image exempts (docs/image.md).
"""

from __future__ import annotations

import time

from probes import services
from probes.context import Context
from probes.result import Result, passed, verdict
from probes.services import _net
from probes.untrusted import clean

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SPEC = services.SSH_SPEC
NAME = SPEC.name


MAX_LINE = 255  # RFC 4253 4.2, including CR LF
MAX_PRELUDE = 8192  # bytes of other lines we tolerate before the identification line
CLIENT_ID = b"SSH-2.0-healthcheck\r\n"
# sshd sends its banner at once; a server silent for a third of the budget (at most SPEAK_AFTER
# seconds) may be waiting for the client to speak first: we then send ours.
SPEAK_SHARE = 1 / 3
SPEAK_AFTER = 1.0


def _scan(buf: bytes) -> dict[str, Any] | None:
    """Look for the identification line in what arrived so far; None means read more."""
    start = 0
    while True:
        nl = buf.find(b"\n", start)
        if nl < 0:
            pending = buf[start:]
            if len(pending) > MAX_LINE:
                return {"outcome": "too-long", "excerpt": _net.safe_excerpt(pending)}
            return None
        line = buf[start: nl + 1]
        if len(line) > MAX_LINE:
            return {"outcome": "too-long", "excerpt": _net.safe_excerpt(line)}
        text = line.rstrip(b"\r\n")
        if text.startswith(b"SSH-"):
            return {"outcome": "banner", "line": text}
        start = nl + 1
        if start > MAX_PRELUDE:
            return {"outcome": "not-ssh", "excerpt": _net.safe_excerpt(buf.lstrip())}


def gather(ctx: Context) -> dict[str, Any]:
    cfg, port = ctx.config, ctx.config.of(services.SshSettings).ssh_port
    deadline = ctx.deadline
    t0 = time.monotonic()
    data: dict[str, Any] = {"host": cfg.host, "port": port, "budget": max(0.0, deadline - t0),
                            "spoke_first": False}
    try:
        sock = _net.connect(cfg.host, port, deadline)
    except _net.NetError as exc:
        kind = "connect-timeout" if exc.kind == "timeout" else exc.kind
        data.update(outcome=kind, detail=exc.detail)
        if exc.kind == "refused":
            data["listening"] = _net.listening(port)
        return data
    buf = b""
    sent = False  # our identification line is out (or the attempt failed: the server closed)
    speak_at = t0 + min(data["budget"] * SPEAK_SHARE, SPEAK_AFTER)
    try:
        while True:
            found = _scan(buf)
            if found is not None:
                if found["outcome"] == "banner" and sent and found["line"] == CLIENT_ID.rstrip(b"\r\n"):
                    found = {"outcome": "echo"}  # our own words came back: not an SSH server
                data.update(found)
                break
            if not sent and not buf and time.monotonic() >= speak_at:
                _send_ours(sock, deadline)
                sent = True
                data["spoke_first"] = True
            wait_until = deadline if sent or buf else min(speak_at, deadline)
            try:
                _net.arm(sock, wait_until)
                chunk = sock.recv(1024)
            except _net.timeout:
                if wait_until < deadline:
                    continue  # silent so far: our turn to speak
                data["outcome"] = "timeout"
                break
            except OSError:  # reset by the peer
                chunk = b""
            if not chunk:
                data["outcome"] = "closed"
                break
            buf += chunk
        if data["outcome"] == "banner" and not sent:
            _send_ours(sock, deadline)  # both sides identify (RFC 4253 4.2); then we close
    finally:
        sock.close()
    data["received"] = len(buf)
    if data["outcome"] in ("timeout", "closed"):
        data["partial"] = buf[buf.rfind(b"\n") + 1:]
        data["excerpt"] = _net.safe_excerpt(buf.lstrip()) if buf.strip() else ""
    return data


def _send_ours(sock: _net.Socket, deadline: float) -> None:
    try:
        _net.arm(sock, deadline)
        sock.sendall(CLIENT_ID)
    except OSError:
        pass  # a server that has already closed is judged by what it sent


def _parse_banner(line: bytes) -> tuple[str, str, str]:
    """(protocol version, software version, comments) of ``SSH-proto-software comments``."""
    text = line.decode("utf-8", "replace")
    _, _, rest = text.partition("-")
    proto, _, rest = rest.partition("-")
    software, _, comments = rest.partition(" ")
    return clean(proto, 16), clean(software, 64), clean(comments, 64)


def judge(data: dict[str, Any], ctx: Context) -> Result:
    where = _net.host_header(data["host"], data["port"])
    outcome = data["outcome"]
    if outcome == "banner":
        proto, software, comments = _parse_banner(data["line"])
        facts = {"protocol": proto, "software": software, "comments": comments}
        if proto in ("2.0", "1.99") and software:
            shown = f"{software} {comments}".strip()
            return passed(NAME, f"sshd at {where} identifies as {shown} (SSH-{proto})",
                          observed=software, facts=facts)
        if proto in ("2.0", "1.99"):
            return verdict(NAME, services.NOT_SSH, f"the SSH banner at {where} names no software version: "
                           f"{_net.safe_excerpt(data['line'])}", facts=facts)
        return verdict(NAME, services.NOT_SSH, f"the server at {where} speaks only SSH "
                       f"protocol {proto!r}, not 2.0", facts=facts)
    if outcome == "refused":
        listening = data.get("listening")
        extra = (f" (listening here: {', '.join(listening)})" if listening
                 else " (no TCP port is listening here)" if listening == [] else "")
        return verdict(NAME, services.SSH_REFUSED, f"connection refused: nothing listening on {where}{extra}",
                       facts={"listening": listening or []})
    if outcome == "resolve":
        return verdict(NAME, services.UNREACHABLE, f"cannot resolve HEALTHCHECK_HOST {data['host']!r}")
    if outcome == "unreachable":
        why = f" ({data['detail']})" if data.get("detail") else ""
        return verdict(NAME, services.UNREACHABLE, f"cannot reach {where}{why}")
    if outcome == "echo":
        ours = CLIENT_ID.rstrip(b"\r\n").decode()
        return verdict(NAME, services.SSH_ECHO, f"{where} sent back our own identification line ({ours}) "
                       "instead of an SSH banner: an echo service or a port forward "
                       "that loops back holds the port")
    budget = float(data["budget"])
    if outcome == "connect-timeout":
        return verdict(NAME, services.CONNECT_TIMEOUT,
                       f"connection to {where} not accepted within {budget:.1f}s")
    received = data.get("received", 0)
    if outcome == "timeout" and received == 0:
        return verdict(NAME, services.SSH_NO_BANNER, f"no banner: {where} accepted the connection "
                       f"but sent nothing within {budget:.1f}s")
    partial: bytes = data.get("partial", b"")
    if outcome == "timeout" and partial and b"SSH-".startswith(partial[:4]):
        return verdict(NAME, services.SSHD_STUCK, f"SSH banner from {where} incomplete at the deadline "
                       f"({received} bytes in {budget:.1f}s)")
    if outcome == "closed" and received == 0:
        return verdict(NAME, services.SSH_NO_BANNER, f"no banner: {where} closed the connection without one")
    # too-long, not-ssh, or a timeout or close after something that is no banner
    return verdict(NAME, services.NOT_SSH, f"not an SSH banner from {where}: {data['excerpt']}")


def on_deadline(ctx: Context) -> Result:
    where = _net.host_header(ctx.config.host, ctx.config.of(services.SshSettings).ssh_port)
    return verdict(NAME, services.SSHD_STUCK, f"no SSH banner from {where} before the deadline")
