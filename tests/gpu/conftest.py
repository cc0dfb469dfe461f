"""This folder is named gpu, so every test in it has "gpu" among its pytest keywords, and the
skip hook in tests/conftest.py (which looks at keywords) skips them all on a machine without a
GPU. Only tests that carry the gpu marker need a GPU: the skip is taken back from the others
here (test_verify.py checks make gpu-verify's scripts and must run everywhere).
"""

from __future__ import annotations

import pytest

HERE = __file__.rsplit("/", 1)[0] + "/"
GPU_SKIP = "needs a real NVIDIA GPU"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not str(item.path).startswith(HERE) or item.get_closest_marker("gpu") is not None:
            continue
        item.own_markers[:] = [m for m in item.own_markers
                               if not (m.name == "skip" and GPU_SKIP in str(m.kwargs.get("reason", "")))]
