"""Hardware slowdown in serve is judged by rate over a window, not on one reading.

The window is a pure function fed with timestamps (a clock the test drives); one real serve
run over the fake NVML shows the watcher's readings reaching the judgement."""

from __future__ import annotations

import time

from probes.serve.view import SLOWDOWN_PER_MINUTE, SLOWDOWN_WINDOW, slowdown_window
from tests.serve.conftest import marked_pids, watch_env

T0 = 1_800_000_000.0


def test_one_per_minute_for_ten_minutes_warns():
    times = [T0 + 60 * i for i in range(10)]
    verdict = slowdown_window(times, T0 + 9 * 60 + 1)
    assert verdict.warn and verdict.events == 10 and verdict.per_minute == 1.0


def test_a_single_reading_does_not_warn():
    assert not slowdown_window([T0], T0 + 1).warn


def test_readings_leave_the_window():
    times = [T0 + 60 * i for i in range(10)]
    assert not slowdown_window(times, T0 + 9 * 60 + SLOWDOWN_WINDOW).warn
    assert SLOWDOWN_WINDOW == 600.0 and SLOWDOWN_PER_MINUTE == 0.5  # the documented thresholds
    # 4 readings in 10 minutes (0.4/min) stay quiet, 5 (0.5/min) warn
    assert not slowdown_window(times[:4], T0 + 300).warn
    assert slowdown_window(times[:5], T0 + 300).warn


def test_serve_warns_on_a_sustained_power_brake_not_on_a_clean_gpu(start_server, fake_nvml, tmp_path):
    srv = start_server(watch_env(fake_nvml, tmp_path, "gpus 2\ngpu 1 clocks-event-reasons 0x80\n",
                                 HEALTHCHECK_SERVE_SLOWDOWN_SAMPLE="0.1"),
                       "--interval", "0.5")
    deadline = time.monotonic() + 20
    while "hardware slowdown or power brake" not in srv.log_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    text = srv.log_text()
    assert "GPU 1: hardware slowdown or power brake" in text and "warns at 0.5/min" in text, text
    assert "GPU 0: hardware slowdown" not in text
    # ... and it reaches readiness (a warning: 200), never liveness.
    code, doc = srv.wait_for("/readyz", lambda c, b: "nvml:slowdown" in b.get("checks", {}), 20,
                             "the sustained slowdown reaches readiness")
    check = doc["checks"]["nvml:slowdown"][0]
    assert code == 200 and check["status"] == "warn" and check["reason"] == "hw-slowdown-sustained"
    assert check["output"].startswith("GPU 1: hardware slowdown or power brake")
    assert "nvml:slowdown" not in srv.health("/livez")[1]["checks"]
    assert srv.terminate() == 0
    assert not marked_pids(srv.marker)
