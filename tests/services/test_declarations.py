"""The services layer's declarations live in its package: read without importing a probe's module."""

from __future__ import annotations

import subprocess
import sys

from probes import services
from probes.spec import load
from tests.conftest import ROOT

SCRIPT = ("import sys\nfrom probes import services\n"
          "print(' '.join(s.name for s in services.SPECS))\n"
          "print(' '.join(sorted(m for m in sys.modules if m.startswith('probes'))))\n")


def test_the_layer_declares_its_probes_without_importing_them():
    res = subprocess.run([sys.executable, "-I", "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True)
    names, modules = res.stdout.splitlines()
    assert names == "jupyter jupyter-kernel ssh ssh-keys ssh-login"
    assert set(modules.split()) <= {"probes", "probes.record", "probes.services", "probes.spec"}, modules


def test_each_probe_module_binds_its_declaration_from_the_package():
    for spec in services.SPECS:
        module = load(spec.module)
        assert module.SPEC is spec and spec.name == module.NAME, spec.module
