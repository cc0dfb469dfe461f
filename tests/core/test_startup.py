"""Start-up stays light: what a liveness run imports is checked here, its speed by make bench.

The policy and what each module costs are in docs/development.md, "Start-up policy".

Every run reads every probe's declaration, so a probe module's top-level imports are paid
by all of them, liveness included. These modules each cost a millisecond or more and a
liveness run with its services off needs none of them.
"""

from __future__ import annotations

import subprocess
import sys

from probes import registry
from tests.conftest import ROOT, clean_env

HEAVY = ("typing", "ctypes", "subprocess", "json", "re", "argparse", "logging", "datetime", "psutil", "pynvml",
         "ssl", "http.client", "email", "encodings.idna", "struct",
         # each a millisecond or so, which liveness (3x a bare interpreter in make bench) cannot spare
         "collections", "contextlib", "functools", "threading", "importlib", "enum", "signal", "socket",
         "selectors", "encodings.utf_8_sig",
         # what a probe needs only while it runs, never to be declared
         "probes.proc", "probes.hardware.nvml_lib", "probes.hardware.nvml_read", "probes.framework.torch_worker",
         "probes.framework.model_worker", "probes.framework.nccl_worker", "probes.framework.checkpoint_child",
         "probes.framework.free_memory", "probes.framework.cuda_errors",
         # the services' sockets, jupyter-kernel's client and its run: never with the services off
         "websocket", "probes.services.net", "probes.services.kernel_run")
SCRIPT = ("import sys\nfrom probes.cli import main\ncode = main(['--profile', 'liveness'])\n"
          "print(','.join(sorted(m for m in sys.modules if m in {heavy!r})))\n")


def test_a_liveness_run_imports_none_of_the_heavy_modules(tmp_path):
    env = clean_env(HEALTHCHECK_STATE_DIR=str(tmp_path / "state"), HEALTHCHECK_CHECKS_DIR=str(tmp_path / "none"),
                    **{t: "false" for t in registry.TOGGLES if t != "ENABLE_TORCH_CHECK"})
    res = subprocess.run([sys.executable, "-I", "-c", SCRIPT.format(heavy=set(HEAVY))], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("healthy: liveness:"), res.stdout
    assert lines[-1] == "", f"a liveness run imported: {lines[-1]} (docs/development.md, Start-up policy)"


def test_the_policy_is_written_where_these_tests_point():
    policy = (ROOT / "docs" / "development.md").read_text()
    assert "## Start-up policy" in policy
    assert all(f"`{name}`" in policy for name in ("typing", "re", "json", "dataclasses", "logging")), policy
