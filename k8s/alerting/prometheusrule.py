"""Render the alerting rules (k8s/alerting/rules.yaml) as the monitoring overlay's PrometheusRule.

The plain rule file is the one written by hand; the PrometheusRule in
k8s/overlays/monitoring/prometheusrule.yaml is this script's output, so the two cannot
drift (`make manifests` fails when they differ).

    python k8s/alerting/prometheusrule.py           # exit 0 if the overlay's copy is current, 1 if not
    python k8s/alerting/prometheusrule.py --write   # write it
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE / "rules.yaml"
TARGET = HERE.parent / "overlays" / "monitoring" / "prometheusrule.yaml"
VERSION_FILE = HERE.parents[1] / "probes" / "__init__.py"
HEADER = ("# Generated from k8s/alerting/rules.yaml by k8s/alerting/prometheusrule.py --write: edit the\n"
          "# rule file, not this one. The Prometheus Operator loads it into the Prometheus whose\n"
          "# ruleSelector matches its labels (see docs/alerting.md).\n")


def version() -> str:
    for line in VERSION_FILE.read_text().splitlines():
        if line.startswith("__version__ = "):
            return line.split("=", 1)[1].strip().strip('"')
    raise RuntimeError(f"no __version__ in {VERSION_FILE}")


def prometheus_rule(rules: dict[str, Any]) -> dict[str, Any]:
    labels = {
        "app.kubernetes.io/name": "gpu-dev",
        "app.kubernetes.io/instance": "gpu-dev",
        "app.kubernetes.io/version": version(),
        "app.kubernetes.io/component": "monitoring",
        "app.kubernetes.io/part-of": "gpu-dev",
        "app.kubernetes.io/managed-by": "kustomize",
    }
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "gpu-dev-healthcheck", "labels": labels},
            "spec": {"groups": rules["groups"]}}


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the longer expressions) as literal blocks, as they are written."""


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _str)


def render(rules_path: Path = RULES) -> str:
    rules = yaml.safe_load(rules_path.read_text())
    return HEADER + yaml.dump(prometheus_rule(rules), Dumper=_Dumper, sort_keys=False, width=4096,
                              allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="prometheusrule", description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help=f"write {TARGET.relative_to(HERE.parents[1])}")
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 3
    text = render()
    if args.write:
        TARGET.write_text(text)
        return 0
    if not TARGET.exists() or TARGET.read_text() != text:
        print(f"{TARGET.relative_to(HERE.parents[1])} differs from k8s/alerting/rules.yaml: "
              "run python k8s/alerting/prometheusrule.py --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
