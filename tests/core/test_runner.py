"""The runner: layer order, dependency skips, deadlines, errors kept out of the output."""

from __future__ import annotations

import os
import time

import pytest

from probes import runner
from probes.config import Config
from probes.result import Status
from probes.state import State
from tests.core.fakeprobes.behave import SEEN, THREADS, spec


@pytest.fixture
def state(tmp_path):
    return State.open(str(tmp_path / "state"))


def run(specs, state, timeout=5.0):
    return runner.run(Config(timeout=timeout), state, specs=specs)


def test_all_pass_keeps_registry_order(state):
    out = run([spec("a", "slow"), spec("b", "pass"), spec("c", "pass")], state)
    assert [r.name for r in out.results] == ["a", "b", "c"]
    assert out.status is Status.PASS
    assert all(r.elapsed >= 0 and r.time > 0 for r in out.results)


def test_a_run_takes_one_thread_per_probe(state):
    """Each thread counts against the container's process limit: a probe takes one, nothing watches it."""
    before = len(os.listdir("/proc/self/task"))
    THREADS.clear()
    out = run([spec(name, "slow") for name in ("a", "b", "c")], state)
    assert out.status is Status.PASS and len(THREADS) == 3
    assert max(THREADS) - before <= 3, THREADS


def test_worst_status_wins_and_first_failure_is_reported(state):
    out = run([spec("a", "warn"), spec("b", "fail"), spec("c", "fail")], state)
    assert out.status is Status.FAIL
    assert out.first_problem is not None and out.first_problem.name == "b"
    assert run([spec("a", "warn"), spec("b", "pass")], state).status is Status.WARN


def test_failed_requirement_skips_dependant_with_reason(state):
    specs = [spec("hw", "fail", layer="hardware"), spec("fw", "pass", layer="framework", requires=("hw",))]
    out = run(specs, state)
    fw = out.results[1]
    assert fw.status is Status.SKIP
    assert fw.reason == "dependency-failed"
    assert "hardware layer failed" in fw.message and "hw said fail" in fw.message
    assert "fw" not in [name for name, _ in SEEN[-1:]]  # never gathered


def test_dependant_sees_requirement_results(state):
    SEEN.clear()
    specs = [spec("hw", "pass", layer="hardware"), spec("fw", "pass", layer="framework", requires=("hw",))]
    run(specs, state)
    seen = dict(SEEN)
    assert "hw" in seen["fw"]
    assert seen["fw"]["hw"].status is Status.PASS


def test_requirement_not_selected_is_ignored(state):
    out = run([spec("fw", "pass", layer="framework", requires=("hw",))], state)
    assert out.results[0].status is Status.PASS


def test_hanging_probe_is_abandoned_at_its_deadline(state):
    start = time.monotonic()
    out = run([spec("stuck", "hang", timeout=0.5), spec("ok", "pass")], state, timeout=10)
    took = time.monotonic() - start
    assert took < 0.5 + 0.5 + runner.GRACE
    stuck = out.results[0]
    assert stuck.status is Status.FAIL and stuck.reason == "deadline"
    assert "0.5s" in stuck.message
    assert (stuck.action, stuck.actor) == ("retry", "operator")  # a call stuck in the driver is the node's
    assert out.abandoned
    assert out.results[1].status is Status.PASS  # the others still report


def test_run_deadline_caps_every_probe(state):
    start = time.monotonic()
    out = run([spec("stuck", "hang", timeout=30)], state, timeout=1.0)
    assert time.monotonic() - start < 1.0 + runner.GRACE + 0.3
    assert out.results[0].reason == "deadline"


def test_hanging_requirement_does_not_hang_dependant(state):
    specs = [spec("hw", "hang", layer="hardware", timeout=0.3),
             spec("fw", "pass", layer="framework", requires=("hw",))]
    out = run(specs, state, timeout=5)
    assert out.results[1].status is Status.SKIP
    assert "no answer" in out.results[1].message


def test_exception_becomes_failure_without_its_text(state):
    out = run([spec("boom", "raise")], state)
    r = out.results[0]
    assert r.status is Status.FAIL and r.reason == "internal-error"
    assert "RuntimeError" in r.message and r.message.endswith("details in the log: report it with the log line")
    assert "secret-token" not in r.message
    assert (r.action, r.actor) == ("none", "operator")  # a bug of the suite: no restart mends it


def test_every_result_the_runner_makes_comes_from_its_catalog():
    """Who acts, and how, is declared with each common cause: nothing is left to be decided."""
    from probes.spec import ACTIONS, ACTORS

    for cause in runner.COMMON_CAUSES:
        assert cause.action in ACTIONS and cause.actor in ACTORS, cause.reason


def test_notes_say_caching_off_when_torch_runs_without_state():
    off = State.off("/nope is not writable")
    out = runner.run(Config(timeout=2), off, specs=[spec("torch-cuda", "pass")])
    assert out.notes == ("caching off: /nope is not writable",)


def hardware_and_torch():
    return [spec("nvidia-smi", "fail", layer="hardware"), spec("nvml", "hang", layer="hardware"),
            spec("torch-cuda", "fail", layer="framework", requires=("nvidia-smi", "nvml")),
            spec("ssh", "pass")]


def test_latch_skips_the_hardware_layer_and_lets_torch_answer(state):
    SEEN.clear()
    state.set_latch("torch-cuda", "CUDA error: an illegal memory access was encountered")
    start = time.monotonic()
    out = run(hardware_and_torch(), state)
    assert time.monotonic() - start < 0.5  # the hanging NVML probe was never started
    by = {r.name: r for r in out.results}
    assert by["nvidia-smi"].status is Status.SKIP and by["nvidia-smi"].reason == "latched"
    assert "illegal memory access" in by["nvml"].message
    assert sorted(name for name, _ in SEEN) == ["ssh", "torch-cuda"]
    assert by["torch-cuda"].status is Status.FAIL  # it reports the latch itself
    assert out.status is Status.FAIL


def test_latch_without_torch_fails_the_hardware_layer(state):
    state.set_latch("xid", "Xid 79 on GPU 0")
    out = run([spec("nvidia-smi", "pass", layer="hardware"), spec("ssh", "pass")], state)
    assert out.results[0].status is Status.FAIL and out.results[0].reason == "latched"
    assert (out.results[0].action, out.results[0].actor) == ("restart-container", "operator")
    assert out.status is Status.FAIL
