"""The CLI fast path: fastpath.lookup against a real running server's serve.json."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from probes import config
from probes.result import Status
from probes.serve import fastpath
from probes.state import State
from tests.serve.conftest import ALL_OFF, write_exe

REPORT = {"status": "warn", "version": "0.1.0", "description": "x", "profile": "readiness", "output": "ok",
          "time": "2026-01-01T00:00:00+00:00", "notes": [],
          "checks": {"ssh:banner": [{"componentType": "services", "status": "warn", "observedValue": 1.5,
                                     "observedUnit": "ms", "time": "2026-01-01T00:00:00+00:00",
                                     "output": "slow banner", "reason": "slow", "elapsed": 0.01,
                                     "skipped": False}]}}


def _server(start_server, tmp_path: Path, **extra: str):
    env_file = tmp_path / "child-env"
    stub = write_exe(tmp_path / "stub-python", f"""#!/bin/sh
echo "FASTPATH=$HEALTHCHECK_FASTPATH" >> {env_file}
cat <<'EOF'
{json.dumps(REPORT)}
EOF
""")
    srv = start_server(dict(ALL_OFF, HEALTHCHECK_SERVE_PYTHON=str(stub), **extra), "--interval", "0.5")
    srv.wait_for("/readyz", lambda c, b: c == 200, 20, "readiness answered")
    return srv, env_file


def _cli_config(srv, **changes: str) -> config.Config:
    env = {k: v for k, v in srv.env.items() if k != "HEALTHCHECK_SERVE_PYTHON"}
    env.update(changes)
    return config.load(env, profile="readiness")


def test_lookup_returns_the_servers_fresh_results(start_server, tmp_path, monkeypatch):
    monkeypatch.delenv("HEALTHCHECK_FASTPATH", raising=False)
    srv, env_file = _server(start_server, tmp_path)
    results = fastpath.lookup(_cli_config(srv), State.open(str(srv.state)))
    assert results is not None and [r.name for r in results] == ["ssh"]
    r = results[0]
    assert r.status is Status.WARN and r.reason == "slow" and r.message == "slow banner"
    assert r.observed == 1.5 and r.unit == "ms"
    # The monitor's own runs are told not to take the fast path.
    assert set(env_file.read_text().split()) == {"FASTPATH=false"}

    monkeypatch.setenv("HEALTHCHECK_FASTPATH", "false")
    assert fastpath.lookup(_cli_config(srv), State.open(str(srv.state))) is None
    monkeypatch.delenv("HEALTHCHECK_FASTPATH")
    # Another configuration (here: the ssh probe on) must probe for itself.
    assert fastpath.lookup(_cli_config(srv, ENABLE_SSH_CHECK="true"), State.open(str(srv.state))) is None
    assert fastpath.lookup(dict_replace(_cli_config(srv), skip=("ssh",)), State.open(str(srv.state))) is None

    saved = (srv.state / "serve.json").read_text()
    assert srv.terminate() == 0
    assert fastpath.lookup(_cli_config(srv), State.open(str(srv.state))) is None  # file removed
    # A leftover file from a server that is gone (its pid no longer exists) is ignored.
    dead = subprocess.Popen(["true"])
    dead.wait()
    data = json.loads(saved)
    data["pid"] = dead.pid
    (srv.state / "serve.json").write_text(json.dumps(data))
    assert fastpath.lookup(_cli_config(srv), State.open(str(srv.state))) is None


def test_lookup_ignores_stale_and_latched_results(start_server, tmp_path, monkeypatch):
    monkeypatch.delenv("HEALTHCHECK_FASTPATH", raising=False)
    srv, _ = _server(start_server, tmp_path, HEALTHCHECK_SERVE_SLACK="0")
    state = State.open(str(srv.state))

    def found_fresh() -> bool:
        # With zero slack a result is stale for a moment between two runs: poll briefly.
        end = time.monotonic() + 5
        while time.monotonic() < end:
            if fastpath.lookup(_cli_config(srv), state) is not None:
                return True
            time.sleep(0.05)
        return False

    assert found_fresh()
    # Stop the monitor's runs from refreshing (SIGSTOP the server), then let the result age.
    os.kill(srv.proc.pid, 19)
    try:
        time.sleep(1.0)
        assert fastpath.lookup(_cli_config(srv), state) is None
    finally:
        os.kill(srv.proc.pid, 18)
    assert found_fresh()
    state.set_latch("torch-cuda", "fatal CUDA error")
    assert fastpath.lookup(_cli_config(srv), state) is None
    assert srv.terminate() == 0


def dict_replace(cfg: config.Config, **kw):
    return cfg._replace(**kw)
