"""`python -m probes`: the suite's entry point (the front door calls probes.cli.entry the same way)."""

from probes.cli import entry

entry()
