"""The checks of `make gpu-verify` (started by tests/gpu/verify.sh; its header is the help).

    python tests/gpu/verify.py --out DIR --work DIR --suite-python PY --torch-python PY \
        [--install FILE] [--fake]

Every check runs on its own: a failure (or a bug here) is recorded as FAIL with the reason
and the next check runs. result.json and summary.md in --out are rewritten after every
check, so even a run cut short leaves a summary; logs/ beside them keeps each command's
output. Exit status 0 when no check failed, 1 otherwise.

Processes started here carry GPU_VERIFY_MARK=<run id> in their environment (children
inherit it), which is how "nothing is left behind" is checked. Loopback only: the one
server talked to is the `healthcheck serve` started here.

The checks live beside this file, by what they verify: verify_core.py (what they share:
running commands, the result files), verify_runs.py (steps 0-2: install, first CUDA
context, pytest -m gpu, every profile), verify_faults.py (step 3), verify_serve.py (step 4),
verify_timings.py (step 5).
"""

from __future__ import annotations

import argparse
import sys
import traceback

from verify_core import FAIL
from verify_faults import FaultChecks
from verify_runs import RunChecks
from verify_serve import ServeChecks
from verify_timings import TimingChecks


class Verify(RunChecks, FaultChecks, ServeChecks, TimingChecks):
    """Every step, in order."""

    def main(self) -> int:
        mode = "FAKE self-test (fake NVML, stub nvidia-smi, CPU torch)" if self.fake else "real GPU"
        print(f"gpu-verify: {mode}; results in {self.out}", flush=True)
        for step in (self.step0, self.step1, self.step2, self.step3, self.step4, self.step5):
            try:
                step()
            except Exception as exc:  # a bug between checks: recorded, the next step still runs
                self.log("internal-step", traceback.format_exc())
                self.record(f"{step.__name__} (between checks)", FAIL, f"{type(exc).__name__}: {exc}")
        self.save()
        print(f"\ngpu-verify: {self.verdict()}; summary: {self.out / 'summary.md'}", flush=True)
        return 1 if any(c["status"] == FAIL for c in self.checks) else 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="the checks of make gpu-verify (see tests/gpu/verify.sh --help)")
    p.add_argument("--out", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--suite-python", required=True)
    p.add_argument("--torch-python", required=True)
    p.add_argument("--install", default=None, help="the install step's result (JSON) from verify.sh")
    p.add_argument("--fake", action="store_true")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(Verify(parse_args(sys.argv[1:])).main())
