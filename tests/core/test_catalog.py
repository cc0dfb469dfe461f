"""The catalog of causes: every cause says who acts and how, once; judges build no remedy themselves.

A cause (probes.spec.Cause) is declared once, in a probe's table, a layer's shared causes,
the runner's common ones, the drop-in table or serve's own. A judge returns
``probes.result.verdict(name, cause, detail)``: the message is the detail it observed and the
cause's remedy, built in that one place, and the result carries the cause's reason, action and
actor. These tests read the code as the reader would: the tables, and what the judges call.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from probes import dropins, registry, runner, serve, spec
from probes.result import Status, verdict
from probes.spec import Cause
from tests.conftest import ROOT

PACKAGE = ROOT / "probes"
# Where reason codes are data, not a probe's judgement: the catalog's own code and serve, which
# passes on the reasons a run reported.
NOT_JUDGES = {"spec.py", "result.py", "docs.py", "report.py", "__main__.py"}


def tables() -> Iterator[tuple[str, Cause]]:
    yield from (("common", c) for c in runner.COMMON_CAUSES)
    for s in registry.PROBES:
        yield from ((s.name, c) for c in s.causes)
    yield from (("drop-in", c) for c in dropins.CAUSES)
    yield from (("serve", c) for c in serve.CAUSES)


def judge_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if p.name not in NOT_JUDGES and "serve" not in p.relative_to(PACKAGE).parts)


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_every_cause_says_who_acts_and_how():
    bad = [(where, c.reason, c.action, c.actor) for where, c in tables()
           if c.action not in spec.ACTIONS or c.actor not in spec.ACTORS]
    assert not bad, "causes without a valid action and actor"


def test_a_cause_declared_without_who_acts_or_how_is_refused():
    with pytest.raises(TypeError):
        Cause("gpu-lost", "fail", "GPU fallen off the bus", "reset the GPU")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="action 'pray' is not one of"):
        Cause("gpu-lost", "fail", "GPU fallen off the bus", "reset the GPU", "pray", "operator")
    with pytest.raises(ValueError, match="actor 'nobody' is not one of tenant, operator"):
        Cause("gpu-lost", "fail", "GPU fallen off the bus", "reset the GPU", "reset-gpu", "nobody")


def test_a_verdict_carries_the_cause_and_builds_the_message_once():
    lost = Cause("gpu-lost", "fail", "GPU fallen off the bus", "reset the GPU (`nvidia-smi -r`)", "reset-gpu",
                 "operator")
    r = verdict("nvml", lost, "GPU 0 is lost", observed=1, unit="gpus")
    assert (r.status, r.reason, r.action, r.actor) == (Status.FAIL, "gpu-lost", "reset-gpu", "operator")
    assert r.message == "GPU 0 is lost: reset the GPU (nvidia-smi -r)"
    assert verdict("nvml", lost, "GPU 0 is lost; reset it", remedy=False).message == "GPU 0 is lost; reset it"


def test_a_probe_module_declares_its_own_probe_beside_its_gather_and_judge():
    """One probe, one module: each line of the registry holds its probe's ``SPEC``, naming that module,
    with its causes, settings, gather and judge."""
    for line in (*registry.MODULES, *registry.PLUGINS):
        module = spec.load(line)
        assert module.SPEC.module == line and registry.BY_NAME[module.SPEC.name] is module.SPEC, line
        assert callable(module.gather) and callable(module.judge), line
    assert {s.module for s in registry.PROBES} == {*registry.MODULES, *registry.PLUGINS}


def test_each_probe_declares_a_reason_once():
    for s in registry.PROBES:
        reasons = [c.reason for c in s.causes]
        assert len(reasons) == len(set(reasons)), (s.name, sorted(r for r in reasons if reasons.count(r) > 1))


def _calls(tree: ast.AST, name: str) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute) and f.attr == name):
                yield node


def test_no_judge_names_a_reason_code_itself():
    """A warn or fail's reason comes from a cause of the catalog (through verdict), never a literal."""
    found = []
    for path in judge_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                for kw in node.keywords:
                    if kw.arg == "reason" and isinstance(kw.value, ast.Constant) and kw.value.value:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} reason={kw.value.value!r}")
    assert not found, "use verdict() with a Cause of the catalog"


def test_every_cause_a_judge_gives_is_in_its_probes_table():
    """``verdict(NAME, X, ...)``: X, where the module names it (a constant, ``hw.GPU_LOST``), is a row of
    the module's own table (or the common causes); a helper module's, a row of some table."""
    import importlib

    everything = {c for _, c in tables()}
    missing = []
    for path in judge_modules():
        module = importlib.import_module(module_name(path))
        own = getattr(module, "SPEC", None)
        allowed = set(own.causes) | set(runner.COMMON_CAUSES) if own is not None else everything
        for call in _calls(ast.parse(path.read_text()), "verdict"):
            if len(call.args) < 2 or isinstance(call.args[1], ast.Starred):  # a row of a local table
                continue
            try:
                cause = eval(compile(ast.Expression(call.args[1]), str(path), "eval"), vars(module))
            except NameError:
                continue  # a local: the cause a helper chose from its table
            if isinstance(cause, Cause) and cause not in allowed:
                missing.append(f"{path.relative_to(ROOT)}:{call.lineno} {cause.reason}")
    assert not missing, "causes given by a judge but not in its probe's table"


def test_every_reason_serve_gives_a_run_without_report_is_in_its_table():
    """run_once's table of (condition, reason, message) rows: each reason is a row of RUN_FAILED."""
    tree = ast.parse((PACKAGE / "serve" / "monitor.py").read_text())
    run_once = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "run_once")
    given = {t.elts[1].value for t in ast.walk(run_once) if isinstance(t, ast.Tuple) and len(t.elts) == 3
             and isinstance(t.elts[1], ast.Constant) and isinstance(t.elts[1].value, str)}
    assert len(given) >= 6 and given <= set(serve.RUN_FAILED), given - set(serve.RUN_FAILED)
