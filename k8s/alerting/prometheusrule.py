"""Render the alerting rules (k8s/alerting/rules.yaml) as the monitoring overlay's PrometheusRule:
exit 0 when the overlay's copy is current, 1 when not (`make manifests`); `--write` writes it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the suite's version, from the tree this script lies in
from probes import __version__  # noqa: E402

RULES = ROOT / "k8s" / "alerting" / "rules.yaml"
TARGET = ROOT / "k8s" / "overlays" / "monitoring" / "prometheusrule.yaml"
HEADER = ("# Generated from k8s/alerting/rules.yaml by k8s/alerting/prometheusrule.py --write: edit the\n"
          "# rule file, not this one. The Prometheus Operator loads it into the Prometheus whose\n"
          "# ruleSelector matches its labels (see docs/alerting.md).\n")
LABELS = {f"app.kubernetes.io/{k}": v for k, v in (
    ("name", "gpu-dev"), ("instance", "gpu-dev"), ("version", __version__), ("component", "monitoring"),
    ("part-of", "gpu-dev"), ("managed-by", "kustomize"))}


class _Dumper(yaml.SafeDumper):  # multi-line strings as literal blocks, as they are written
    yaml_representers = {**yaml.SafeDumper.yaml_representers, str: lambda dumper, s: dumper.represent_scalar(
        "tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="prometheusrule", description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help=f"write {TARGET.relative_to(ROOT)}")
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 3
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "gpu-dev-healthcheck", "labels": LABELS},
            "spec": {"groups": yaml.safe_load(RULES.read_text())["groups"]}}
    text = HEADER + yaml.dump(rule, Dumper=_Dumper, sort_keys=False, width=4096, allow_unicode=True)
    if args.write:
        TARGET.write_text(text)
    elif not TARGET.exists() or TARGET.read_text() != text:
        print(f"{TARGET.relative_to(ROOT)} differs from k8s/alerting/rules.yaml: "
              "run python k8s/alerting/prometheusrule.py --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
