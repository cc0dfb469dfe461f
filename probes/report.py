"""An Outcome as text (the verdict first; cut to the 4096 bytes Docker keeps by dropping probe
lines, never the verdict) or as health+json."""

from __future__ import annotations

import time

from probes import __version__, registry
from probes.result import Status
from probes.runner import Outcome
from probes.untrusted import squeeze as _short  # the last line of defence: probes clean what enters

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_BYTES = 4096
CUT = "... (output cut)"


def iso_time(ts: float) -> str:
    """RFC 3339 in UTC with a ``Z``, to the millisecond: every report's time format."""
    whole = int(ts)
    ms = round((ts - whole) * 1e6) // 1000  # rounded to the microsecond first, as datetime does
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole + ms // 1000)) + f".{ms % 1000:03d}Z"


def public_facts(facts: Any) -> dict[str, Any]:
    """The few facts serve's metrics label with, in the non-standard ``facts``: no process names or paths."""
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
                       if isinstance(g, dict) and type(g.get("index")) is int]
    return out


def check_entry(*, status: str, time: float, output: str = "", layer: str | None = None,
                observed: Any = None, unit: str | None = None, reason: str | None = None,
                elapsed: float = 0.0, name: str | None = None, facts: Any = None, action: str | None = None,
                actor: str | None = None) -> dict[str, Any]:
    """One health+json check object (serve's own checks too). The draft omits ``output`` for pass:
    a passing check's message is the non-standard ``message``, as are ``layer``, ``reason``,
    ``action`` and ``actor``, ``elapsed`` and ``facts``."""
    entry: dict[str, Any] = {"componentId": name} if name else {}
    # The draft's componentType: the GPU and its driver are a system the container depends on.
    entry["componentType"] = "system" if layer == "hardware" else "component"
    entry.update({"layer": layer} if layer else {}, status=status)
    if observed is not None:
        numeric = isinstance(observed, (int, float)) and not isinstance(observed, bool)
        entry.update(observedValue=observed, observedUnit=unit or ("count" if numeric else "text"))
    entry["time"] = iso_time(time)
    if status != "pass":
        entry.update(output=output, action=action, actor=actor)
    elif output:
        entry["message"] = output
    entry.update(reason=reason or None, elapsed=elapsed)
    shown = public_facts(facts)
    return {**entry, "facts": shown} if shown else entry


def verdict(outcome: Outcome, disabled: str = "") -> str:
    if not outcome.results:
        return f"healthy: {disabled or 'no checks selected'}"
    problem, status = outcome.first_problem, outcome.status
    if problem is not None and status is not Status.PASS:
        said = "unhealthy" if status is Status.FAIL else "healthy with warnings"
        return _short(f"{said}: {problem.name}: {problem.message}")
    ran = [r.name for r in outcome.results if r.status is Status.PASS]
    return f"healthy: {outcome.profile}: {len(ran)} checks passed ({', '.join(ran)})"


def text(outcome: Outcome, *, verbose: bool = False, disabled: str = "") -> str:
    lines = [verdict(outcome, disabled)]
    for r in outcome.results:
        line = f"{r.status.value.upper()} {r.name} {r.elapsed:.3f}s {_short(r.message)}"
        if verbose and r.observed is not None:
            line += f" [{_short(r.observed, 120)}{' ' + _short(r.unit, 20) if r.unit else ''}]"
        lines.append(line)
    lines += [f"note: {_short(n)}" for n in outcome.notes]
    out = "\n".join(lines)
    if len(out.encode()) < MAX_BYTES:
        return out
    kept: list[str] = []
    size = len(CUT) + 1
    for line in lines:
        size += len(line.encode()) + 1
        if size >= MAX_BYTES:
            break
        kept.append(line)
    return "\n".join([*kept, CUT])


def health_json(outcome: Outcome, *, disabled: str = "") -> dict[str, Any]:
    """The draft's health+json document. A skipped probe observed nothing and the draft has no "not
    checked" status: it is said in ``notes`` and kept for serve's metrics in the non-standard
    ``skipped``, keyed like ``checks``."""
    checks: dict[str, list[dict[str, Any]]] = {}
    skips: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    specs = {s.name: s for s in outcome.specs}
    stamp = max((r.time for r in outcome.results), default=0) or time.time()
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
        "status": outcome.status.value, "version": __version__,
        "description": f"GPU container health ({outcome.profile} profile)", "profile": outcome.profile,
        "output": verdict(outcome, disabled), "time": iso_time(stamp),
        "notes": [_short(n) for n in outcome.notes] + notes, "checks": checks}
    return {**doc, "skipped": skips} if skips else doc


def json_text(outcome: Outcome, *, disabled: str = "") -> str:
    import json  # the text report does not need it

    return json.dumps(health_json(outcome, disabled=disabled), separators=(",", ":"), default=str)
