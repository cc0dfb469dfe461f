"""Render an Outcome as text (first line: the verdict) or as health+json.

Docker keeps 4096 bytes of each probe's output and Kubernetes puts it in events,
so the text report is cut to fit, cutting probe lines, never the verdict.
"""

from __future__ import annotations

import json
import time
from typing import Any

from probes import __version__, registry
from probes.result import Result, Status
from probes.runner import Outcome
from probes.untrusted import squeeze

MAX_BYTES = 4096
MAX_MESSAGE = 300
CUT = "... (output cut)"


def _iso(ts: float) -> str:
    import datetime  # only the JSON report needs it: ~3 ms the text report does not pay

    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat(timespec="milliseconds")


def _short(text: str, limit: int = MAX_MESSAGE) -> str:
    # Probes clean outside text where it enters a result; this is the last line of defence,
    # and idempotent: clean text passes unchanged.
    return squeeze(text, limit)


def verdict(outcome: Outcome, disabled: str = "") -> str:
    if not outcome.results:
        return f"healthy: {disabled or 'no checks selected'}"
    problem = outcome.first_problem
    status = outcome.status
    if status is Status.FAIL and problem is not None:
        return _short(f"unhealthy: {problem.name}: {problem.message}")
    if status is Status.WARN and problem is not None:
        return _short(f"healthy with warnings: {problem.name}: {problem.message}")
    ran = [r.name for r in outcome.results if r.status is Status.PASS]
    return f"healthy: {outcome.profile}: {len(ran)} checks passed ({', '.join(ran)})"


def _observed(r: Result) -> str:
    if r.observed is None:
        return ""
    return f" [{_short(r.observed, 120)}{' ' + _short(r.unit, 20) if r.unit else ''}]"


def text(outcome: Outcome, *, verbose: bool = False, disabled: str = "") -> str:
    lines = [verdict(outcome, disabled)]
    for r in outcome.results:
        line = f"{r.status.value.upper()} {r.name} {r.elapsed:.3f}s {_short(r.message)}"
        if verbose:
            line += _observed(r)
        lines.append(line)
    lines += [f"note: {_short(n)}" for n in outcome.notes]
    out = "\n".join(lines)
    if len(out.encode()) < MAX_BYTES:
        return out
    kept: list[str] = []
    size = len(CUT) + 1
    for line in lines:
        n = len(line.encode()) + 1
        if size + n >= MAX_BYTES:
            break
        kept.append(line)
        size += n
    return "\n".join([*kept, CUT])


def health_json(outcome: Outcome, *, disabled: str = "") -> dict[str, Any]:
    checks: dict[str, list[dict[str, Any]]] = {}
    specs = {s.name: s for s in outcome.specs}
    for r in outcome.results:
        spec = specs.get(r.name) or registry.BY_NAME.get(r.name)
        is_skip = r.status is Status.SKIP
        checks[f"{r.name}:{spec.measurement if spec else 'status'}"] = [{
            "componentType": spec.layer if spec else "component",
            "status": "warn" if is_skip else r.status.value,
            "observedValue": _short(r.observed, 120) if isinstance(r.observed, str) else r.observed,
            "observedUnit": r.unit,
            "time": _iso(r.time) if r.time else None,
            "output": _short(r.message),
            "reason": r.reason,
            "elapsed": r.elapsed,
            "skipped": is_skip,
        }]
    return {
        "status": outcome.status.value,
        "version": __version__,
        "description": f"GPU container health ({outcome.profile} profile)",
        "profile": outcome.profile,
        "output": verdict(outcome, disabled),
        "time": _iso(max((r.time for r in outcome.results), default=0) or time.time()),
        "notes": [_short(n) for n in outcome.notes],
        "checks": checks,
    }


def json_text(outcome: Outcome, *, disabled: str = "") -> str:
    return json.dumps(health_json(outcome, disabled=disabled), separators=(",", ":"), default=str)
