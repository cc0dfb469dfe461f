"""The framework probes' catalog: every cause says who acts and how, a judge names a cause and the
detail it saw (never a remedy of its own), the CUDA error table's classes map to causes, and the
settings are declared once."""

from __future__ import annotations

import ast

import pytest

from probes import config
from probes import framework as fw
from probes.framework import cuda_errors, deep, torch_cuda
from probes.registry import PROBES
from probes.spec import ACTIONS, ACTORS, Declared
from tests.core import test_catalog as catalog

from .test_cuda_errors import TAIL, judged

FRAMEWORK = [s for s in PROBES if s.layer == "framework"]


@pytest.mark.parametrize("spec", FRAMEWORK, ids=lambda s: s.name)
def test_every_cause_says_who_acts_and_how(spec) -> None:
    for cause in spec.causes:
        assert (cause.action in ACTIONS, cause.actor in ACTORS) == (True, True), (spec.name, cause)


def test_each_class_of_the_cuda_table_is_a_cause_of_torch_cuda() -> None:
    defaults = {cuda_errors.STICKY: fw.CUDA_FATAL, cuda_errors.OTHER: fw.CUDA_ERROR}
    for error in (*cuda_errors.TABLE, *cuda_errors.LIBRARY):
        assert error.cause in torch_cuda.SPEC.causes, error.name
        assert error.cause is defaults.get(error.category, error.cause), error.name


@pytest.mark.parametrize(("message", "reason", "action", "actor"), [
    ("CUDA error: an illegal memory access was encountered\n" + TAIL, "cuda-fatal", "restart-container",
     "operator"),
    ("Error 803: system has unsupported display driver / cuda driver combination", "driver-mismatch",
     "reboot-node", "operator"),
    ("CUDA error: out of memory", "oom", "none", "tenant"),
    ("CUDA error: no kernel image is available for execution on the device", "cuda-error", "fix-config", "tenant"),
])
def test_a_verdict_carries_its_causes_actor_and_action(message: str, reason: str, action: str, actor: str) -> None:
    result = judged(message)
    assert (result.reason, result.action, result.actor) == (reason, action, actor), result.message


# The framework's modules that judge (the workers are stand-alone scripts: no probes import there).
FRAMEWORK_FILES = [p for p in catalog.judge_modules() if "framework" in p.parts and "from probes" in p.read_text()]


def test_the_framework_keeps_what_the_whole_catalog_asks() -> None:
    """tests/core/test_catalog.py, held here for the framework alone: a reason once per probe, no reason
    code and no remedy typed in a judge, no phrase split by the formatter."""
    for spec in FRAMEWORK:
        reasons = [c.reason for c in spec.causes]
        assert len(reasons) == len(set(reasons)), spec.name
    remedies = {c.remedy.replace("`", "") for _, c in catalog.tables() if len(c.remedy) >= 24}
    for path in FRAMEWORK_FILES:
        source = path.read_text()
        assert not list(catalog.SCRAP.finditer(source)), path.name
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                assert name not in ("failed", "warned", "skipped"), f"{path.name}:{node.lineno}: {name}()"
                assert "reason" not in {k.arg for k in node.keywords}, f"{path.name}:{node.lineno}"
        for line, text in catalog._texts(ast.parse(source)):
            assert not [r for r in remedies if r in text], f"{path.name}:{line}"


def test_the_torch_settings_are_declared_once() -> None:
    assert issubclass(fw.Torch, Declared) and torch_cuda.SPEC.settings == fw.Torch.SETTINGS
    assert not hasattr(torch_cuda, "Settings") and deep.Torch is fw.Torch  # one name: Torch
    got = config.load({"HEALTHCHECK_TORCH_DEVICE": "cpu", "HEALTHCHECK_TORCH_TTL": "7"}).of(fw.Torch)
    assert (got.torch_device, got.torch_python, got.torch_ttl, got.torch_min_free_mib) == ("cpu", "python3", 7.0,
                                                                                          1024)


MODULES = ("probes.framework.checkpoint", "probes.framework.torch_cuda", "probes.framework.model",
           "probes.framework.nccl")


def test_the_layer_declares_its_probes_and_each_module_keeps_its_own() -> None:
    assert [s.module for s in fw.SPECS] == list(MODULES)
    for spec in fw.SPECS:
        assert spec.load().SPEC is spec, spec.name


def test_reading_the_declarations_imports_no_probe_module() -> None:
    """A run reads every probe's declaration; the modules (gather, judge) are imported only to run."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = ("import sys; from probes import framework; framework.SPECS; "
            f"print([m for m in {MODULES!r} + ('probes.framework.deep', 'probes.framework.cuda_errors') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-I", "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
