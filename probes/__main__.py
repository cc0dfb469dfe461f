"""`python -m probes`: the suite's entry point (the `healthcheck` front door runs this)."""

import sys

from probes.cli import main

sys.exit(main())
