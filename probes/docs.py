"""The manual's generated tables (``make docs``, ``python -m probes.docs --check``): the sections
between ``<!-- BEGIN GENERATED: NAME -->`` and ``<!-- END GENERATED: NAME -->`` of the pages in ``PAGES``."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from probes import config, deadlines, dropins, registry, runner, serve
from probes.framework import cuda_errors
from probes.hardware import xids
from probes.spec import PROFILE_RULES, Cause, Setting


def _table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _default(s: Setting) -> str:
    if s.shown_default is not None or s.default is None:
        return s.shown_default or "unset"
    if isinstance(s.default, bool):
        return f"`{str(s.default).lower()}`"
    return f"`{int(s.default) if isinstance(s.default, float) and s.default.is_integer() else s.default}`"


def probes() -> str:
    rows = [(s.layer, f"`{s.name}`", s.about, f"`{s.toggle}`", f"{s.timeout:g} s", ", ".join(s.profiles))
            for s in registry.PROBES]
    rows.append(("drop-in", "every executable in `HEALTHCHECK_CHECKS_DIR`", "whatever the image owner checks "
                 "(see \"Drop-in checks\")", "`ENABLE_<NAME>_CHECK`", f"{dropins.DEFAULT_TIMEOUT:g} s "
                 "(`timeout=`)", ", ".join(dropins.DEFAULT_PROFILES) + " (`profiles=`)"))
    return _table(("layer", "probe", "what it proves", "toggle", "default deadline", "profiles"), rows)


def environment() -> str:
    rows = []
    for toggle in registry.TOGGLES:
        owners = [s for s in registry.PROBES if s.toggle == toggle]
        names = ", ".join(f"`{s.name}`" for s in owners)
        on = any(s.default_on for s in owners)
        with_ = [w for s in owners if s.on_with for w in s.settings if w.field == s.on_with]
        shown = "`true`" if on else "`false`" + "".join(f" (`true` when `{w.env}` is set)" for w in with_)
        rows.append((f"`{toggle}`", shown, f"run {names} (true/false, 1/0, yes/no, on/off)"))
    rows.append(("`ENABLE_<NAME>_CHECK`", "`true`", "run the drop-in check `NAME` (upper case, `-` and `.` "
                                                    "as `_`)"))
    for s in (*config.GLOBAL_SETTINGS, *registry.SETTINGS, *config.OTHER_SETTINGS):
        owners = [p.name for p in registry.PROBES if s in p.settings]
        used = f" ({', '.join(f'`{o}`' for o in owners)})" if owners else ""
        rows.append((f"`{s.env}`", _default(s), s.meaning + used))
    return _table(("variable", "default", "meaning"), rows)


def serve_environment() -> str:
    return _table(("variable", "default", "meaning"),
                  [(f"`{s.env}`", _default(s), s.meaning) for s in serve.ServeSettings.SETTINGS])


def _cause_table(causes: Iterable[Cause]) -> str:
    rows = [(c.cause, f"`{c.reason}`" if c.reason else "", c.status, c.remedy, c.actor, f"`{c.action}`")
            for c in causes]
    return _table(("cause", "reason", "status", "remedy", "who acts", "action"), rows)


def causes() -> str:
    parts = ["#### Reasons every probe can report", "", _cause_table(runner.COMMON_CAUSES)]
    for spec in registry.PROBES:  # in layer order
        parts += ["", f"#### `{spec.name}` ({spec.layer})", "", _cause_table(spec.causes)]
    parts += ["", "#### Drop-in checks", "", _cause_table(dropins.CAUSES),
              "", "#### The checks `healthcheck serve` adds (docs/serve.md)", "", _cause_table(serve.CAUSES)]
    return "\n".join(parts)


_SERVE = {xids.CRITICAL: "latches unhealthy", xids.APPLICATION: "warns 10 min (application)",
          xids.OTHER: "warns 10 min", xids.NO_ACTION: "counted only"}


def _action(action: str) -> str:
    return f"`{action}`" if action else "(none given)"


def _spans(codes: Sequence[int]) -> str:
    """``1-7, 9, 11-12`` for sorted codes: a run of consecutive codes keeps one distance to its index."""
    spans = [[c for _, c in run] for _, run in itertools.groupby(enumerate(codes), lambda ic: ic[1] - ic[0])]
    return ", ".join(str(s[0]) if len(s) == 1 else f"{s[0]}-{s[-1]}" for s in spans)


def xid_actions() -> str:
    rows = []
    for action, b in xids.BUCKETS.items():
        codes = sorted(x for x, e in xids.CATALOG.items() if e.action == action)
        rows.append((_action(action), _spans(codes), _SERVE[b.severity], b.todo, b.why))
    rows.append(("not in the catalog", "any other", _SERVE[xids.UNKNOWN.severity], xids.UNKNOWN.todo,
                 xids.UNKNOWN.why))
    return f"Source: {xids.SOURCE}.\n\n" + _table(
        ("catalog immediate action", "Xids", "`healthcheck serve`", "what to do", "why"), rows)


def xid_policy() -> str:
    rows = [(str(code), f"`{x.mnemonic}`", _action(x.action), _SERVE[xids.bucket(code).severity], x.meaning)
            for code, x in sorted(xids.CATALOG.items())]
    return _table(("Xid", "mnemonic", "immediate action", "`healthcheck serve`", "meaning"), rows)


def cuda_error_table() -> str:
    """The CUDA errors judged apart from a plain failure."""
    rows = [(str(e.code) if e.code is not None else "", f"`{e.name}`", e.text, e.category, f"`{e.reason}`",
             e.remedy) for e in (*cuda_errors.TABLE, *cuda_errors.LIBRARY)
            if e.category != cuda_errors.OTHER or e.remedy != cuda_errors.PROGRAM]
    return _table(("code", "name", "text (`cudaGetErrorString`)", "class", "reason", "remedy"), rows)


def deadline_ladder() -> str:
    d = deadlines
    rows = [(f"`{p.name}`", f"{p.timeout:g} s", f"{runner.run_deadline(p.timeout, 0.0):g} s",
             f"{d.hard_stop(p.timeout)} s", f"{d.hard_stop(p.timeout) + d.FRONT_DOOR_KILL_AFTER} s",
             str(d.probe_timeout_floor(p.timeout)),
             f"{p.timeout + d.SERVE_RUN_GRACE:g} s") for p in PROFILE_RULES.values()]
    return _table(("profile", "its deadline", "probes given up", "front door TERM", "front door KILL",
                   "least timeoutSeconds", "serve ends a run"), rows)


def index() -> str:
    """The whole of probes/index.py."""
    settings: dict[str, tuple[Any, ...]] = {}
    for s in registry.PROBES:
        for row in s.settings:
            settings.setdefault(row.env, (row.env, row.field, s.module, row.kind, row.low, row.high,
                                          row.low_inclusive, row.choices, row.parse is not None, row.default))
    return "\n".join([
        '"""What a run reads before it imports a probe (probes/registry.py), written by `make docs`."""', "",
        "PROBES = (", *(f"    {tuple(getattr(s, name) for name in registry.Entry._fields)!r},"
                        for s in registry.PROBES),
        ")", "SETTINGS = (  # env, field, module, kind, low, high, low_inclusive, choices, parse, default",
        *(f"    {row!r}," for row in settings.values()),
        ")", ""])


ROOT = Path(__file__).resolve().parent.parent
PAGES = {"docs/probes.md": {"probes": probes, "environment": environment, "causes": causes,
                            "cuda-errors": cuda_error_table},
         "docs/serve.md": {"serve-environment": serve_environment, "xid-actions": xid_actions,
                           "xids": xid_policy},
         "docs/kubernetes.md": {"deadlines": deadline_ladder}}


def render(text: str, page: str) -> str:
    for name, build in PAGES[page].items():
        begin, end = f"<!-- BEGIN GENERATED: {name} (make docs) -->", f"<!-- END GENERATED: {name} -->"
        if begin not in text or end not in text:
            raise SystemExit(f"docs: {page} lacks the markers of the {name} section")
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{begin}\n{build()}\n{end}{tail}"
    return text


def main(argv: Sequence[str]) -> int:
    status = 0
    for page in ("probes/index.py", *PAGES):
        old = (ROOT / page).read_text(encoding="utf-8")
        new = index() if page == "probes/index.py" else render(old, page)
        if new != old and "--check" in argv:
            print(f"docs: {page} differs from the probe modules: run make docs", file=sys.stderr)
            status = 1
        elif new != old:
            (ROOT / page).write_text(new, encoding="utf-8")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
