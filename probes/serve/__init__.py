"""`healthcheck serve`: HTTP health endpoints and Prometheus metrics.

A monitor runs the profiles on a schedule, each run a separate
``python -m probes --json --profile P`` child under a deadline, and keeps the
latest report in memory; an NVML event watcher (its own child process) reports
Xid and ECC events. The HTTP handlers only read those in-memory snapshots, so a
wedged GPU, a hanging NVML call or a slow torch op can never block a response.

Command-line equivalent: ``healthcheck serve --host 127.0.0.1 --port 8779``, then
``curl -s localhost:8779/readyz``.
"""
