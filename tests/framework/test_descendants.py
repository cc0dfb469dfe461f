"""The torch worker's interpreter leaves descendants behind: the whole CLI ends them all.

The stand-in for the image's python (HEALTHCHECK_TORCH_PYTHON) starts a setsid grandchild,
a double-forking daemon, a fork storm of 100, or forks from its SIGTERM handler, and then
answers garbage or hangs; the run (device cpu, GPU checks off) must fail with its own
diagnosis by its deadline and leave no process behind.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import clean_env, run_cli
from tests.descendants import hang, leave, term_fork
from tests.framework.conftest import Interp
from tests.servers import wait_gone

pytestmark = pytest.mark.loaded  # under load too: make loaded (Makefile)

SLACK = 0.5


@pytest.mark.parametrize(("kind", "then"), [
    ("setsid", "garbage"),
    ("double-fork", "garbage"),
    ("storm", "garbage"),
    ("setsid", "hang"),
    ("double-fork", "hang"),
    ("storm", "hang"),
    ("term-fork", "hang"),
])
def test_torch_worker_descendants_are_ended(kind: str, then: str, make_interp: Callable[..., Interp],
                                            tmp_path: Path) -> None:
    marker = f"hc-torch-{uuid.uuid4().hex[:12]}"
    if kind == "term-fork":
        body = term_fork(marker)
    else:
        after = "echo 'not a result line'; exit 0" if then == "garbage" else hang(marker)
        body = f"{leave(kind, marker)}\n{after}"
    py = make_interp(f"leaver-{kind}", body=body)
    timeout = 3.0
    env = clean_env(ENABLE_GPU_CHECK="false", ENABLE_JUPYTER_CHECK="false", ENABLE_SSH_CHECK="false",
                    HEALTHCHECK_TORCH_DEVICE="cpu", HEALTHCHECK_TORCH_PYTHON=str(py),
                    HEALTHCHECK_TIMEOUT=str(timeout), HEALTHCHECK_STATE_DIR=str(tmp_path / "state"))
    start = time.monotonic()
    r = run_cli("--profile", "startup", "--json", env=env, timeout=60)
    took = time.monotonic() - start
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    reason = json.loads(r.stdout)["checks"]["torch-cuda:devices"][0]
    assert reason["status"] == "fail", reason
    assert took <= timeout + SLACK + 1.0, f"took {took:.2f}s"  # + the interpreter's start
    left = wait_gone(marker)
    for p in left:
        p.kill()
    assert [" ".join(p.info["cmdline"] or []) for p in left] == []
