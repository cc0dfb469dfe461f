"""Start-up stays light: what a liveness run imports is checked here, its speed by make bench
(docs/development.md, "Start-up policy"; the figures: docs/benchmark.md).

A liveness run with its services off needs none of these modules. ``enum`` (with ``functools`` and
``collections``) is not among them: the image's liveness run loads it anyway (the jupyter probe's
``json`` imports ``re``, which imports ``enum``).
"""

from __future__ import annotations

import subprocess
import sys

from probes import registry
from tests.conftest import ROOT, clean_env

HEAVY = ("typing", "ctypes", "subprocess", "json", "re", "argparse", "logging", "datetime", "psutil", "pynvml",
         "ssl", "http.client", "email", "encodings.idna", "struct",
         # each a millisecond or so, which liveness (3x a bare interpreter in make bench) cannot spare
         "contextlib", "importlib", "socket",
         "selectors", "encodings.utf_8_sig",
         # what a probe needs only while it runs, never to be declared
         "probes.proc", "probes.hardware.nvml_lib", "probes.framework.torch_worker",
         "probes.framework.model_worker", "probes.framework.nccl_worker", "probes.framework.checkpoint_child",
         "probes.framework.cuda_errors",
         # drop-ins: nothing of them where their directory does not exist (the image has none)
         "probes.dropins",
         # the services' sockets, jupyter-kernel's client and its run: never with the services off
         "websocket", "probes.services.net", "probes.services.kernel_run")
SCRIPT = ("import sys\nfrom probes.cli import main\ncode = main(['--profile', 'liveness'])\n"
          "print(','.join(sorted(m for m in sys.modules if m in {heavy!r})))\n")


def test_every_module_of_the_suite_named_heavy_exists():
    """A name left behind by a removed or renamed module would hold nothing."""
    missing = [m for m in HEAVY if m.startswith("probes.") and not (ROOT / (m.replace(".", "/") + ".py")).is_file()]
    assert missing == []


def services_off(tmp_path, **extra):
    """A run's environment with every probe but torch-cuda (which reads only the latch) off."""
    return clean_env(HEALTHCHECK_STATE_DIR=str(tmp_path / "state"), HEALTHCHECK_CHECKS_DIR=str(tmp_path / "none"),
                     **{t: "false" for t in registry.TOGGLES if t != "ENABLE_TORCH_CHECK"}, **extra)


def test_a_liveness_run_imports_none_of_the_heavy_modules(tmp_path):
    """Nor any probe module but the one it runs: the others' declarations come from probes/index.py."""
    env = services_off(tmp_path)
    others = {*registry.MODULES, *registry.PLUGINS} - {"probes.framework.torch_cuda"}
    res = subprocess.run([sys.executable, "-I", "-c", SCRIPT.format(heavy={*HEAVY, *others})], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("healthy: liveness:"), res.stdout
    assert lines[-1] == "", f"a liveness run imported: {lines[-1]} (docs/development.md, Start-up policy)"



def test_a_check_imports_nothing_of_serve(tmp_path):
    """serve is one optional part: the check path (cli, config, runner, report, notice) never loads it."""
    env = services_off(tmp_path, HEALTHCHECK_NOTICE_FILE=str(tmp_path / "notice" / "notice"),
                       _HEALTHCHECK_NOTICE_LOG=str(tmp_path / "log"))
    script = ("import sys\nfrom probes.cli import main\nmain(['--profile', 'startup'])\n"
              "print(','.join(sorted(m for m in sys.modules if m.startswith('probes.serve'))))\n")
    res = subprocess.run([sys.executable, "-I", "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[-1] == "", res.stdout
