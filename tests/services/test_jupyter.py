"""The jupyter probe against a real Jupyter Server (plain, base URL, HTTPS, the other side of TLS)
and against runtime files it must not trust (another user's, links, FIFOs, foreign hosts, damage).
Servers that are not Jupyter on the wire, and the HTTP parser: test_jupyter_wire.py."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from probes.result import Result, Status
from probes.services import net
from probes.services.jupyter import MAX_RUNTIME_FILE
from tests.conftest import ROOT, clean_env, run_cli
from tests.services.conftest import (
    OTHER_UID,
    TOKEN,
    Jupyter,
    Listener,
    fake_jupyter,
    free_port,
    needs_root,
    no_runtime,
    probe,
    write_runtime,
)

PROXIES = {k: "http://127.0.0.1:9" for k in
           ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")}


# ---------------------------------------------------------------- real Jupyter Server

def test_found_through_its_runtime_file(jupyter: Jupyter) -> None:
    r = probe(jupyter_runtime_dir=str(jupyter.runtime), jupyter_port=1)
    assert r.status is Status.PASS, r.message
    assert r.facts["runtime_file"].startswith("jpserver-") and r.facts["port"] == jupyter.port
    assert r.unit == "ms" and r.observed >= 0
    assert r.facts["version"]


def test_found_through_the_port(jupyter: Jupyter, tmp_path: Path) -> None:
    r = probe(jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=jupyter.port)
    assert r.status is Status.PASS, r.message
    assert r.facts["runtime_file"] is None


def test_runtime_dir_from_the_jupyter_environment(jupyter: Jupyter, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(jupyter.runtime))
    r = probe(jupyter_port=1)
    assert r.status is Status.PASS, r.message


def test_base_url_through_runtime_file_and_port(jupyter_base: Jupyter, tmp_path: Path) -> None:
    r = probe(jupyter_runtime_dir=str(jupyter_base.runtime))
    assert r.status is Status.PASS, r.message
    assert "/user/alice/api" in r.message
    r = probe(jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=jupyter_base.port,
              jupyter_base_url="/user/alice/")
    assert r.status is Status.PASS, r.message


def test_wrong_base_url_is_explained(jupyter_base: Jupyter, tmp_path: Path) -> None:
    r = probe(jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=jupyter_base.port)
    assert (r.status, r.reason) == (Status.FAIL, "not-jupyter")
    assert "404" in r.message and "HEALTHCHECK_JUPYTER_BASE_URL" in r.message


def test_https_jupyter_through_its_runtime_file(jupyter_tls: Jupyter) -> None:
    r = probe(jupyter_runtime_dir=str(jupyter_tls.runtime))
    assert r.status is Status.PASS, r.message
    assert r.facts["secure"] is True and "https://" in r.message


def test_https_jupyter_probed_as_plain_http_is_a_tls_mismatch(jupyter_tls: Jupyter, tmp_path: Path) -> None:
    r = probe(jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=jupyter_tls.port)
    assert (r.status, r.reason) == (Status.FAIL, "tls-mismatch")
    assert "HTTPS" in r.message and "HEALTHCHECK_JUPYTER_RUNTIME_DIR" in r.message


def test_https_jupyter_without_a_trusted_runtime_file_is_probed_over_tls_when_configured(
        jupyter_tls: Jupyter, jupyter: Jupyter, tmp_path: Path) -> None:
    """In the image root may not inspect the notebook user's process, so its runtime file is not
    trusted: HEALTHCHECK_JUPYTER_TLS says how to talk to the configured port instead."""
    r = probe(jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=jupyter_tls.port, jupyter_tls=True)
    assert r.status is Status.PASS and "https://" in r.message
    r = probe(jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=jupyter_tls.port)
    assert r.reason == "tls-mismatch" and "HEALTHCHECK_JUPYTER_TLS=true" in r.message
    r = probe(jupyter_runtime_dir=no_runtime(tmp_path), jupyter_port=jupyter.port, jupyter_tls=True)
    assert r.reason == "tls-mismatch" and "HEALTHCHECK_JUPYTER_TLS is true" in r.message


def test_runtime_file_saying_https_for_a_plain_server_is_a_tls_mismatch(jupyter: Jupyter,
                                                                        tmp_path: Path) -> None:
    # The file names the real server's pid (a runtime file is only trusted when its pid holds the port).
    rt = tmp_path / "rt"
    rt.mkdir()
    (rt / f"jpserver-{jupyter.proc.pid}.json").write_text(json.dumps(
        {"pid": jupyter.proc.pid, "port": jupyter.port, "base_url": "/", "secure": True,
         "hostname": "127.0.0.1", "token": TOKEN, "url": f"https://127.0.0.1:{jupyter.port}/"}))
    r = probe(jupyter_runtime_dir=str(rt))
    assert (r.status, r.reason) == (Status.FAIL, "tls-mismatch")
    assert "plain HTTP" in r.message


def test_proxy_variables_do_not_apply(jupyter: Jupyter, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in PROXIES.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert probe(jupyter_runtime_dir=str(jupyter.runtime)).status is Status.PASS
    assert probe(jupyter_runtime_dir=str(jupyter.runtime), jupyter_port=jupyter.port).status is Status.PASS


def test_a_live_runtime_file_wins_over_a_stale_one(jupyter: Jupyter, tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    rt.mkdir()
    live = next(jupyter.runtime.glob("jpserver-*.json"))
    (rt / live.name).write_text(live.read_text())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = rt / f"jpserver-{dead.stdout.strip()}.json"
    stale.write_text(json.dumps({"pid": int(dead.stdout), "port": free_port(), "base_url": "/",
                                 "secure": False, "hostname": "127.0.0.1"}))
    os.utime(stale)  # newer than the live one: liveness still decides
    r = probe(jupyter_runtime_dir=str(rt))
    assert r.status is Status.PASS, r.message
    assert r.facts["runtime_file"] == live.name


def test_stale_runtime_file_alone_is_explained(tmp_path: Path) -> None:
    # A stale file is not used: the configured port is probed, and the failure names the file.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    name = f"jpserver-{dead.stdout.strip()}.json"
    (tmp_path / name).write_text(json.dumps(
        {"pid": int(dead.stdout), "port": free_port(), "base_url": "/", "secure": False, "token": TOKEN}))
    port = free_port()
    r = probe(jupyter_runtime_dir=str(tmp_path), jupyter_port=port)
    assert r.reason == "refused" and f"127.0.0.1:{port}" in r.message
    assert "stale" in r.message and name in r.message
    assert r.facts["runtime_file"] is None and "stale" in r.facts["runtime_files_refused"][name]


def test_only_imports_what_it_needs(jupyter: Jupyter) -> None:
    code = ("import sys, time\n"
            "from probes.config import Config\nfrom probes.context import Context\n"
            "from probes.state import State\nfrom probes.services import jupyter, ssh\n"
            f"ctx = Context(Config(jupyter_runtime_dir={str(jupyter.runtime)!r}), time.monotonic() + 3, "
            "{}, State.off('t'))\n"
            "r = jupyter.judge(jupyter.gather(ctx), ctx)\n"
            "print(r.status.value, sorted(m for m in ('ssl', 'http.client', 'email.parser', 'psutil', "
            "'urllib.request') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=clean_env(), timeout=30, check=False)
    assert out.stdout.split() == ["pass", "[]"], out.stdout + out.stderr


# ---------------------------------------------------------------- runtime files another user can write
# The runtime directory belongs to the notebook user and the probe runs as root: a file there
# must not hang, crash, steer or fake the probe. A refused file is named, with its reason.

def refused(r: Result) -> dict[str, str]:
    return dict(r.facts["runtime_files_refused"])


def rt_dir(tmp_path: Path) -> Path:
    rt = tmp_path / "rt"
    rt.mkdir(exist_ok=True)
    return rt


def bounded_probe(timeout: float, **config: Any) -> Result:
    """probe() in a thread: a probe that blocks fails the test instead of hanging it."""
    out: list[Result] = []
    worker = threading.Thread(target=lambda: out.append(probe(timeout, **config)), daemon=True)
    worker.start()
    worker.join(timeout + 1.0)
    assert out, f"the probe did not return within {timeout + 1.0:.1f}s (blocked)"
    return out[0]


def test_fifo_runtime_file_never_blocks(jupyter: Jupyter, tmp_path: Path) -> None:
    rt = rt_dir(tmp_path)
    fifo = rt / "jpserver-1.json"
    os.mkfifo(fifo)
    try:
        t0 = time.monotonic()
        r = bounded_probe(2.0, jupyter_runtime_dir=str(rt), jupyter_port=jupyter.port)
        assert time.monotonic() - t0 < 2.0
        assert r.status is Status.PASS, r.message  # the configured port decides
        assert refused(r) == {"jpserver-1.json": "not a regular file"}
        port = free_port()
        r = bounded_probe(2.0, jupyter_runtime_dir=str(rt), jupyter_port=port)
        assert (r.status, r.reason) == (Status.FAIL, "refused")
        assert "not used: jpserver-1.json: not a regular file" in r.message
    finally:
        # Wake a reader still blocked in open() (the old code), so no thread stays stuck.
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


def test_deeply_nested_runtime_file_is_refused(jupyter: Jupyter, tmp_path: Path) -> None:
    rt = rt_dir(tmp_path)
    (rt / "jpserver-2.json").write_text("[" * 30000 + "]" * 30000)  # under the size limit
    nested: Any = 1
    for _ in range(40):  # deeper than the suite reads, far below the interpreter's limit
        nested = [nested]
    write_runtime(rt, "jpserver-3.json", pid=jupyter.proc.pid, port=jupyter.port, x=nested)
    r = probe(jupyter_runtime_dir=str(rt), jupyter_port=jupyter.port)
    assert r.status is Status.PASS, r.message
    assert refused(r) == {"jpserver-2.json": "nested too deeply", "jpserver-3.json": "nested too deeply"}


def local_address() -> str | None:
    """A non-loopback IPv4 address of this machine (the source of its default route), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
            addr = str(s.getsockname()[0])
        except OSError:
            return None
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


def test_foreign_hostname_is_never_contacted(jupyter: Jupyter, scripted: Any, tmp_path: Path) -> None:
    # A fake Jupyter off loopback, on this machine's own address, held by this very process (so
    # the file's pid does hold its port): only the hostname is wrong, and nothing may connect.
    addr = local_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address to listen on")
    seen: list[bytes] = []
    fake = scripted(fake_jupyter(seen), host=addr)
    rt = rt_dir(tmp_path)
    name = f"jpserver-{os.getpid()}.json"
    write_runtime(rt, name, pid=os.getpid(), port=fake.port, hostname=addr)
    r = probe(jupyter_runtime_dir=str(rt), jupyter_port=jupyter.port)
    assert r.status is Status.PASS, r.message
    assert "9.9.9" not in r.message and f"127.0.0.1:{jupyter.port}" in r.message
    time.sleep(0.1)
    assert seen == [], "the probe connected off loopback"
    assert refused(r) == {name: "its hostname is neither loopback nor HEALTHCHECK_HOST"}


def test_foreign_hostnames_are_refused_without_a_connection(jupyter: Jupyter, tmp_path: Path) -> None:
    # Addresses where a connection would hang or go off this machine; the files are otherwise
    # perfect (root's, the live server's pid and port): the probe answers at once from the
    # configured host.
    rt = rt_dir(tmp_path)
    for n, host in enumerate(("192.0.2.1", "example.invalid", "10.0.0.1")):
        write_runtime(rt, f"jpserver-{n}.json", pid=jupyter.proc.pid, port=jupyter.port, hostname=host,
                      base_url="/elsewhere/")
    t0 = time.monotonic()
    r = probe(5.0, jupyter_runtime_dir=str(rt), jupyter_port=jupyter.port)
    assert time.monotonic() - t0 < 1.5
    assert r.status is Status.PASS, r.message
    assert "127.0.0.1" in r.message and r.facts["base_url"] == "/"
    assert set(refused(r).values()) == {"its hostname is neither loopback nor HEALTHCHECK_HOST"}


def test_configured_host_in_a_runtime_file_is_used(scripted: Any, tmp_path: Path) -> None:
    # HEALTHCHECK_HOST off loopback is where the operator said to connect: a file naming it counts.
    addr = local_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address to listen on")
    fake = scripted(fake_jupyter([]), host=addr)
    rt = rt_dir(tmp_path)
    write_runtime(rt, "jpserver-1.json", pid=os.getpid(), port=fake.port, hostname=addr)
    r = probe(host=addr, jupyter_runtime_dir=str(rt), jupyter_port=1)
    assert r.status is Status.PASS, r.message
    assert r.facts["runtime_file"] == "jpserver-1.json" and f"{addr}:{fake.port}" in r.message


def test_loopback_and_wildcard_hostnames_are_used(jupyter_base: Jupyter, tmp_path: Path) -> None:
    rt = rt_dir(tmp_path)
    for host in ("localhost", "127.0.0.1", "0.0.0.0", ""):
        write_runtime(rt, "jpserver-9.json", pid=jupyter_base.proc.pid, port=jupyter_base.port,
                      hostname=host, base_url="/user/alice/")
        r = probe(jupyter_runtime_dir=str(rt), jupyter_port=1)
        assert r.status is Status.PASS, (host, r.message)
        assert r.facts["runtime_file"] == "jpserver-9.json" and refused(r) == {}


@pytest.mark.parametrize("source", ["sock_diag", "proc"])
def test_listening_sockets_and_their_owners(other_user_server: Any, source: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel's socket diagnostics, or /proc/net/tcp and tcp6 where those are refused: each LISTEN
    # socket's address, port and owner, the same from both.
    sockets = [Listener()]
    try:
        with contextlib.suppress(OSError):  # the same port on IPv6 loopback, where there is one
            sockets.append(Listener("::1", sockets[0].port))
        other = other_user_server()
        diag = sorted(net.listening())
        if source == "proc":
            def refused() -> list[Any]:
                raise PermissionError(13, "netlink refused")  # as a seccomp or sandbox refuses it

            monkeypatch.setattr(net, "_diag_listening", refused)
            assert sorted(net.listening()) == diag
        found = net.listeners()
        assert found[sockets[0].port] == {os.geteuid()}
        assert found[other.port] == {OTHER_UID}
        assert free_port() not in net.listeners()
        assert f"127.0.0.1:{sockets[0].port}" in net.nearby(sockets[0].port)
    finally:
        for s in sockets:
            s.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST",
                                  "::ffff:127.0.0.1"])
def test_is_loopback(host: str) -> None:
    assert net.is_loopback(host)


@pytest.mark.parametrize("host", ["192.0.2.1", "10.0.0.1", "::2", "128.0.0.1", "localhost.example.com",
                                  "127.0.0.1.nip.io", "", "0.0.0.0", "127.0.0.1\x00", "::ffff:10.0.0.1"])
def test_is_not_loopback(host: str) -> None:
    assert not net.is_loopback(host)


def test_runtime_file_whose_owner_does_not_hold_the_port(other_user_server: Any, tmp_path: Path) -> None:
    # Root's file and a live process of root, but the port is another uid's: not root's server.
    srv = other_user_server()
    other = subprocess.Popen(["sleep", "30"])
    try:
        rt = rt_dir(tmp_path)
        write_runtime(rt, f"jpserver-{other.pid}.json", pid=other.pid, port=srv.port, hostname="127.0.0.1")
        port = free_port()
        r = probe(jupyter_runtime_dir=str(rt), jupyter_port=port)
    finally:
        other.kill()
        other.wait()
    assert (r.status, r.reason) == (Status.FAIL, "refused"), r.message
    assert f"127.0.0.1:{port}" in r.message and "7.7.7" not in r.message
    assert refused(r) == {f"jpserver-{other.pid}.json":
                          f"port {srv.port} is held by uid {OTHER_UID}, not uid 0 who owns the file"}
    assert srv.stop() == [], "the probe talked to the other uid's server"


def test_runtime_file_whose_port_nothing_listens_on_is_stale(jupyter: Jupyter, tmp_path: Path) -> None:
    rt = rt_dir(tmp_path)
    dead_port = free_port()
    write_runtime(rt, "jpserver-5.json", pid=jupyter.proc.pid, port=dead_port)
    r = probe(jupyter_runtime_dir=str(rt), jupyter_port=jupyter.port)
    assert r.status is Status.PASS, r.message
    assert refused(r) == {"jpserver-5.json": f"stale: nothing listens on port {dead_port}"}


def test_symlinked_runtime_file_is_refused(jupyter: Jupyter, tmp_path: Path) -> None:
    # Even a link to the live server's own file: links in that directory are not followed.
    rt = rt_dir(tmp_path)
    real = next(jupyter.runtime.glob("jpserver-*.json"))
    (rt / "jpserver-1.json").symlink_to(real)
    port = free_port()
    r = probe(jupyter_runtime_dir=str(rt), jupyter_port=port)
    assert (r.status, r.reason) == (Status.FAIL, "refused"), r.message
    assert r.facts["runtime_file"] is None
    assert refused(r) == {"jpserver-1.json": "a symbolic link"}
    assert "not used: jpserver-1.json: a symbolic link" in r.message


def test_hard_linked_runtime_file_is_refused(jupyter: Jupyter, tmp_path: Path) -> None:
    rt = rt_dir(tmp_path)
    source = write_runtime(tmp_path, "elsewhere.json", pid=jupyter.proc.pid, port=jupyter.port)
    os.link(source, rt / "jpserver-1.json")
    r = probe(jupyter_runtime_dir=str(rt), jupyter_port=free_port())
    assert r.status is Status.FAIL and refused(r) == {"jpserver-1.json": "a hard link"}


def test_oversized_runtime_file_is_refused(jupyter: Jupyter, tmp_path: Path) -> None:
    rt = rt_dir(tmp_path)
    doc = json.dumps({"pid": jupyter.proc.pid, "port": jupyter.port, "base_url": "/", "token": TOKEN})
    (rt / "jpserver-1.json").write_text(doc + " " * MAX_RUNTIME_FILE)
    port = free_port()
    r = probe(jupyter_runtime_dir=str(rt), jupyter_port=port)
    assert (r.status, r.reason) == (Status.FAIL, "refused"), r.message
    assert refused(r) == {"jpserver-1.json": f"larger than {MAX_RUNTIME_FILE} bytes"}


def test_refused_file_names_are_cleaned(jupyter: Jupyter, tmp_path: Path) -> None:
    rt = rt_dir(tmp_path)
    (rt / "jpserver-\x1b[2J\u202e.json").write_text("not json " + TOKEN)
    port = free_port()
    r = probe(jupyter_runtime_dir=str(rt), jupyter_port=port)
    assert refused(r) == {"jpserver-\\x1b[2J\\u202e.json": "not valid JSON"}
    assert "\x1b" not in r.message and "\u202e" not in r.message
    assert "jpserver-\\x1b[2J\\u202e.json: not valid JSON" in r.message


# ---------------------------------------------------------------- files of another user (the notebook user)

def test_another_users_file_cannot_send_the_probe_to_another_port(scripted: Any, tmp_path: Path) -> None:
    # The notebook user's fake Jupyter answers on its own port while nothing listens on the
    # configured one (Jupyter is dead): the verdict must be fail.
    needs_root()
    seen: list[bytes] = []
    fake = scripted(fake_jupyter(seen))
    rt = rt_dir(tmp_path)
    write_runtime(rt, f"jpserver-{os.getpid()}.json", owner=OTHER_UID, pid=os.getpid(), port=fake.port,
                  hostname="127.0.0.1")
    port = free_port()
    r = probe(jupyter_runtime_dir=str(rt), jupyter_port=port)
    assert (r.status, r.reason) == (Status.FAIL, "refused"), r.message
    assert seen == [], "the probe talked to the fake server"
    assert refused(r) == {f"jpserver-{os.getpid()}.json":
                          f"owned by uid {OTHER_UID} and names port {fake.port}: a file of another user "
                          f"may only describe HEALTHCHECK_JUPYTER_PORT {port}"}


def test_another_users_file_describes_the_configured_port(other_user_server: Any, tmp_path: Path) -> None:
    # As in the image: Jupyter runs as the notebook user, its file says the base URL.
    srv = other_user_server("/user/bob/")
    rt = rt_dir(tmp_path)
    write_runtime(rt, f"jpserver-{srv.pid}.json", owner=OTHER_UID, pid=srv.pid, port=srv.port,
                  base_url="/user/bob/", hostname="localhost")
    r = probe(jupyter_runtime_dir=str(rt), jupyter_port=srv.port)
    assert r.status is Status.PASS, r.message
    assert "/user/bob/api" in r.message and r.facts["runtime_file"] == f"jpserver-{srv.pid}.json"


def test_another_users_file_cannot_describe_someone_elses_server(jupyter: Jupyter, tmp_path: Path) -> None:
    # The notebook user must not pick the base URL or scheme of root's server.
    needs_root()
    rt = rt_dir(tmp_path)
    write_runtime(rt, "jpserver-1.json", owner=OTHER_UID, pid=jupyter.proc.pid, port=jupyter.port,
                  base_url="/not/here/", secure=True)
    r = probe(jupyter_runtime_dir=str(rt), jupyter_port=jupyter.port)
    assert r.status is Status.PASS, r.message
    assert refused(r) == {"jpserver-1.json": f"owned by uid {OTHER_UID} but names a process of uid 0"}


# ---------------------------------------------------------------- the whole CLI: no token anywhere

@pytest.mark.skipif(not (ROOT / "probes" / "cli.py").exists(), reason="the CLI is not there yet")
@pytest.mark.parametrize("flags", [(), ("--json",), ("-v",), ("--json", "-v")])
def test_cli_never_shows_the_token(jupyter: Jupyter, tmp_path: Path, flags: tuple[str, ...]) -> None:
    env = clean_env(HEALTHCHECK_JUPYTER_RUNTIME_DIR=str(jupyter.runtime), HEALTHCHECK_STATE_DIR=str(tmp_path),
                    HEALTHCHECK_LOG_FILE=str(tmp_path / "log"), **PROXIES)
    out = run_cli("--only", "jupyter", *flags, env=env, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert TOKEN not in out.stdout + out.stderr
    log = tmp_path / "log"
    assert not log.exists() or TOKEN not in log.read_text()
    if "--json" in flags:
        doc = json.loads(out.stdout)
        assert doc["checks"]["jupyter:responseTime"][0]["status"] == "pass"


@pytest.mark.skipif(not (ROOT / "probes" / "cli.py").exists(), reason="the CLI is not there yet")
def test_cli_failure_never_shows_the_token(jupyter: Jupyter, tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    rt.mkdir()
    (rt / f"jpserver-{jupyter.proc.pid}.json").write_text(json.dumps(
        {"pid": jupyter.proc.pid, "port": jupyter.port, "base_url": f"/{TOKEN}/", "secure": True,
         "token": TOKEN, "url": f"https://127.0.0.1:{jupyter.port}/?token={TOKEN}"}))
    env = clean_env(HEALTHCHECK_JUPYTER_RUNTIME_DIR=str(rt), HEALTHCHECK_STATE_DIR=str(tmp_path))
    out = run_cli("--only", "jupyter", "--json", env=env, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "tls-mismatch" in out.stdout
    # A base URL is not a secret, but this one carries the token's text: only the token field is
    # guaranteed to stay out, so check that the file's token field did not leak on its own.
    assert out.stdout.count(TOKEN) <= out.stdout.count(f"/{TOKEN}/")


def _malformed(live: str) -> dict[str, str]:
    return {"truncated": live[: len(live) // 2], "trailing-comma": live.rstrip().rstrip("}") + ",}",
            "nul-in-a-string": live.replace('"/"', '"/\x00"', 1), "control-character": live.replace('"/"', '"/\x1b"', 1)}


@pytest.mark.parametrize("damage", ["truncated", "trailing-comma", "nul-in-a-string", "control-character"])
def test_a_malformed_runtime_file_is_refused_in_a_fresh_run(jupyter: Jupyter, tmp_path: Path, damage: str) -> None:
    """The notebook user writes the runtime dir: a file cut mid-write or malformed is refused and the
    server is still found, however the run was started (--only, --skip, no fast path: no json imported)."""
    rt = tmp_path / "rt"
    rt.mkdir()
    live = next(jupyter.runtime.glob("jpserver-*.json"))
    (rt / "jpserver-1.json").write_text(_malformed(live.read_text())[damage])
    env = clean_env(HEALTHCHECK_JUPYTER_RUNTIME_DIR=str(rt), HEALTHCHECK_JUPYTER_PORT=str(jupyter.port),
                    HEALTHCHECK_STATE_DIR=str(tmp_path / "state"),
                    **{t: "false" for t in ("ENABLE_GPU_CHECK", "ENABLE_RUNTIME_CHECK", "ENABLE_TORCH_CHECK",
                                            "ENABLE_SSH_CHECK", "ENABLE_JUPYTER_KERNEL_CHECK")})
    for flags in (("--only", "jupyter"), ("--skip", "ssh", "--profile", "liveness"), ("--json",)):
        out = run_cli(*flags, env=env, timeout=60)
        assert out.returncode == 0, (flags, out.stdout + out.stderr)
        assert "internal" not in out.stdout + out.stderr, (flags, out.stdout)
