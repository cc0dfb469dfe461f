"""Helpers for the manifest tests: the checker module, and broken copies of the real manifests."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"


def _load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_probes", K8S / "check_probes.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_probes"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def checker() -> ModuleType:
    return _load_checker()


@pytest.fixture
def k8s_copy(tmp_path: Path) -> Path:
    """A copy of the real k8s/ tree (base and overlays) to break on purpose."""
    dst = tmp_path / "k8s"
    shutil.copytree(K8S, dst, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    return dst


def container(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["template"]["spec"]["containers"][0]


@pytest.fixture
def edit_deployment(k8s_copy: Path) -> Callable[[Callable[[dict[str, Any]], None]], Path]:
    """Apply ``change`` to the copied base Deployment's container; returns the copy's base dir."""
    def edit(change: Callable[[dict[str, Any]], None]) -> Path:
        path = k8s_copy / "base" / "deployment.yaml"
        doc = yaml.safe_load(path.read_text())
        change(container(doc))
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return k8s_copy / "base"
    return edit
