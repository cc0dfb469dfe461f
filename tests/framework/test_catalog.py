"""The framework probes' catalog: a judge names a cause and the detail it saw, the CUDA error table's
classes map to causes, and the settings are declared once."""

from __future__ import annotations

import pytest

from probes import config
from probes.framework import cuda_errors, deep, torch_cuda
from probes.spec import Declared

from .test_cuda_errors import TAIL, judged


def test_each_class_of_the_cuda_table_is_a_cause_of_torch_cuda() -> None:
    defaults = {cuda_errors.STICKY: deep.CUDA_FATAL, cuda_errors.OTHER: deep.CUDA_ERROR}
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


def test_the_torch_settings_are_declared_once() -> None:
    assert issubclass(deep.Torch, Declared) and torch_cuda.SPEC.settings == deep.Torch.SETTINGS
    got = config.load({"HEALTHCHECK_TORCH_DEVICE": "cpu", "HEALTHCHECK_TORCH_TTL": "7"}).of(deep.Torch)
    assert (got.torch_device, got.torch_python, got.torch_ttl, got.torch_min_free_mib) == ("cpu", "python3", 7.0,
                                                                                          1024)
