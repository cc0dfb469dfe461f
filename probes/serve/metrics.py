"""/metrics: Prometheus text format (or OpenMetrics when asked) from the monitor's in-memory snapshot.

A custom collector on its own registry (not prometheus_client's global one, which
would add process metrics and would be shared with anything else in the process):
every scrape reads one Snapshot and the counters, never a probe or NVML.
Per-GPU series carry ``gpu`` (the index) and ``UUID``, the labels dcgm-exporter uses,
so a query can join them with its series.
Command-line equivalent: ``curl -s localhost:8779/metrics``.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from probes import __version__
from probes import config as cfg
from probes.serve.monitor import Monitor
from probes.serve.view import Snapshot, results_of, verdict

TYPE_CHECKING = False  # typing is not imported at run time (see probes/_typing.py)
if TYPE_CHECKING:
    from typing import Any

STATUSES = ("pass", "warn", "fail", "skip")
WATCHER_STATES = ("running", "starting", "unavailable", "failed", "off")


class HealthCollector(Collector):
    def __init__(self, monitor: Monitor):
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        snap = self.monitor.snapshot()
        runs_total, last_success, events = self.monitor.counters()
        now, mono = time.time(), time.monotonic()

        healthy = GaugeMetricFamily("healthcheck_healthy", "1 if the profile's endpoint would answer 200 "
                                    "(before readiness gating), else 0", labels=["profile"])
        age = GaugeMetricFamily("healthcheck_result_age_seconds",
                                "Age of the profile's latest result", labels=["profile"])
        stale = GaugeMetricFamily("healthcheck_result_stale",
                                  "1 if the latest result is older than interval + slack", labels=["profile"])
        run_dur = GaugeMetricFamily("healthcheck_run_duration_seconds",
                                    "Wall time of the profile's latest run", labels=["profile"])
        status = GaugeMetricFamily("healthcheck_probe_status",
                                   "1 for the probe's status in the latest run of the profile",
                                   labels=["profile", "probe", "status"])
        dur = GaugeMetricFamily("healthcheck_probe_duration_seconds",
                                "Time the probe took in the latest run", labels=["profile", "probe"])
        ok_at = GaugeMetricFamily("healthcheck_probe_last_success_timestamp_seconds",
                                  "When the probe last passed (or warned), Unix time",
                                  labels=["profile", "probe"])
        for profile in cfg.PROFILES:
            code, body = verdict(profile, snap, now=now, now_mono=mono)
            healthy.add_metric([profile], 1.0 if code == 200 else 0.0)
            run = snap.runs.get(profile)
            if run is None:
                continue
            a = max(0.0, mono - run.finished_mono)
            age.add_metric([profile], a)
            stale.add_metric([profile], 1.0 if body.get("reason") == "stale" else 0.0)
            run_dur.add_metric([profile], run.duration)
            if run.report is not None:
                for r in results_of(run.report, run.finished):
                    for s in STATUSES:
                        status.add_metric([profile, r.name, s], 1.0 if r.status.value == s else 0.0)
                    dur.add_metric([profile, r.name], r.elapsed)
        for (profile, probe), t in sorted(last_success.items()):
            ok_at.add_metric([profile, probe], t)

        runs = CounterMetricFamily("healthcheck_runs", "Runs of each profile by outcome (pass, warn, fail, "
                                   "or why no report came: deadline, bad-output, ...)",
                                   labels=["profile", "outcome"])
        for (profile, outcome), n in sorted(runs_total.items()):
            runs.add_metric([profile, outcome], n)

        ev = CounterMetricFamily("healthcheck_nvml_events", "NVML events seen while serving",
                                 labels=["gpu", "UUID", "kind", "xid", "severity"])
        uuids = _uuids(snap)
        for (gpu, kind, xid, sev), n in sorted(events.items()):
            ev.add_metric([gpu, uuids.get(gpu, ""), kind, xid, sev], n)

        watcher = GaugeMetricFamily("healthcheck_nvml_event_watch", "1 for the state of the NVML "
                                    "Xid/ECC event watcher", labels=["state"])
        for s in WATCHER_STATES:
            watcher.add_metric([s], 1.0 if snap.watcher == s else 0.0)

        build = InfoMetricFamily("healthcheck_build", "The suite's version, its Python, and the torch the "
                                 "torch-cuda probe found (empty until it ran)")
        build.add_metric([], {"version": __version__, "python": platform.python_version(),
                              "torch": str(_facts(snap, "torch-cuda").get("torch") or "")})

        # One unlabelled 0/1 series: a latch never swaps one series for another; the source is
        # in healthcheck_latch_info while latched.
        latched = GaugeMetricFamily("healthcheck_latched", "1 while the container is latched unhealthy "
                                    "(critical Xid or fatal CUDA error) until it restarts, else 0")
        latched.add_metric([], 1.0 if snap.latch is not None else 0.0)
        latch_info = InfoMetricFamily("healthcheck_latch", "Why the container is latched (present only "
                                      "while latched)")
        if snap.latch is not None:
            latch_info.add_metric([], {"source": str(snap.latch.get("source") or "unknown")[:80],
                                       "code": str(snap.latch.get("code") or "latched")[:40]})

        gpu_up = GaugeMetricFamily("healthcheck_gpu_up", "1 if NVML answered for the GPU without an error "
                                   "in the latest readiness (else startup) run, else 0",
                                   labels=["gpu", "UUID", "modelName"])
        for g in _facts(snap, "nvml").get("gpus") or []:
            up = 1.0 if g.get("ok") else 0.0
            gpu_up.add_metric([str(g["index"]), g.get("uuid", ""), g.get("name", "")], up)

        yield from (healthy, age, stale, run_dur, status, dur, ok_at, runs, latched, latch_info, ev, watcher,
                    build, gpu_up)


def _uuids(snap: Snapshot) -> dict[str, str]:
    """GPU index -> UUID, from the nvml facts and the events themselves (which name both)."""
    gpus = _facts(snap, "nvml").get("gpus") or []
    out = {str(g["index"]): g["uuid"] for g in gpus if g.get("uuid")}
    out.update({str(e.gpu): e.uuid for e in snap.events if e.gpu is not None and e.uuid})
    return out


def _facts(snap: Snapshot, probe: str) -> Mapping[str, Any]:
    """The probe's facts from the latest readiness run that has its check, else startup's."""
    for profile in ("readiness", "startup"):
        run = snap.runs.get(profile)
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
