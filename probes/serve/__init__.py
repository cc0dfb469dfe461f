"""`healthcheck serve`: HTTP health endpoints and Prometheus metrics from a monitor's runs in child
processes (docs/architecture.md, "Serve"; docs/serve.md).
"""
