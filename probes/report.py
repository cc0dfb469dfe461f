"""Render an Outcome as text (first line: the verdict) or as health+json.

Docker keeps 4096 bytes of each probe's output and Kubernetes puts it in events,
so the text report is cut to fit, cutting probe lines, never the verdict.
"""

from __future__ import annotations

import time

from probes import __version__, registry
from probes.result import Result, Status
from probes.runner import Outcome
from probes.untrusted import squeeze

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_BYTES = 4096
MAX_MESSAGE = 300
CUT = "... (output cut)"


# health+json's componentType takes the draft's values (component, datastore, system or a
# URI), not our layer names: the GPU and its driver are a system the container depends on,
# the rest are components of the container. The layer stays in the non-standard "layer".
COMPONENT_TYPES = {"hardware": "system", "framework": "component", "services": "component",
                   "drop-in": "component"}


def iso_time(ts: float) -> str:
    """RFC 3339 in UTC with a ``Z``, to the millisecond: the one time format of every report."""
    import datetime  # only the JSON report needs it: ~3 ms the text report does not pay

    stamp = datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def default_unit(value: Any) -> str:
    """The observedUnit for a value its probe gave no unit: the draft wants one with every value."""
    return "count" if isinstance(value, (int, float)) and not isinstance(value, bool) else "text"


def public_facts(facts: Any) -> dict[str, Any]:
    """The few facts serve's metrics label with (versions, each GPU's index, UUID and model, and
    whether NVML answered for it), in the non-standard ``facts``: no process names or paths."""
    if not isinstance(facts, dict):
        return {}
    out: dict[str, Any] = {k: _short(facts[k], 40) for k in ("torch", "cuda", "driver")
                           if isinstance(facts.get(k), str)}
    gpus = facts.get("gpus")
    if isinstance(gpus, list):
        out["gpus"] = [{"index": g["index"], "uuid": _short(g.get("uuid") or "", 80),
                        "name": _short(g.get("name") or "", 80),
                        # idempotent: serve rebuilds what a child's report says with this too
                        "ok": g["ok"] if isinstance(g.get("ok"), bool) else not g.get("error")}
                       for g in gpus[:64]
                       if isinstance(g, dict) and isinstance(g.get("index"), int)
                       and not isinstance(g.get("index"), bool)]
    return out


def check_entry(*, status: str, time: float, output: str = "", layer: str | None = None,
                observed: Any = None, unit: str | None = None, reason: str | None = None,
                elapsed: float = 0.0, name: str | None = None, facts: Any = None, action: str | None = None,
                actor: str | None = None) -> dict[str, Any]:
    """One health+json check object as the draft wants it (shared with serve's own checks).

    ``output`` only for warn and fail (the draft: omitted for pass; a passing check's
    one-line message goes in the non-standard ``message``); ``observedValue`` always with
    ``observedUnit``, and neither when there is no value; ``time`` always.
    """
    entry: dict[str, Any] = {}
    if name:
        entry["componentId"] = name
    entry["componentType"] = COMPONENT_TYPES.get(layer or "", "component")
    if layer:
        entry["layer"] = layer
    entry["status"] = status
    if observed is not None:
        entry["observedValue"] = observed
        entry["observedUnit"] = unit or default_unit(observed)
    entry["time"] = iso_time(time)
    if status == "pass":
        if output:
            entry["message"] = output
    else:
        entry["output"] = output
    entry["reason"] = reason or None  # non-standard, always there: null when there is none
    if status != "pass":
        # Non-standard: who can act on a warning or failure (tenant or operator) and how.
        entry["action"] = action
        entry["actor"] = actor
    entry["elapsed"] = elapsed
    shown = public_facts(facts)
    if shown:
        entry["facts"] = shown
    return entry


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
    """The draft's health+json document.

    A skipped probe did not observe anything, so it is not a check result: reporting it
    as "pass" would claim a health nobody verified, and "warn" would claim a problem in
    it. It is left out of ``checks`` (the draft has no "not checked" status), said in
    ``notes``, and kept for this suite's own readers (serve's metrics, the fast path) in
    the non-standard top-level ``skipped``, keyed like ``checks``.
    """
    checks: dict[str, list[dict[str, Any]]] = {}
    skips: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    specs = {s.name: s for s in outcome.specs}
    now = time.time()
    stamp = max((r.time for r in outcome.results), default=0) or now
    for r in outcome.results:
        spec = specs.get(r.name) or registry.BY_NAME.get(r.name)
        key = f"{r.name}:{spec.measurement if spec else 'status'}"
        if r.status is Status.SKIP:
            skips[key] = {"output": _short(r.message), "reason": r.reason, "time": iso_time(r.time or stamp)}
            notes.append(_short(f"{r.name} not checked: {r.message}"))
            continue
        checks[key] = [check_entry(
            name=r.name, layer=spec.layer if spec else None, status=r.status.value,
            observed=_short(r.observed, 120) if isinstance(r.observed, str) else r.observed,
            unit=_short(r.unit, 20) if r.unit else None, time=r.time or stamp, output=_short(r.message),
            reason=r.reason, elapsed=r.elapsed, facts=r.facts, action=r.action, actor=r.actor)]
    doc: dict[str, Any] = {
        "status": outcome.status.value,
        "version": __version__,
        "description": f"GPU container health ({outcome.profile} profile)",
        "profile": outcome.profile,
        "output": verdict(outcome, disabled),
        "time": iso_time(stamp),
        "notes": [_short(n) for n in outcome.notes] + notes,
        "checks": checks,
    }
    if skips:
        doc["skipped"] = skips
    return doc


def json_text(outcome: Outcome, *, disabled: str = "") -> str:
    import json  # the text report does not need it

    return json.dumps(health_json(outcome, disabled=disabled), separators=(",", ":"), default=str)
