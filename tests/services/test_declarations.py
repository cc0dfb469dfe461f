"""Each services probe is one module that declares it (``SPEC``, causes, settings) beside its
gather and judge. Reading every declaration imports the probes' modules and what each pass of them
uses (the runner imports those before any probe's thread starts), none of the heavy clients a probe
loads only while it starts a kernel or a login (a check reads the declarations from probes/index.py:
tests/core/test_startup.py)."""

from __future__ import annotations

import subprocess
import sys

from probes import registry
from tests.conftest import ROOT

SCRIPT = ("import sys\nfrom probes import registry\n"
          "print(' '.join(s.name for s in registry.PROBES if s.layer == 'services'))\n"
          "print(' '.join(sorted(m for m in sys.modules if m.startswith('probes.services') or m in HEAVY)))\n")
HEAVY = ("websocket", "ssl", "subprocess", "http.client", "psutil", "uuid", "platform", "ctypes")


def test_the_declarations_are_read_from_the_probes_own_modules_and_what_they_share():
    res = subprocess.run([sys.executable, "-I", "-c", f"HEAVY = {HEAVY!r}\n{SCRIPT}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True)
    names, modules = res.stdout.splitlines()
    assert names == "jupyter jupyter-kernel ssh ssh-keys ssh-login"
    assert modules.split() == ["probes.services", "probes.services.common", "probes.services.jupyter",
                               "probes.services.jupyter_kernel", "probes.services.kernel_run",
                               "probes.services.net", "probes.services.ssh", "probes.services.ssh_keys",
                               "probes.services.ssh_login"]


def test_each_probe_module_declares_itself():
    for spec in (s for s in registry.PROBES if s.layer == "services"):
        module = spec.load()
        assert module.SPEC is spec and (module.NAME, module.__name__) == (spec.name, spec.module)
