"""Every health+json document the suite emits validates against the draft's schema.

The CLI's --json (each profile, passing, warning and failing) and serve (each endpoint,
one check alone, 200, 503 and 404 bodies, and the fixed 500 body) are real runs; the
schema (health-json.schema.json, next to this file) is written from
draft-inadarei-api-health-check and checked against its own meta-schema.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator, FormatChecker

from probes import registry
from probes.serve import httpd
from tests.conftest import ROOT, clean_env
from tests.serve.conftest import ALL_OFF, write_exe

SCHEMA = json.loads((Path(__file__).parent / "health-json.schema.json").read_text())
ALL = "# healthcheck: profiles=startup,readiness,liveness timeout=5\n"
PROFILES = ("startup", "readiness", "liveness")


def problems(doc: Any) -> list[str]:
    validator = Draft202012Validator(SCHEMA, format_checker=FormatChecker())
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def checks_dir(tmp_path: Path, *codes: int) -> Path:
    d = tmp_path / f"checks-{'-'.join(map(str, codes))}"
    d.mkdir(mode=0o755)
    for i, code in enumerate(codes):
        write_exe(d / f"c{i}", f"#!/bin/sh\n{ALL}echo 'exit {code} | load=1.5s;5;10'\nexit {code}\n")
    write_exe(d / "plain", f"#!/bin/sh\n{ALL}echo 'no performance data'\n")
    return d


def test_the_schema_is_a_valid_2020_12_schema_and_rejects_what_the_draft_does():
    Draft202012Validator.check_schema(SCHEMA)
    good = {"status": "pass", "checks": {"gpu:count": [
        {"status": "pass", "componentType": "system", "observedValue": 2, "observedUnit": "GPUs",
         "time": "2026-01-01T00:00:00.000Z"}]}}
    assert problems(good) == []
    check = good["checks"]["gpu:count"][0]
    for bad in ({"status": "ok"}, {"componentType": "hardware"}, {"output": "fine"}, {"time": None},
                {"time": "2026-01-01T00:00:00+00:00"}, {"observedUnit": None}, {"observedValue": None},
                {"status": "fail"}, {"status": "fail", "output": "gone", "action": "reset-gpu"},
                {"status": "warn", "output": "slow", "actor": "operator"},
                {"status": "fail", "output": "gone", "action": "pray", "actor": "operator"},
                {"status": "fail", "output": "gone", "action": "reset-gpu", "actor": "nobody"}):
        doc = {"status": "pass", "checks": {"gpu:count": [{**check, **bad}]}}
        for k, v in bad.items():
            if v is None:
                del doc["checks"]["gpu:count"][0][k]  # type: ignore[index]
        assert problems(doc), bad
    failing = {**check, "status": "fail", "output": "gone", "action": "reset-gpu", "actor": "operator"}
    assert problems({"status": "fail", "checks": {"gpu:count": [failing]}}) == []


def test_the_schema_knows_every_action_and_actor_the_catalog_declares():
    from probes import spec

    props = SCHEMA["$defs"]["check"]["properties"]
    assert tuple(props["action"]["enum"]) == spec.ACTIONS
    assert tuple(props["actor"]["enum"]) == spec.ACTORS


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("codes", [(0,), (0, 1), (0, 1, 2)], ids=["pass", "warn", "fail"])
def test_cli_json_validates(tmp_path: Path, profile: str, codes: tuple[int, ...]):
    off = {t: "false" for t in registry.TOGGLES}
    env = clean_env(**off, HEALTHCHECK_CHECKS_DIR=str(checks_dir(tmp_path, *codes)),
                    HEALTHCHECK_STATE_DIR=str(tmp_path / "state"), PATH="/usr/bin:/bin")
    if 2 in codes:  # a failing hardware layer: nvidia-smi is not on PATH, so what needs it is skipped
        env.update(ENABLE_GPU_CHECK="true", ENABLE_TORCH_CHECK="true", HEALTHCHECK_TORCH_DEVICE="cuda")
    r = subprocess.run([sys.executable, "-m", "probes", "--json", "--profile", profile], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=120, check=False)
    doc = json.loads(r.stdout)
    assert doc["status"] == ("pass", "warn", "fail")[max(codes)], doc
    assert problems(doc) == [], doc
    assert doc["checks"]["c0:status"][0]["observedUnit"] == "s"
    if 2 in codes and profile != "liveness":
        assert "torch-cuda" in json.dumps(doc.get("skipped")), doc  # skipped: not a check


def get(port: int, path: str) -> tuple[int, str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers={"Accept": "application/health+json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", json.loads(resp.read())
    finally:
        conn.close()


@pytest.mark.parametrize("codes", [(0,), (0, 2)], ids=["pass", "fail"])
def test_serve_bodies_validate(start_server, tmp_path: Path, codes: tuple[int, ...]):
    srv = start_server(dict(ALL_OFF, HEALTHCHECK_CHECKS_DIR=str(checks_dir(tmp_path, *codes))),
                       "--interval", "0.5")
    srv.wait_runs_ended(30)
    want = 503 if 2 in codes else 200
    seen = set()
    for path in ("/livez", "/readyz", "/startupz", "/readyz/c0", "/livez?exclude=plain", "/nope",
                 "/readyz/nope"):
        code, ctype, doc = get(srv.port, path)
        seen.add(code)
        assert ctype == "application/health+json", path
        assert problems(doc) == [], (path, doc)
        assert code == (404 if "nope" in path else 200 if path == "/readyz/c0" else want), (path, doc)
    assert seen == {200, want, 404}


def test_the_fixed_error_bodies_validate():
    for body in (httpd.ERROR_BODY, httpd.NOT_FOUND_BODY):
        doc = json.loads(body)
        assert problems(doc) == []
        assert set(doc) >= {"status", "version", "description", "output", "notes", "checks", "reason"}
