"""Adding a probe is one module and one registry line: a throwaway plug-in shows it.

The probe lives in a temporary package on PYTHONPATH, and the one registry line (in ``PLUGINS``) is
added by a ``sitecustomize`` there (so every interpreter of the test, serve's monitor runs included,
sees it); nothing else in the suite is edited. It then appears in --help, obeys its own ENABLE_*
toggle and setting validation, runs under --only, appears in --json, in serve's endpoints and in
/metrics. The opt-in deep checks load the same way.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from probes import config, registry, spec
from tests.conftest import ROOT, clean_env
from tests.servers import free_port, stop

PROBE = '''
"""echo: a line sent to an echo service on HEALTHCHECK_ECHO_PORT comes back."""
import socket

from probes.spec import ALL_PROFILES, PORT, Cause, Declared, Spec, setting
from probes.result import passed, verdict

NAME = "echo"


class Settings(Declared):
    echo_port: int = setting("HEALTHCHECK_ECHO_PORT", PORT, 7, "echo service port")


REFUSED = Cause("refused", "fail", "nothing listens", "start the echo service", "restart-app", "tenant")
SPEC = Spec(NAME, layer="services", module=__name__, toggle="ENABLE_ECHO_CHECK", timeout=2.0, profiles=ALL_PROFILES,
            measurement="roundTrip", about="an echo service sends back what it gets", settings=Settings.SETTINGS,
            causes=(REFUSED,))


def gather(ctx):
    try:
        port = ctx.config.of(Settings).echo_port
        with socket.create_connection((ctx.config.host, port), timeout=ctx.remaining()) as s:
            s.sendall(b"ping\\n")
            return s.recv(16)
    except OSError:
        return None


def judge(data, ctx):
    port = ctx.config.of(Settings).echo_port
    if data == b"ping\\n":
        return passed(NAME, f"echo on port {port} answered", observed=1, unit="lines")
    return verdict(NAME, REFUSED, f"no echo on port {port}")
'''


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    pkg = tmp_path / "throwaway"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "echo_probe.py").write_text(PROBE)
    (tmp_path / "sitecustomize.py").write_text(
        "import probes.registry as r\nr.PLUGINS = (*r.PLUGINS, 'throwaway.echo_probe')  # the one registry line\n")
    return tmp_path


@pytest.fixture
def echo_port():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop_flag = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop_flag.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(conn.recv(64))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop_flag.set()
    t.join(2)
    srv.close()


def env_for(plugin: Path, **extra: str) -> dict[str, str]:
    off = {t: "false" for t in registry.TOGGLES}
    return clean_env(PYTHONPATH=str(plugin), HEALTHCHECK_STATE_DIR=str(plugin / "state"),
                     HEALTHCHECK_CHECKS_DIR=str(plugin / "none"), **off, **extra)


def cli(plugin: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "probes", *args], env=env_for(plugin, **env), cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_opt_in_deep_checks_are_plug_ins_off_unless_turned_on():
    """The core's list is what every image runs; model, checkpoint and nccl are named as plug-ins are."""
    core = {spec.load(m).SPEC.name for m in registry.MODULES}
    plugins = {s.name: s for s in (spec.load(m).SPEC for m in registry.PLUGINS)}
    assert set(plugins) == {"checkpoint", "model", "nccl"} and not core & set(plugins)
    assert all(not s.default_on and s.module in registry.PLUGINS for s in plugins.values())
    selected = {s.name for s in config.load({}).selected()}
    assert core - selected == {"ssh-login"} and not selected & set(plugins)  # ssh-login: on with its key
    on = {"ENABLE_CHECKPOINT_CHECK": "true", "ENABLE_NCCL_CHECK": "yes", "HEALTHCHECK_MODEL_PATH": "/m.pt"}
    assert {s.name for s in config.load(on).selected()} >= set(plugins)


def test_help_lists_it_with_its_toggle_and_setting(plugin):
    out = cli(plugin, "--help").stdout
    assert "echo (services, ENABLE_ECHO_CHECK): an echo service sends back what it gets" in " ".join(out.split())
    assert "HEALTHCHECK_ECHO_PORT" in out


def test_its_toggle_and_setting_are_validated(plugin):
    res = cli(plugin, ENABLE_ECHO_CHECK="maybe")
    assert res.returncode == 3 and "ENABLE_ECHO_CHECK='maybe' is not a boolean" in res.stderr
    res = cli(plugin, HEALTHCHECK_ECHO_PORT="70000")
    assert res.returncode == 3 and "HEALTHCHECK_ECHO_PORT='70000' is not a port number" in res.stderr


def test_it_runs_under_its_toggle_and_only_and_reports_in_json(plugin, echo_port):
    res = cli(plugin, "--json", ENABLE_ECHO_CHECK="true", HEALTHCHECK_ECHO_PORT=str(echo_port))
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and list(doc["checks"]) == ["echo:roundTrip"]
    assert doc["checks"]["echo:roundTrip"][0]["status"] == "pass"
    res = cli(plugin, "--only", "echo", HEALTHCHECK_ECHO_PORT="1")
    assert res.returncode == 1 and "FAIL echo" in res.stdout and "no echo on port 1" in res.stdout
    assert cli(plugin, ENABLE_ECHO_CHECK="false").stdout.startswith("healthy: all checks disabled")


def test_serve_and_metrics_carry_it(plugin, echo_port):
    port = free_port()
    env = env_for(plugin, ENABLE_ECHO_CHECK="true", HEALTHCHECK_ECHO_PORT=str(echo_port),
                  HEALTHCHECK_SERVE_XID_WATCH="false", HEALTHCHECK_SERVE_INTERVAL="1")
    proc = subprocess.Popen([sys.executable, "-m", "probes", "serve", "--port", str(port)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        end = time.monotonic() + 30
        doc: dict = {}
        while time.monotonic() < end and "echo:roundTrip" not in doc.get("checks", {}):
            time.sleep(0.3)
            try:
                with opener.open(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                    doc = json.loads(r.read())
            except OSError:
                continue
        assert doc["checks"]["echo:roundTrip"][0]["status"] == "pass", doc
        with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            metrics = r.read().decode()
        assert 'probe="echo"' in metrics
    finally:
        stop(proc)
