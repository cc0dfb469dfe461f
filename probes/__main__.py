"""`python -m probes`: the suite's entry point (the front door calls probes.cli.main the same way)."""

import sys

from probes.cli import main

sys.exit(main())
