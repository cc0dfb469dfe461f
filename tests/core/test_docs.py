"""The manual's probe, environment and cause tables are generated from the registry (make docs)."""

from __future__ import annotations

import subprocess
import sys

from probes import deadlines, docs, registry
from probes.spec import Cause
from tests.conftest import ROOT


def test_the_manual_is_what_the_registry_generates():
    for page in docs.PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        assert docs.render(text, page) == text, f"{page} differs from the registry: run make docs"
    res = subprocess.run([sys.executable, "-m", "probes.docs", "--check"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stderr


def test_every_declaration_reaches_the_manual():
    text = (ROOT / "docs/probes.md").read_text(encoding="utf-8")
    for spec in registry.PROBES:
        assert f"`{spec.name}`" in text and f"`{spec.toggle}`" in text
        for setting in spec.settings:
            assert f"`{setting.env}`" in text
        for cause in spec.causes:
            assert f"`{cause.reason}`" in text


def test_a_changed_declaration_changes_the_generated_tables(monkeypatch):
    spec = registry.PROBES[0]
    before = docs.causes()
    changed = spec._replace(causes=(*spec.causes, Cause("brand-new", "warn", "a new cause", "a new remedy", "retry", "tenant")))
    monkeypatch.setitem(registry._cache, "PROBES", (changed, *registry.PROBES[1:]))
    after = docs.causes()
    assert "| a new cause | `brand-new` | warn | a new remedy |" in after and after != before


def test_the_deadline_ladders_table_is_generated_from_it(monkeypatch):
    before = docs.deadline_ladder()
    assert "| `readiness` | 25 s | 24.5 s | 28 s | 29 s | 30 | 30 s |" in before
    monkeypatch.setattr(deadlines, "FRONT_DOOR_GRACE", deadlines.FRONT_DOOR_GRACE + 1)
    after = docs.deadline_ladder()
    assert "| `readiness` | 25 s | 24.5 s | 29 s | 30 s | 31 | 30 s |" in after
