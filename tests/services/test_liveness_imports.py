"""Liveness with its real services (sshd and Jupyter Server) imports no heavy module but json
and socket.

tests/core/test_startup.py checks a liveness run with the services off; the service probes
talk to real servers here, as they do in make bench and in the image. The Jupyter probe reads
JSON (its runtime file, the server's reply) through the public json API and both probes speak
through socket, so these and what they import (re, enum, selectors...: measured here, they
differ between Python versions) are the exceptions (docs/development.md, "Start-up policy").
"""

from __future__ import annotations

import subprocess
import sys

from probes import registry
from tests.conftest import ROOT, clean_env
from tests.core.test_startup import HEAVY, SCRIPT


def imported_by(*modules: str) -> set[str]:
    """The modules importing ``modules`` brings into a bare interpreter (-I -S: nothing else loaded)."""
    script = f"import sys\nbefore = set(sys.modules)\nimport {', '.join(modules)}\n" \
        "print(' '.join(set(sys.modules) - before))\n"
    res = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True,
                         timeout=60, check=True)
    return set(res.stdout.split())


def test_liveness_with_real_services_imports_no_heavy_module_but_json_and_socket(tmp_path, sshd, jupyter):
    # The services layer on, with its servers; every other probe off but the latch reader.
    services = [s for s in registry.PROBES if s.layer == "services" and "liveness" in s.profiles]
    off = {s.toggle for s in registry.PROBES} - {s.toggle for s in services} - {"ENABLE_TORCH_CHECK"}
    env = clean_env(HEALTHCHECK_STATE_DIR=str(tmp_path / "state"), HEALTHCHECK_CHECKS_DIR=str(tmp_path / "none"),
                    HEALTHCHECK_SSH_PORT=str(sshd.port), HEALTHCHECK_JUPYTER_PORT=str(jupyter.port),
                    HEALTHCHECK_JUPYTER_RUNTIME_DIR=str(jupyter.runtime), **{t: "false" for t in off})
    heavy = set(HEAVY) - imported_by("json", "socket") - {"probes.services.net"}  # the probes' own client
    heavy |= {e.module for e in registry.ENTRIES if "liveness" not in e.profiles}  # declared in probes/index.py
    res = subprocess.run([sys.executable, "-I", "-c", SCRIPT.format(heavy=heavy)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("healthy: liveness:") and all(s.name in lines[0] for s in services), res.stdout
    assert lines[-1] == "", f"a liveness run imported: {lines[-1]}"
