"""ssh: sshd answers with an SSH identification line (RFC 4253 4.2; docs/probes.md), not only an
open port. Keep it on loopback, which the image exempts from OpenSSH's ``PerSourcePenalties``
(docs/image.md). Command line: ``timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/22; head -c 255 <&3'``."""

from __future__ import annotations

import time

from probes.context import Context
from probes.result import Result, passed, verdict
from probes.services import net
from probes.services.common import CONNECT_TIMEOUT, SSHD_STUCK, UNREACHABLE, excerpt, host_header
from probes.spec import ALL_PROFILES, PORT, Declared, Spec, cause, setting
from probes.untrusted import clean

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class SshSettings(Declared):
    ssh_port: int = setting("HEALTHCHECK_SSH_PORT", PORT, 22, "sshd port")


SSH_REFUSED = cause("refused", "nothing listening on the SSH port (the message lists what is listening)",
                    "start sshd (`/usr/sbin/sshd`) or set `HEALTHCHECK_SSH_PORT` to its port",
                    action="restart-app", actor="tenant")
SSH_NO_BANNER = cause(
    "no-banner", "port accepts but sends nothing before the deadline, or closes without a banner",
    "sshd is hung, or refuses this client (MaxStartups, PerSourcePenalties, tcp wrappers): "
    "restart it and check its log", action="restart-app", actor="tenant")
NOT_SSH = cause("not-ssh", "the first line is not `SSH-2.0-`/`SSH-1.99-` (short excerpt quoted), or the "
                "server speaks only SSH protocol 1", "another service holds the port; check "
                "`HEALTHCHECK_SSH_PORT` and what listens there (an sshd of protocol 1 only: install a "
                "current openssh-server)", action="fix-config", actor="tenant")
SSH_ECHO = cause("echo", "the server sent back our own `SSH-2.0-healthcheck` line "
                         "(an echo service, or a port forward that loops back)",
                 "not sshd: point `HEALTHCHECK_SSH_PORT` at sshd's port", action="fix-config", actor="tenant")

SPEC = Spec(
    "ssh", layer="services", module=__name__, toggle="ENABLE_SSH_CHECK", timeout=3.0, profiles=ALL_PROFILES,
    measurement="banner", about="sshd sends an `SSH-2.0-` identification line", settings=SshSettings.SETTINGS,
    dials="ssh_port",
    causes=(SSH_REFUSED, SSH_NO_BANNER, NOT_SSH, SSH_ECHO, SSHD_STUCK, CONNECT_TIMEOUT, UNREACHABLE),
)
NAME = SPEC.name

MAX_LINE, MAX_PRELUDE = 255, 8192  # RFC 4253 4.2, with CR LF; bytes of other lines before that line
CLIENT_ID = b"SSH-2.0-healthcheck\r\n"
SPEAK_SHARE, SPEAK_AFTER = 1 / 3, 1.0  # sshd speaks at once; a server this silent may wait for us


def _scan(buf: bytes) -> dict[str, Any] | None:
    """The identification line in what arrived so far, or why there is none; None: read more."""
    start = 0
    while True:
        nl = buf.find(b"\n", start)
        line = buf[start:] if nl < 0 else buf[start: nl + 1]
        if len(line) > MAX_LINE:
            return {"outcome": "too-long", "excerpt": excerpt(line)}
        if nl < 0:
            return None
        if line.startswith(b"SSH-"):
            return {"outcome": "banner", "line": line.rstrip(b"\r\n")}
        start = nl + 1
        if start > MAX_PRELUDE:
            return {"outcome": "not-ssh", "excerpt": excerpt(buf.lstrip())}


def gather(ctx: Context) -> dict[str, Any]:
    host, port, deadline = ctx.config.host, ctx.config.of(SshSettings).ssh_port, ctx.deadline
    budget = max(0.0, deadline - (t0 := time.monotonic()))
    data: dict[str, Any] = {"host": host, "port": port, "spoke_first": False, "budget": budget}
    if isinstance(sock := net.connect(host, port, deadline), dict):
        data.update(sock)
        return {**data, "listening": net.nearby(port)} if sock["outcome"] == "refused" else data

    def send_ours() -> None:
        try:
            net.arm(sock, deadline)
            sock.sendall(CLIENT_ID)
        except OSError:
            pass  # a server that has already closed is judged by what it sent

    buf, speak_at = b"", t0 + min(budget * SPEAK_SHARE, SPEAK_AFTER)
    try:
        while (found := _scan(buf)) is None:
            if not data["spoke_first"] and not buf and time.monotonic() >= speak_at:
                send_ours()
                data["spoke_first"] = True
            wait_until = deadline if data["spoke_first"] or buf else min(speak_at, deadline)
            try:
                net.arm(sock, wait_until)
                chunk: bytes | None = sock.recv(1024)
            except net.timeout:
                if wait_until < deadline:
                    continue  # silent so far: our turn to speak
                chunk = None
            except OSError:  # reset by the peer
                chunk = b""
            if not chunk:
                found = {"outcome": "timeout" if chunk is None else "closed"}
                break
            buf += chunk
        if found["outcome"] == "banner" and data["spoke_first"] and found["line"] == CLIENT_ID.rstrip():
            found = {"outcome": "echo"}  # our own words came back: not an SSH server
        elif found["outcome"] == "banner" and not data["spoke_first"]:
            send_ours()  # both sides identify (RFC 4253 4.2); then we close
    finally:
        sock.close()
    # What came before a timeout or close: a banner cut short, or something else.
    data.update(partial=buf[buf.rfind(b"\n") + 1:], excerpt=excerpt(buf.lstrip()) if buf.strip() else "")
    return {**data, **found, "received": len(buf)}


def judge(data: dict[str, Any], ctx: Context) -> Result:
    where, outcome = host_header(data["host"], data["port"]), data["outcome"]
    if outcome == "banner":
        # SSH-protoversion-softwareversion SP comments
        proto, _, rest = data["line"].decode("utf-8", "replace")[4:].partition("-")
        software, _, comments = rest.partition(" ")
        proto, software, comments = clean(proto, 16), clean(software, 64), clean(comments, 64)
        facts = {"protocol": proto, "software": software, "comments": comments}
        if proto in ("2.0", "1.99") and software:
            return passed(NAME, f"sshd at {where} identifies as {f'{software} {comments}'.strip()} "
                          f"(SSH-{proto})", observed=software, facts=facts)
        if proto in ("2.0", "1.99"):
            return verdict(NAME, NOT_SSH, f"the SSH banner at {where} names no software version: "
                           f"{excerpt(data['line'])}", facts=facts)
        return verdict(NAME, NOT_SSH, f"the server at {where} speaks only SSH protocol {proto!r}, not 2.0",
                       facts=facts)
    if outcome == "refused":
        listening = data.get("listening") or []  # gather reads it on every refusal
        here = f"listening here: {', '.join(listening)}" if listening else "no TCP port is listening here"
        return verdict(NAME, SSH_REFUSED, f"connection refused: nothing listening on {where} ({here})",
                       facts={"listening": listening})
    if outcome == "resolve":
        return verdict(NAME, UNREACHABLE, f"cannot resolve HEALTHCHECK_HOST {data['host']!r}")
    if outcome == "unreachable":
        why = f" ({data['detail']})" if data.get("detail") else ""
        return verdict(NAME, UNREACHABLE, f"cannot reach {where}{why}")
    if outcome == "echo":
        return verdict(NAME, SSH_ECHO, f"{where} sent back our own identification line "
                       f"({CLIENT_ID.rstrip().decode()}) instead of an SSH banner: an echo service or a port "
                       "forward that loops back holds the port")
    budget, received = float(data["budget"]), data.get("received", 0)
    if outcome == "connect-timeout":
        return verdict(NAME, CONNECT_TIMEOUT, f"connection to {where} not accepted within {budget:.1f}s")
    if outcome == "timeout" and received == 0:
        return verdict(NAME, SSH_NO_BANNER, f"no banner: {where} accepted the connection but sent nothing "
                       f"within {budget:.1f}s")
    partial: bytes = data.get("partial", b"")
    if outcome == "timeout" and partial and b"SSH-".startswith(partial[:4]):
        return verdict(NAME, SSHD_STUCK, f"SSH banner from {where} incomplete at the deadline "
                       f"({received} bytes in {budget:.1f}s)")
    if outcome == "closed" and received == 0:
        return verdict(NAME, SSH_NO_BANNER, f"no banner: {where} closed the connection without one")
    # too-long, not-ssh, or a timeout or close after something that is no banner
    return verdict(NAME, NOT_SSH, f"not an SSH banner from {where}: {data['excerpt']}")


def on_deadline(ctx: Context) -> Result:
    where = host_header(ctx.config.host, ctx.config.of(SshSettings).ssh_port)
    return verdict(NAME, SSHD_STUCK, f"no SSH banner from {where} before the deadline")
