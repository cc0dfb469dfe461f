"""What the monitor keeps and what the endpoints answer: pure functions over snapshots.

A profile's run either yields a health+json report (from ``python -m probes --json``)
or a reason code saying why it did not ("deadline", "bad-output", "crashed", ...).
The endpoint's verdict folds in the result's age (older than interval + slack is
"stale"), the sticky latch and recent Xid events. Every string that reaches a
client is rebuilt from known fields and made printable; child output that is not
a well-formed report is never passed through.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Mapping, Sequence

from probes.record import Record
from probes.report import check_entry, iso_time, public_facts
from probes.result import Result, Status
from probes.serve import (
    LATCHED_CUDA,
    LATCHED_XID,
    PENDING,
    RUN_FAILED,
    SLOWDOWN,
    STALE,
    XID_APPLICATION,
    XID_OTHER,
)
from probes.spec import PROFILE_RULES, Cause
from probes.untrusted import load_json, squeeze

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CHECK_KEYS = ("componentId", "componentType", "layer", "status", "observedValue", "observedUnit", "time",
              "output", "message", "reason", "action", "actor", "elapsed", "facts")
STATUSES = ("pass", "warn", "fail")
RANK = {"pass": 0, "warn": 1, "fail": 2}
# An Xid that warns (application or other) keeps the endpoints at "warn" this long after it was seen.
XID_WARN_SECONDS = 600.0

def from_iso(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _scalar(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, str):
        return squeeze(v)
    try:
        return squeeze(json.dumps(v, sort_keys=True))
    except (TypeError, ValueError):
        return None


def _check(entry: Any) -> dict[str, Any] | None:
    if not isinstance(entry, dict) or entry.get("status") not in STATUSES:
        return None
    out: dict[str, Any] = {}
    for key in CHECK_KEYS:
        if key not in entry:
            continue
        v = entry[key]
        if v is None:
            if key == "reason":
                out[key] = None
            continue
        if key in ("observedValue",):
            out[key] = _scalar(v)
        elif key == "facts":
            out[key] = public_facts(v)  # rebuilt from known keys, every string cleaned
        elif key == "elapsed":
            out[key] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        else:
            out[key] = squeeze(v)
    if out.get("observedValue") is None:
        out.pop("observedValue", None)
        out.pop("observedUnit", None)
    return out


def _skips(data: Any) -> dict[str, dict[str, Any]]:
    """The report's non-standard ``skipped`` (probes that did not run), rebuilt from known fields."""
    if not isinstance(data, dict):
        return {}
    out = {}
    for key, v in list(data.items())[:40]:
        if isinstance(key, str) and isinstance(v, dict):
            out[squeeze(key, 80)] = {k: squeeze(v[k]) for k in ("output", "reason", "time")
                                     if isinstance(v.get(k), str)}
    return out


def parse_report(stdout: bytes) -> dict[str, Any] | None:
    """The report a ``--json`` run printed, rebuilt from known fields; None when it is not one."""
    try:
        data = load_json(stdout)  # bounded nesting, finite numbers
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("status") not in STATUSES:
        return None
    checks = data.get("checks")
    if not isinstance(checks, dict):
        return None
    out_checks: dict[str, list[dict[str, Any]]] = {}
    for key, entries in checks.items():
        if not isinstance(key, str) or not isinstance(entries, list):
            return None
        rebuilt = [_check(e) for e in entries]
        if any(e is None for e in rebuilt):
            return None
        out_checks[squeeze(key, 80)] = rebuilt  # type: ignore[assignment]
    notes = data.get("notes")
    report = {
        "status": data["status"],
        "version": squeeze(data.get("version", ""), 40),
        "description": squeeze(data.get("description", ""), 200),
        "profile": squeeze(data.get("profile", ""), 20),
        "output": squeeze(data.get("output", "")),
        "time": squeeze(data.get("time", ""), 40),
        "notes": [squeeze(n) for n in notes][:20] if isinstance(notes, list) else [],
        "checks": out_checks,
    }
    skips = _skips(data.get("skipped"))
    if skips:
        report["skipped"] = skips
    return report


def results_of(report: Mapping[str, Any], default_time: float) -> list[Result]:
    """The report's checks as Results (for the metrics)."""
    results = []
    for key, entries in report.get("checks", {}).items():
        name = key.split(":", 1)[0]
        for e in entries[:1]:
            results.append(Result(
                name=name, status=Status(e["status"]), message=e.get("output") or e.get("message") or "",
                observed=e.get("observedValue"), unit=e.get("observedUnit"), reason=e.get("reason"),
                action=e.get("action"), actor=e.get("actor"), elapsed=float(e.get("elapsed") or 0.0),
                time=from_iso(e.get("time")) or default_time))
    for key, e in report.get("skipped", {}).items():
        results.append(Result(name=key.split(":", 1)[0], status=Status.SKIP, message=e.get("output") or "",
                              reason=e.get("reason"), time=from_iso(e.get("time")) or default_time))
    return results


@dataclasses.dataclass(frozen=True)
class Run:
    """One finished run of a profile."""

    profile: str
    started: float  # wall clock
    finished: float  # wall clock
    finished_mono: float  # time.monotonic(), for the age
    report: Mapping[str, Any] | None  # None: the run produced no report
    reason: str | None = None  # why there is no report ("deadline", "bad-output", ...)
    message: str = ""

    @property
    def duration(self) -> float:
        return max(0.0, self.finished - self.started)

    @property
    def status(self) -> str:
        return self.report["status"] if self.report is not None else "fail"


@dataclasses.dataclass(frozen=True)
class XidEvent:
    time: float  # wall clock
    gpu: int | None
    uuid: str
    kind: str  # xid | ecc-single | ecc-double
    data: int
    severity: str  # critical | application | other | corrected | ignored | no-action

    def advice(self) -> str:
        """What NVIDIA's Xid catalog calls this Xid, and what to do (empty for ECC events)."""
        if self.kind != "xid":
            return ""
        from probes.hardware import xids  # the catalog's 172 entries: only once an Xid is seen

        if self.severity == "application":
            todo = xids.BUCKETS[xids.RESTART_APP].todo
        elif self.severity == "critical" and not xids.latches(self.data):
            todo = "latched as HEALTHCHECK_XID_CRITICAL lists it"
        else:
            todo = xids.bucket(self.data).todo
        return f"{xids.describe(self.data)}; {todo}"

    def describe(self) -> str:
        where = f"GPU {self.gpu}" if self.gpu is not None else "a GPU"
        if self.uuid:
            where += f" ({self.uuid})"
        if self.kind == "xid":
            return f"Xid {self.data} on {where}"
        if self.kind == "ecc-double":
            return f"uncorrectable (double-bit) ECC error on {where}"
        return f"corrected (single-bit) ECC error on {where}"


# Hardware slowdown and power brake are judged by rate, never by one reading: a GPU warns when the
# last SLOWDOWN_WINDOW seconds hold SLOWDOWN_PER_MINUTE readings a minute or more (docs/serve.md).
SLOWDOWN_WINDOW = 600.0
SLOWDOWN_PER_MINUTE = 0.5


class SlowdownVerdict(Record):
    __slots__ = ("events", "per_minute", "warn")

    events: int  # readings with HW slowdown or power brake in the window
    per_minute: float
    warn: bool

    def __init__(self, events: int, per_minute: float, warn: bool) -> None:
        self.events = events
        self.per_minute = per_minute
        self.warn = warn

    def describe(self, gpu: int) -> str:
        """What serve's log and its endpoints say of a GPU's slowdown readings."""
        return (f"GPU {gpu}: hardware slowdown or power brake in {self.events} readings over the last "
                f"{SLOWDOWN_WINDOW / 60:g} min ({self.per_minute:.1f}/min, "
                f"warns at {SLOWDOWN_PER_MINUTE:g}/min)")


def slowdown_window(times: Sequence[float], now: float, window: float = SLOWDOWN_WINDOW,
                    per_minute: float = SLOWDOWN_PER_MINUTE) -> SlowdownVerdict:
    """The slowdown verdict at ``now`` from the times of slowdown readings (pure)."""
    recent = sum(1 for t in times if now - window < t <= now)
    rate = recent / (window / 60.0)
    return SlowdownVerdict(recent, rate, recent > 1 and rate >= per_minute)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Everything an endpoint needs, copied out of the monitor under its lock."""

    runs: Mapping[str, Run]
    startup_passed: Run | None
    latch: Mapping[str, Any] | None
    events: Sequence[XidEvent]  # recent ones, newest last
    watcher: str  # "running" | "unavailable" | "off" | "starting" | "failed"
    intervals: Mapping[str, float]
    stale_after: Mapping[str, float]
    # Per GPU index, the times of the watcher's readings with HW slowdown or power brake.
    slowdown: Mapping[int, tuple[float, ...]] = dataclasses.field(default_factory=dict)


def _entry(component: str, status: str, output: str, *, cause: Cause | None = None, reason: str | None = None,
           value: Any = None, unit: str | None = None, now: float) -> dict[str, Any]:
    """A check entry of serve's own; a warn or fail names its ``cause`` (reason, action, actor)."""
    return check_entry(status=status, time=now, output=output, layer=component, observed=value, unit=unit,
                       reason=reason or (cause.reason if cause else None),
                       action=cause.action if cause else None, actor=cause.actor if cause else None)


def _first_failure(report: Mapping[str, Any]) -> tuple[str | None, str]:
    for entries in report.get("checks", {}).values():
        for e in entries:
            if e.get("status") == "fail":
                return e.get("reason") or "fail", e.get("output") or ""
    return None, ""


class UnknownCheck(LookupError):
    """``only`` names no check of the endpoint (HTTP 404)."""

    def __init__(self, name: str, known: Sequence[str]):
        super().__init__(name)
        self.name, self.known = name, tuple(known)


def check_name(key: str) -> str:
    """The name a check goes by in the Kubernetes forms (``/readyz/<name>``, ``?exclude=<name>``)."""
    return key.split(":", 1)[0]


def _fold(checks: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[str, str | None, str]:
    """Status, reason and output of what is left of the checks: the worst wins, the first tells."""
    entries = [e for es in checks.values() for e in es]
    status = STATUSES[max((RANK.get(e.get("status", "fail"), 2) for e in entries), default=0)]
    for wanted in ("fail", "warn"):
        for e in entries:
            if e.get("status") == wanted:
                reason = (e.get("reason") or "fail") if wanted == "fail" else None
                return status, reason, e.get("output") or ""
    return status, None, ""


# ---------------------------------------------------------------- an endpoint's verdict
#
# The run's report is the starting point; each overlay below (the result's age, Xid events,
# sustained slowdown, the watcher's state, the latch) looks at the snapshot alone and returns
# what it adds, or None; one loop folds them in order. Then ?exclude and /<check> select, and
# the answer is built. An overlay's effect: "fail" decides status, reason and output (a later
# one wins: the latch over a stale result); "warn" turns a pass into a warn; "pass" adds only.


@dataclasses.dataclass(frozen=True)
class Ask:
    """What an endpoint asks of a snapshot: its profile, and the clocks of the question."""

    profile: str
    snap: Snapshot
    now: float  # wall clock
    now_mono: float  # time.monotonic(), for ages

    @property
    def sticky(self) -> bool:
        """Startup passed once: that result stands for good (never stale, the latch not judged)."""
        return PROFILE_RULES[self.profile].once and self.snap.startup_passed is not None

    @property
    def run(self) -> Run | None:
        return self.snap.startup_passed if self.sticky else self.snap.runs.get(self.profile)

    @property
    def age(self) -> float:
        return max(0.0, self.now_mono - self.run.finished_mono) if self.run is not None else 0.0

    @property
    def stale(self) -> bool:
        return self.run is not None and not self.sticky and self.age > self.snap.stale_after[self.profile]

    @property
    def no_result(self) -> bool:
        return self.run is None or self.run.report is None


@dataclasses.dataclass(frozen=True)
class Finding:
    """What one overlay adds: a check entry under ``key``, a note, and its effect on the verdict."""

    effect: str = "pass"  # pass | warn | fail
    key: str = ""  # the check it adds, if any
    entry: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    reason: str | None = None
    output: str = ""
    note: str | None = None


def _result_age(ask: Ask) -> Finding:
    """``serve:result-age``: no result yet (pending), a run without a report, or a stale result."""
    profile, run, now = ask.profile, ask.run, ask.now
    if run is None:
        output = f"no {profile} result yet: the first run is in progress"
        return Finding("fail", "serve:result-age", _entry("serve", "fail", output, cause=PENDING, now=now),
                       "pending", output)
    age, limit = ask.age, ask.snap.stale_after[profile]
    reason: str | None
    cause: Cause | None = None
    if ask.stale:
        effect, reason, cause = "fail", "stale", STALE
        output = (f"{profile} result is stale: {age:.0f} s old, expected every "
                  f"{ask.snap.intervals[profile]:g} s (+ slack, limit {limit:g} s); see the log for the run")
    elif run.report is None:
        effect, reason, cause = "fail", run.reason, RUN_FAILED.get(run.reason or "")
        output = f"the {profile} run failed ({run.reason}): {run.message}"
    else:
        effect, reason = "pass", run.reason
        output = (f"result is {age:.1f} s old (stale after {limit:g} s)" if not ask.sticky
                  else f"startup passed {age:.0f} s ago")
    entry = _entry("serve", effect, output, cause=cause, reason=reason, value=round(age, 3), unit="s",
                   now=now)
    return Finding(effect, "serve:result-age", entry, reason, output if effect == "fail" else "")


def _xid_events(ask: Ask) -> Finding | None:
    """``xid:events``: application and other Xids warn for a while (critical ones latch: see
    _latch)."""
    recent = [e for e in ask.snap.events
              if e.severity in ("application", "other") and ask.now - e.time <= XID_WARN_SECONDS]
    if not recent:
        return None
    last = recent[-1]
    msg = (f"{last.describe()} ({len(recent)} in the last {XID_WARN_SECONDS / 60:.0f} min): "
           f"{last.advice()}")
    cause = XID_APPLICATION if last.severity == "application" else XID_OTHER
    entry = _entry("hardware", "warn", msg, cause=cause, reason=f"xid-{last.data}", value=last.data,
                   now=ask.now)
    return Finding("warn", "xid:events", entry, note=msg)


def _slowdown(ask: Ask) -> Finding | None:
    """``nvml:slowdown``: sustained hardware slowdown or power brake (a rate, never one reading)."""
    if not PROFILE_RULES[ask.profile].hardware:
        return None
    slowing: dict[int, SlowdownVerdict] = {}
    for gpu, times in sorted(ask.snap.slowdown.items()):
        judged = slowdown_window(times, ask.now)
        if judged.warn:
            slowing[gpu] = judged
    if not slowing:
        return None
    gpu, v = next(iter(slowing.items()))
    msg = (v.describe(gpu) + (f" and {len(slowing) - 1} other GPU(s)" if len(slowing) > 1 else "")
           + ": " + SLOWDOWN.remedy)
    entry = _entry("hardware", "warn", msg, cause=SLOWDOWN, value=round(v.per_minute, 2),
                   unit="per minute", now=ask.now)
    return Finding("warn", "nvml:slowdown", entry, note=msg)


def _watcher(ask: Ask) -> Finding | None:
    """A note when NVML events cannot be watched."""
    if ask.snap.watcher not in ("unavailable", "failed"):
        return None
    return Finding(note="Xid/ECC event watching is off: NVML events are unavailable (see the log)")


def _latch(ask: Ask) -> Finding:
    """``latch:state``: latched unhealthy until the container restarts; a pass when not (or, for
    startup once it passed, not judged: that answer stands for good)."""
    latch = ask.snap.latch
    if latch is None or ask.sticky:
        said = "not latched" if not ask.sticky else "not judged once startup passed (see /livez and /readyz)"
        return Finding(key="latch:state", entry=_entry("hardware", "pass", said, now=ask.now))
    why = squeeze(latch.get("reason", "latched"), 200)
    code = squeeze(latch.get("code") or "latched", 40)
    cause = LATCHED_XID if latch.get("source") == "xid" else LATCHED_CUDA
    msg = f"latched unhealthy: {why}; {cause.remedy}"
    entry = _entry("hardware", "fail", msg, cause=cause, reason=code, now=ask.now)
    return Finding("fail", "latch:state", entry, code, msg)


OVERLAYS = (_result_age, _xid_events, _slowdown, _watcher, _latch)


@dataclasses.dataclass(frozen=True)
class Answer:
    """An endpoint's answer before it is written out: the verdict and the checks behind it."""

    status: str
    reason: str | None
    output: str
    checks: Mapping[str, Sequence[Mapping[str, Any]]]
    notes: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()


def _from_report(ask: Ask) -> Answer:
    """The run's own verdict: its status, its first failure, its checks (a failed verdict without one)."""
    run = ask.run
    report = run.report if run is not None else None
    if not report:
        return Answer("fail", None, "", {})
    reason, output = _first_failure(report)
    return Answer(report["status"], reason, output or report.get("output", ""), dict(report["checks"]))


def _overlay(answer: Answer, finding: Finding) -> Answer:
    checks = {**answer.checks, finding.key: [finding.entry]} if finding.key else answer.checks
    notes = (*answer.notes, finding.note) if finding.note else answer.notes
    if finding.effect == "fail":
        return Answer("fail", finding.reason, finding.output, checks, notes)
    status = "warn" if finding.effect == "warn" and answer.status == "pass" else answer.status
    return Answer(status, answer.reason, answer.output, checks, notes)


def _select(ask: Ask, answer: Answer, only: str | None, exclude: Sequence[str]) -> Answer:
    """``/<check>`` keeps one check, ``?exclude=`` leaves some out; what is left is folded again,
    unless there is no result or it is stale: nothing turns those into a pass."""
    names = {check_name(k): k for k in answer.checks}
    if only is not None and only not in names and not ask.no_result:
        raise UnknownCheck(only, sorted(names))
    excluded = tuple(n for n in names if (n != only if only is not None else n in exclude))
    unknown = sorted({n for n in exclude if n not in names})
    notes = answer.notes
    if unknown:
        notes += ("some health checks cannot be excluded: no matches for "
                  + ", ".join(f'"{squeeze(n, 80)}"' for n in unknown[:10]),)
    if not excluded:
        return dataclasses.replace(answer, notes=notes)
    checks = {k: v for k, v in answer.checks.items() if check_name(k) not in excluded}
    status, reason, output = answer.status, answer.reason, answer.output
    if not ask.no_result and not ask.stale:
        status, reason, output = _fold(checks)
    return Answer(status, reason, output, checks, notes, excluded)


def _respond(ask: Ask, answer: Answer, *, gating: bool, version: str, only: str | None
             ) -> tuple[int, dict[str, Any]]:
    """The HTTP status and the health+json body."""
    profile, status, reason = ask.profile, answer.status, answer.reason
    if status == "fail" and not reason:
        reason = "fail"
    report = ask.run.report if ask.run is not None and ask.run.report is not None else None
    notes = list(answer.notes)
    code = 200 if status in ("pass", "warn") else 503
    if not gating and PROFILE_RULES[profile].gates and code != 200:
        notes.append("readiness gating is off (HEALTHCHECK_SERVE_READINESS_GATING=false): answering 200")
        code = 200
    verdict_line = f"{status}: {answer.output}" if status != "pass" else f"pass: {profile} healthy"
    body: dict[str, Any] = {
        "status": status,
        "version": (report or {}).get("version") or version,
        "description": f"healthcheck serve: {profile} profile",
        "profile": profile,
        "output": squeeze(verdict_line),
        "reason": reason,
        "time": iso_time(ask.now),
        "notes": ((report or {}).get("notes") or []) + notes,
        "checks": dict(answer.checks),
    }
    if report and report.get("skipped"):
        body["skipped"] = report["skipped"]
    if answer.excluded and only is None:
        body["excluded"] = list(answer.excluded)
    return code, body


def verdict(profile: str, snap: Snapshot, *, now: float, now_mono: float, gating: bool = True,
            version: str = "", only: str | None = None,
            exclude: Sequence[str] = ()) -> tuple[int, dict[str, Any]]:
    """The HTTP status and the health+json body of the endpoint for ``profile``.

    ``only`` narrows it to one check (``/readyz/<name>``; UnknownCheck when there is none, unless the
    run has no report yet: then it fails with the run's reason); ``exclude`` leaves checks out
    (``?exclude=<name>``). Neither can turn a missing or stale result into a pass.
    """
    ask = Ask(profile, snap, now, now_mono)
    answer = _from_report(ask)
    for overlay in OVERLAYS:
        finding = overlay(ask)
        if finding is not None:
            answer = _overlay(answer, finding)
    answer = _select(ask, answer, only, exclude)
    return _respond(ask, answer, gating=gating, version=version, only=only)


def verbose_text(endpoint: str, body: Mapping[str, Any]) -> str:
    """The Kubernetes API server's ``?verbose`` form: ``[+]name ok`` / ``[-]name failed: reason``
    per check, then ``<endpoint> check passed`` (or ``failed``)."""
    lines = []
    for key, entries in body.get("checks", {}).items():
        e = entries[0] if entries else {"status": "fail"}
        name = check_name(key)
        if e.get("status") == "fail":
            why = f"{e.get('reason') or 'fail'}: {e.get('output') or ''}".rstrip(": ")
            lines.append(f"[-]{name} failed: {why}")
        elif e.get("status") == "warn":
            lines.append(f"[+]{name} ok (warn: {e.get('output') or ''})")
        else:
            lines.append(f"[+]{name} ok")
    lines += [f"[+]{name} excluded: ok" for name in body.get("excluded", [])]
    lines += [f"warn: {n}" for n in body.get("notes", []) if n.startswith("some health checks cannot be")]
    lines.append(f"{endpoint} check {'failed' if body.get('status') == 'fail' else 'passed'}")
    return "\n".join(lines) + "\n"
