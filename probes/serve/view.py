"""What the endpoints answer: pure functions over the monitor's snapshots (docs/serve.md). A child's
report is rebuilt from known fields, never passed through; serve's own checks join its checks."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from probes import __version__, serve
from probes.hardware import xids
from probes.record import Record
from probes.report import check_entry, iso_time, public_facts
from probes.spec import PROFILE_RULES, Cause
from probes.untrusted import load_json, squeeze

CHECK_KEYS = ("componentId", "componentType", "layer", "status", "observedValue", "observedUnit", "time",
              "output", "message", "reason", "action", "actor", "elapsed", "facts")
STATUSES = ("pass", "warn", "fail")
FIRST_TO_TELL = {"latch:state": 2, "serve:result-age": 1}  # why a verdict fails: these before the report's
XID_WARN = 600.0  # an application or other Xid warns this long after it was seen
SLOWDOWN_WINDOW = 600.0  # seconds of readings that judge a GPU's slowdown, by rate, never by one
SLOWDOWN_PER_MINUTE = 0.5


def _rebuilt(entry: Any) -> dict[str, Any] | None:
    if not isinstance(entry, dict) or entry.get("status") not in STATUSES:
        return None
    out: dict[str, Any] = {}
    for key in CHECK_KEYS:
        v = entry.get(key)
        if key == "observedValue" and not isinstance(v, (bool, int, float, type(None))):
            v = squeeze(v if isinstance(v, str) else json.dumps(v, sort_keys=True))
        elif key == "facts":
            v = public_facts(v) or None
        elif key == "elapsed":
            v = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        elif key != "observedValue" and v is not None:
            v = squeeze(v)
        if v is not None or (key == "reason" and key in entry):
            out[key] = v
    if "observedValue" not in out:
        out.pop("observedUnit", None)
    return out


def parse_report(stdout: bytes) -> dict[str, Any] | None:
    """The report a ``--json`` run printed, rebuilt from known fields; None when it is not one."""
    try:
        data = load_json(stdout)  # bounded nesting, finite numbers
    except ValueError:
        return None
    checks = data.get("checks") if isinstance(data, dict) else None
    if not isinstance(checks, dict) or data.get("status") not in STATUSES:
        return None
    rebuilt = {squeeze(k, 80): [_rebuilt(e) for e in v] if isinstance(v, list) else [None]
               for k, v in checks.items()}
    if any(None in entries for entries in rebuilt.values()):
        return None
    notes, skipped = data.get("notes"), data.get("skipped")
    return {"status": data["status"], "output": squeeze(data.get("output", "")), "checks": rebuilt,
            "notes": [squeeze(n) for n in notes[:20]] if isinstance(notes, list) else [],
            "skipped": {squeeze(k, 80): {f: squeeze(v[f]) for f in ("output", "reason", "time")
                                         if isinstance(v.get(f), str)}
                        for k, v in list(skipped.items())[:40] if isinstance(v, dict)}
            if isinstance(skipped, dict) else {}}


class Run(Record):
    profile: str
    finished: float  # wall clock
    finished_mono: float  # time.monotonic(), for the age
    duration: float
    report: Mapping[str, Any] | None  # None: the run produced no report
    reason: str | None = None  # why there is no report ("deadline", "bad-output", ...)
    message: str = ""


class XidEvent(Record):
    time: float  # wall clock
    gpu: int | None
    uuid: str
    kind: str  # xid | ecc-single | ecc-double
    data: int
    severity: str  # critical | application | other | corrected | ignored | no-action

    def advice(self) -> str:  # of an Xid
        if self.severity == xids.APPLICATION:
            todo = xids.BUCKETS[xids.RESTART_APP].todo
        elif self.severity == xids.CRITICAL and not xids.latches(self.data):
            todo = "latched as HEALTHCHECK_XID_CRITICAL lists it"
        else:
            todo = xids.bucket(self.data).todo
        return f"{xids.describe(self.data)}; {todo}"

    def describe(self) -> str:
        where = f"GPU {self.gpu}" if self.gpu is not None else "a GPU"
        what = {"xid": f"Xid {self.data}", "ecc-double": "uncorrectable (double-bit) ECC error"}
        return what.get(self.kind, "corrected (single-bit) ECC error") + f" on {where}" + (
            f" ({self.uuid})" if self.uuid else "")


class SlowdownVerdict(Record):
    events: int  # readings with HW slowdown or power brake in the window
    per_minute: float
    warn: bool

    def describe(self, gpu: int) -> str:
        return (f"GPU {gpu}: hardware slowdown or power brake in {self.events} readings over the last "
                f"{SLOWDOWN_WINDOW / 60:g} min ({self.per_minute:.1f}/min, warns at "
                f"{SLOWDOWN_PER_MINUTE:g}/min)")


def slowdown_window(times: Sequence[float], now: float) -> SlowdownVerdict:
    recent = sum(1 for t in times if now - SLOWDOWN_WINDOW < t <= now)
    rate = recent / (SLOWDOWN_WINDOW / 60.0)
    return SlowdownVerdict(recent, rate, rate >= SLOWDOWN_PER_MINUTE)


class Snapshot(Record):  # replaced whole, never changed in place: its defaults are shared
    watcher: str  # starting | running | unavailable | failed | off
    intervals: Mapping[str, float]
    stale_after: Mapping[str, float]
    latch: Mapping[str, Any] | None = None
    runs: Mapping[str, Run] = {}
    startup_passed: Run | None = None
    events: Sequence[XidEvent] = ()  # recent ones, newest last
    slowdown: Mapping[int, Sequence[float]] = {}  # per GPU index, the times of readings with HW slowdown
    runs_total: Mapping[tuple[str, str], int] = {}  # (profile, outcome): runs
    last_success: Mapping[tuple[str, str], float] = {}  # (profile, probe): when it last passed or warned
    event_counts: Mapping[tuple[str, str, str, str], int] = {}  # (gpu, kind, xid, severity): events


class UnknownCheck(LookupError):
    """``/<endpoint>/<name>`` names no check of the endpoint; args: the name, the known ones."""


def check_name(key: str) -> str:  # as /readyz/<name> and ?exclude=<name> know it
    return key.split(":", 1)[0]


def _entry(layer: str, status: str, output: str, cause: Cause | None, now: float, reason: str | None = None,
           value: Any = None, unit: str | None = None) -> list[dict[str, Any]]:
    return [check_entry(status=status, time=now, output=output, layer=layer, observed=value, unit=unit,
                        reason=reason or (cause.reason if cause else None),
                        action=cause.action if cause else None, actor=cause.actor if cause else None)]


def _own_checks(profile: str, snap: Snapshot, run: Run | None, sticky: bool, now: float, now_mono: float
                ) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    checks, notes = {}, []
    if run is None:
        said = f"no {profile} result yet: the first run is in progress"
        checks["serve:result-age"] = _entry("serve", "fail", said, serve.PENDING, now)
    else:
        age, limit = max(0.0, now_mono - run.finished_mono), snap.stale_after[profile]
        status, cause = "fail", serve.STALE  # type: str, Cause | None
        if not sticky and age > limit:
            said = (f"{profile} result is stale: {age:.0f} s old, expected every "
                    f"{snap.intervals[profile]:g} s (+ slack, limit {limit:g} s); see the log for the run")
        elif run.report is None:
            cause = serve.RUN_FAILED.get(run.reason or "")
            said = f"the {profile} run failed ({run.reason}): {run.message}"
        else:
            status, cause = "pass", None
            said = (f"startup passed {age:.0f} s ago" if sticky
                    else f"result is {age:.1f} s old (stale after {limit:g} s)")
        checks["serve:result-age"] = _entry("serve", status, said, cause, now, None, round(age, 3), "s")
    recent = [e for e in snap.events if e.severity in ("application", "other") and now - e.time <= XID_WARN]
    if recent:
        last = recent[-1]
        said = f"{last.describe()} ({len(recent)} in the last {XID_WARN / 60:.0f} min): {last.advice()}"
        cause = serve.XID_APPLICATION if last.severity == "application" else serve.XID_OTHER
        checks["xid:events"] = _entry("hardware", "warn", said, cause, now, f"xid-{last.data}", last.data)
        notes.append(said)
    slowing = [(gpu, v) for gpu, times in sorted(snap.slowdown.items())
               if (v := slowdown_window(times, now)).warn]
    if slowing and PROFILE_RULES[profile].hardware:
        (gpu, v), more = slowing[0], len(slowing) - 1
        said = v.describe(gpu) + (f" and {more} other GPU(s)" if more else "") + f": {serve.SLOWDOWN.remedy}"
        checks["nvml:slowdown"] = _entry("hardware", "warn", said, serve.SLOWDOWN, now, None,
                                         round(v.per_minute, 2), "per minute")
        notes.append(said)
    if snap.watcher in ("unavailable", "failed"):
        notes.append("Xid/ECC event watching is off: NVML events are unavailable (see the log)")
    latch = snap.latch
    if latch is None or sticky:  # once startup passed, that answer stands for good
        said = "not judged once startup passed (see /livez and /readyz)" if sticky else "not latched"
        checks["latch:state"] = _entry("hardware", "pass", said, None, now)
    else:
        cause = serve.LATCHED_XID if latch.get("source") == "xid" else serve.LATCHED_CUDA
        said = f"latched unhealthy: {squeeze(latch.get('reason', 'latched'), 200)}; {cause.remedy}"
        code = squeeze(latch.get("code") or "latched", 40)
        checks["latch:state"] = _entry("hardware", "fail", said, cause, now, code)
    return checks, notes


def _fold(checks: Mapping[str, Sequence[Mapping[str, Any]]], floor: str = "pass"
          ) -> tuple[str, str | None, str]:
    """Status, reason and output of the checks: the worst wins, the first to tell says why."""
    entries = [checks[k][0] for k in sorted(checks, key=lambda k: -FIRST_TO_TELL.get(k, 0)) if checks[k]]
    status = max([floor, *(e["status"] for e in entries)], key=STATUSES.index)
    first = max(entries, key=lambda e: STATUSES.index(e["status"]), default=None)  # the first fail, else warn
    if first is None or first["status"] == "pass":
        return status, None, ""
    why = (first.get("reason") or "fail") if first["status"] == "fail" else None
    return status, why, first.get("output") or ""


def verdict(profile: str, snap: Snapshot, *, now: float, now_mono: float, gating: bool = True,
            only: str | None = None, exclude: Sequence[str] = ()) -> tuple[int, dict[str, Any]]:
    """The HTTP status and health+json body of ``profile``'s endpoint. What ``only`` or ``exclude``
    leave decides again, unless there is no fresh report: nothing turns that into a pass."""
    sticky = PROFILE_RULES[profile].once and snap.startup_passed is not None
    run = snap.startup_passed if sticky else snap.runs.get(profile)
    report = run.report if run is not None else None
    own, notes = _own_checks(profile, snap, run, sticky, now, now_mono)
    checks = {**(report["checks"] if report else {}), **own}
    names = list(dict.fromkeys(check_name(k) for k in checks))
    if only is not None and only not in names and report is not None:
        raise UnknownCheck(only, names)
    excluded = [n for n in names if (n != only if only is not None else n in exclude)]
    unknown = sorted({n for n in exclude if n not in names})
    if unknown:
        notes.append("some health checks cannot be excluded: no matches for "
                     + ", ".join(f'"{squeeze(n, 80)}"' for n in unknown[:10]))
    status, reason, output = _fold(checks, report["status"] if report else "pass")
    if excluded:
        checks = {k: v for k, v in checks.items() if check_name(k) not in excluded}
        if own["serve:result-age"][0]["status"] == "pass":
            status, reason, output = _fold(checks)
    code = 503 if status == "fail" else 200
    if code != 200 and not gating and PROFILE_RULES[profile].gates:
        notes.append("readiness gating is off (HEALTHCHECK_SERVE_READINESS_GATING=false): answering 200")
        code = 200
    body: dict[str, Any] = {
        "status": status, "version": __version__, "description": f"healthcheck serve: {profile} profile",
        "profile": profile,
        "output": squeeze(f"{status}: {output}" if status != "pass" else f"pass: {profile} healthy"),
        "reason": reason or ("fail" if status == "fail" else None), "time": iso_time(now),
        "notes": [*(report["notes"] if report else []), *notes], "checks": checks}
    if report and report["skipped"]:
        body["skipped"] = report["skipped"]
    if excluded and only is None:
        body["excluded"] = excluded
    return code, body


def verbose_text(endpoint: str, body: Mapping[str, Any]) -> str:
    """The Kubernetes API server's ``?verbose`` form, a line per check, then the verdict."""
    lines = []
    for key, entries in body.get("checks", {}).items():
        e = entries[0] if entries else {"status": "fail"}
        name, status, said = check_name(key), e.get("status"), e.get("output") or ""
        if status == "fail":
            lines.append(f"[-]{name} failed: " + f"{e.get('reason') or 'fail'}: {said}".rstrip(": "))
        else:
            lines.append(f"[+]{name} ok" + (f" (warn: {said})" if status == "warn" else ""))
    lines += [f"[+]{name} excluded: ok" for name in body.get("excluded", [])]
    lines += [f"warn: {n}" for n in body.get("notes", []) if n.startswith("some health checks cannot be")]
    lines.append(f"{endpoint} check {'failed' if body.get('status') == 'fail' else 'passed'}")
    return "\n".join(lines) + "\n"
