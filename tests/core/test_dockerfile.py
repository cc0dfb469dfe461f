"""The image's HEALTHCHECK: required by the lint, in exec form, and above our own deadline."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from probes import deadlines
from probes.spec import PROFILE_RULES
from tests.conftest import ROOT

HADOLINT = shutil.which("hadolint") or str(ROOT / ".venv" / "bin" / "hadolint")


def healthcheck_line() -> str:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [ln for ln in text.splitlines() if ln.startswith("HEALTHCHECK")]
    assert len(lines) == 1, "the Dockerfile needs exactly one HEALTHCHECK"
    return lines[0]


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HADOLINT, "--config", str(ROOT / ".hadolint.yaml"), str(path)],
                          capture_output=True, text=True, check=False)


@pytest.mark.skipif(not Path(HADOLINT).exists(), reason="needs hadolint (make setup)")
def test_lint_requires_the_healthcheck(tmp_path):
    assert lint(ROOT / "Dockerfile").returncode == 0
    stripped = re.sub(r"^HEALTHCHECK .*?CMD \[[^\]]*\]\n", "", (ROOT / "Dockerfile").read_text(),
                      flags=re.M | re.S)
    assert "HEALTHCHECK --" not in stripped  # the instruction itself is gone
    broken = tmp_path / "Dockerfile"
    broken.write_text(stripped)
    res = lint(broken)
    assert res.returncode != 0 and "DL3057" in res.stdout


def test_exec_form_and_timeout_above_the_front_doors_hard_stop():
    line = healthcheck_line()
    assert re.search(r'CMD \["/usr/local/bin/healthcheck"', line), "exec form, no shell in between"
    opts = {k: int(v) for k, v in re.findall(r"--([a-z-]+)=(\d+)s?\b", line)}
    # The front door TERMs the readiness run a few seconds after its deadline and KILLs it a
    # second later (probes/deadlines.py): Docker's own timeout must never fire first, or its
    # children are orphaned.
    readiness = PROFILE_RULES["readiness"].timeout
    assert opts["timeout"] >= deadlines.probe_timeout_floor(readiness)
    assert opts["start-period"] >= readiness
    assert set(opts) == {"interval", "timeout", "start-period", "start-interval", "retries"}


def test_the_notices_follow_the_healthcheck_and_their_readers_are_installed():
    from probes import notice

    opts = {k: int(v) for k, v in re.findall(r"--([a-z-]+)=(\d+)s?\b", healthcheck_line())}
    readiness = PROFILE_RULES["readiness"]
    # A verdict goes stale after readiness's period x retries; the start period is not told.
    assert (opts["interval"], opts["retries"]) == (readiness.period, readiness.retries)
    assert opts["start-period"] == notice.START_PERIOD
    text = (ROOT / "Dockerfile").read_text()
    assert "COPY docker/gpu-health-notice.sh /etc/profile.d/gpu-health-notice.sh" in text
    assert "COPY docker/ipython_kernel_config.py /etc/ipython/ipython_kernel_config.py" in text
