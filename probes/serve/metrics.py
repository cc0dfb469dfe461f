"""/metrics: Prometheus text format (or OpenMetrics when asked) from the monitor's in-memory snapshot.

A collector on its own registry (prometheus_client's global one would add process metrics and be
shared with anything else in the process): a scrape reads one Snapshot and the counters, never a
probe or NVML. Per-GPU series carry ``gpu`` and ``UUID``, dcgm-exporter's labels, to join with its.
"""

from __future__ import annotations

import dataclasses
import platform
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from probes import __version__
from probes import config as cfg
from probes.hardware import xids
from probes.result import Result
from probes.serve.monitor import Monitor
from probes.serve.view import Run, Snapshot, check_name, results_of, verdict
from probes.spec import PROFILE_RULES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

STATUSES = ("pass", "warn", "fail", "skip")
WATCHER_STATES = ("running", "starting", "unavailable", "failed", "off")


@dataclasses.dataclass(frozen=True)
class Reading:
    """What one scrape reads from the monitor, once: every family is built from it."""

    snap: Snapshot
    runs_total: Mapping[tuple[str, str], int]
    last_success: Mapping[tuple[str, str], float]
    events: Mapping[tuple[str, str, str, str], int]
    mono: float
    verdicts: Mapping[str, tuple[int, Mapping[str, Any]]]  # profile -> the endpoint's code and body

    def finished_runs(self) -> Iterator[tuple[str, Run]]:
        for profile in cfg.PROFILES:
            run = self.snap.runs.get(profile)
            if run is not None:
                yield profile, run

    def results(self) -> Iterator[tuple[str, Result]]:
        for profile, run in self.finished_runs():
            if run.report is not None:
                for r in results_of(run.report, run.finished):
                    yield profile, r


def read(monitor: Monitor) -> Reading:
    snap = monitor.snapshot()
    runs_total, last_success, events = monitor.counters()
    now, mono = time.time(), time.monotonic()
    verdicts = {p: verdict(p, snap, now=now, now_mono=mono) for p in cfg.PROFILES}
    return Reading(snap, runs_total, last_success, events, mono, verdicts)


def healthy(r: Reading) -> Metric:
    m = GaugeMetricFamily("healthcheck_healthy", "1 if the profile's endpoint would answer 200 "
                          "(before readiness gating), else 0", labels=["profile"])
    for profile in cfg.PROFILES:
        m.add_metric([profile], 1.0 if r.verdicts[profile][0] == 200 else 0.0)
    return m


def result_age(r: Reading) -> Metric:
    m = GaugeMetricFamily("healthcheck_result_age_seconds", "Age of the profile's latest result",
                          labels=["profile"])
    for profile, run in r.finished_runs():
        m.add_metric([profile], max(0.0, r.mono - run.finished_mono))
    return m


def result_stale(r: Reading) -> Metric:
    m = GaugeMetricFamily("healthcheck_result_stale", "1 if the latest result is older than interval + slack",
                          labels=["profile"])
    for profile, _ in r.finished_runs():
        m.add_metric([profile], 1.0 if r.verdicts[profile][1].get("reason") == "stale" else 0.0)
    return m


def run_duration(r: Reading) -> Metric:
    m = GaugeMetricFamily("healthcheck_run_duration_seconds", "Wall time of the profile's latest run",
                          labels=["profile"])
    for profile, run in r.finished_runs():
        m.add_metric([profile], run.duration)
    return m


def probe_status(r: Reading) -> Metric:
    m = GaugeMetricFamily("healthcheck_probe_status",
                          "1 for the probe's status in the latest run of the profile",
                          labels=["profile", "probe", "status"])
    for profile, res in r.results():
        for s in STATUSES:
            m.add_metric([profile, res.name, s], 1.0 if res.status.value == s else 0.0)
    return m


def probe_reason(r: Reading) -> Metric:
    # As kube-state-metrics' *_reason series: one per reason while it holds, so an alert's
    # description can name it without the alert's own series changing with it. ``actor`` and
    # ``action`` (the catalog's: who can act, tenant or operator, and how) let the alert rules
    # route a failure to whoever can fix it; empty for a check that did not run.
    m = GaugeMetricFamily("healthcheck_probe_reason", "1 for the reason code of each check that warns, "
                          "fails or did not run, as the profile's endpoint reports it (present only then), "
                          "with who can act (actor: tenant or operator) and how (action)",
                          labels=["profile", "probe", "reason", "action", "actor"])
    for profile in cfg.PROFILES:
        body = r.verdicts[profile][1]
        entries = [(key, e) for key, es in body.get("checks", {}).items() for e in es[:1]
                   if e.get("status") != "pass"]
        entries += list(body.get("skipped", {}).items())
        seen = set()
        for key, e in entries:
            labels = (profile, check_name(key), *(str(e.get(k) or "")[:40] for k in ("reason", "action",
                                                                                        "actor")))
            if labels[2] and labels not in seen:
                seen.add(labels)
                m.add_metric(list(labels), 1.0)
    return m


def probe_duration(r: Reading) -> Metric:
    m = GaugeMetricFamily("healthcheck_probe_duration_seconds", "Time the probe took in the latest run",
                          labels=["profile", "probe"])
    for profile, res in r.results():
        m.add_metric([profile, res.name], res.elapsed)
    return m


def probe_last_success(r: Reading) -> Metric:
    m = GaugeMetricFamily("healthcheck_probe_last_success_timestamp_seconds",
                          "When the probe last passed (or warned), Unix time", labels=["profile", "probe"])
    for (profile, probe), t in sorted(r.last_success.items()):
        m.add_metric([profile, probe], t)
    return m


def runs(r: Reading) -> Metric:
    m = CounterMetricFamily("healthcheck_runs", "Runs of each profile by outcome (pass, warn, fail, "
                            "or why no report came: deadline, bad-output, ...)",
                            labels=["profile", "outcome"])
    for (profile, outcome), n in sorted(r.runs_total.items()):
        m.add_metric([profile, outcome], n)
    return m


def latched(r: Reading) -> Metric:
    # One unlabelled 0/1 series: a latch never swaps one series for another; the source is
    # in healthcheck_latch_info while latched.
    m = GaugeMetricFamily("healthcheck_latched", "1 while the container is latched unhealthy "
                          "(critical Xid or fatal CUDA error) until it restarts, else 0")
    m.add_metric([], 1.0 if r.snap.latch is not None else 0.0)
    return m


def latch_info(r: Reading) -> Metric:
    m = InfoMetricFamily("healthcheck_latch", "Why the container is latched (present only while latched)")
    latch = r.snap.latch
    if latch is not None:
        m.add_metric([], {"source": str(latch.get("source") or "unknown")[:80],
                          "code": str(latch.get("code") or "latched")[:40]})
    return m


def nvml_events(r: Reading) -> Metric:
    m = CounterMetricFamily("healthcheck_nvml_events", "NVML events seen while serving; action: what the "
                            "event needs (NVIDIA's Xid catalog's immediate action)",
                            labels=["gpu", "UUID", "kind", "xid", "severity", "action"])
    uuids = _uuids(r.snap)
    for (gpu, kind, xid, sev), n in sorted(r.events.items()):
        m.add_metric([gpu, uuids.get(gpu, ""), kind, xid, sev, action(kind, xid)], n)
    return m


def action(kind: str, xid: str) -> str:
    """What an event needs, whatever serve's latch policy says: for an Xid the catalog's resolution
    (``unknown`` when the table lacks it), a GPU reset for an uncorrectable ECC error, else nothing."""
    if kind == "xid":
        return xids.label(int(xid)) if xid.isdigit() and len(xid) < 6 else "unknown"
    return xids.LABELS[xids.RESET_GPU] if kind == "ecc-double" else "none"


def event_watch(r: Reading) -> Metric:
    m = GaugeMetricFamily("healthcheck_nvml_event_watch", "1 for the state of the NVML Xid/ECC event watcher",
                          labels=["state"])
    for s in WATCHER_STATES:
        m.add_metric([s], 1.0 if r.snap.watcher == s else 0.0)
    return m


def build(r: Reading) -> Metric:
    m = InfoMetricFamily("healthcheck_build", "The suite's version, its Python, and the torch the "
                         "torch-cuda probe found (empty until it ran)")
    m.add_metric([], {"version": __version__, "python": platform.python_version(),
                      "torch": str(_facts(r.snap, "torch-cuda").get("torch") or "")})
    return m


def gpu_up(r: Reading) -> Metric:
    m = GaugeMetricFamily("healthcheck_gpu_up", "1 if NVML answered for the GPU without an error "
                          "in the latest readiness (else startup) run, else 0",
                          labels=["gpu", "UUID", "modelName"])
    for g in _facts(r.snap, "nvml").get("gpus") or []:
        m.add_metric([str(g["index"]), g.get("uuid", ""), g.get("name", "")], 1.0 if g.get("ok") else 0.0)
    return m


# The exposition's order.
FAMILIES: tuple[Callable[[Reading], Metric], ...] = (
    healthy, result_age, result_stale, run_duration, probe_status, probe_reason, probe_duration,
    probe_last_success, runs, latched, latch_info, nvml_events, event_watch, build, gpu_up)


class HealthCollector(Collector):
    def __init__(self, monitor: Monitor):
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        reading = read(self.monitor)
        for family in FAMILIES:
            yield family(reading)


def _uuids(snap: Snapshot) -> dict[str, str]:
    """GPU index -> UUID, from the nvml facts and the events themselves (which name both)."""
    gpus = _facts(snap, "nvml").get("gpus") or []
    out = {str(g["index"]): g["uuid"] for g in gpus if g.get("uuid")}
    out.update({str(e.gpu): e.uuid for e in snap.events if e.gpu is not None and e.uuid})
    return out


def _facts(snap: Snapshot, probe: str) -> Mapping[str, Any]:
    """The probe's facts from the latest run that has its check of a profile that judges the hardware:
    one that keeps running (readiness) first, then the one run once per start (startup)."""
    for rules in sorted((p for p in PROFILE_RULES.values() if p.hardware), key=lambda p: p.once):
        run = snap.runs.get(rules.name)
        if run is None or run.report is None:
            continue
        for key, entries in run.report.get("checks", {}).items():
            if key.split(":", 1)[0] == probe and entries:
                return entries[0].get("facts") or {}
    return {}


def registry_for(monitor: Monitor) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(HealthCollector(monitor))
    return reg


def render(registry: CollectorRegistry, accept: str | None = None) -> tuple[bytes, str]:
    """The exposition and its content type, as the scraper's Accept header asks (OpenMetrics or text)."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type
