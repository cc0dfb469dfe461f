"""The deep layer's one locked run (deep.locked_run) and the options torch-cuda asks of it: a run
that finished while this one waited for the lock is shared only when asked, and the latch is read
again once the lock is held only when asked (model and nccl ask for neither)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from probes.config import Config
from probes.context import Context
from probes.framework import deep
from probes.result import Result, passed
from probes.spec import PROFILE_RULES
from probes.state import State

pytestmark = pytest.mark.loaded  # under load too: make loaded (Makefile)


def _ctx(state: State, profile: str = "startup") -> Context:
    return Context(Config(profile=profile), time.monotonic() + 10, {}, state)


def _judge(data: dict[str, Any], ctx: Context) -> Result:
    return passed("deep-test", "ok")


def _finish_while_waiting(state: State, latch: bool) -> threading.Thread:
    """Another run that holds the lock, caches its run (and latches, if asked) and lets go."""
    held = threading.Event()

    def other() -> None:
        with state.lock(deep.LOCK, time.monotonic() + 5) as got:
            assert got
            held.set()
            time.sleep(0.3)
            state.write_json("deep-test.json", {"key": {}, "finished": time.time(), "status": "pass",
                                                "data": {"kind": "worker", "by": "other"}})
            if latch:
                state.set_latch("torch-cuda", "fatal CUDA error", "cuda-fatal")
    thread = threading.Thread(target=other)
    thread.start()
    assert held.wait(5)
    return thread


@pytest.mark.parametrize("share", [True, False])
def test_a_run_that_finished_while_waiting_is_shared_only_when_asked(tmp_path: Path, share: bool) -> None:
    state = State.open(str(tmp_path / "state"))
    ran: list[int] = []
    thread = _finish_while_waiting(state, latch=False)
    data = deep.locked_run(_ctx(state), "deep-test.json", {}, lambda entry: None,
                           lambda: ran.append(1) or {"kind": "worker", "by": "me", "lingered": False,
                                                     "finished": time.time()},
                           _judge, share=(lambda entry: entry["data"] if entry else None) if share else None)
    thread.join()
    assert (data["by"], ran) == (("other", []) if share else ("me", [1]))


@pytest.mark.parametrize("relatch", [True, False])
def test_the_latch_is_read_again_under_the_lock_only_when_asked(tmp_path: Path, relatch: bool) -> None:
    state = State.open(str(tmp_path / "state"))
    thread = _finish_while_waiting(state, latch=True)
    data = deep.locked_run(_ctx(state), "deep-test.json", {}, lambda entry: None,
                           lambda: {"kind": "worker", "by": "me", "lingered": False, "finished": time.time()},
                           _judge, relatch=relatch)
    thread.join()
    assert data["kind"] == ("latched" if relatch else "worker")
    if relatch:
        assert data["source"] == "torch-cuda" and data["why"] == "fatal CUDA error"


def test_readiness_is_answered_from_the_cache_before_waiting_only_when_asked(tmp_path: Path) -> None:
    state = State.open(str(tmp_path / "state"))
    state.write_json("deep-test.json", {"data": {"kind": "worker", "by": "cache"}})
    reuse = lambda entry: entry["data"] if entry else None  # noqa: E731
    with state.lock(deep.LOCK, time.monotonic() + 5) as held:  # held for the whole call: no waiting done
        assert held
        early = deep.locked_run(_ctx(state, "readiness")._replace(deadline=time.monotonic() + 1.5),
                                "deep-test.json", {}, reuse, lambda: {"kind": "worker"}, _judge, early=True)
        late = deep.locked_run(_ctx(state, "readiness")._replace(deadline=time.monotonic() + 1.5),
                               "deep-test.json", {}, reuse, lambda: {"kind": "worker"}, _judge)
    assert early == {"kind": "worker", "by": "cache"}
    assert late["kind"] == "lock-timeout"


def test_whether_a_cached_pass_answers_is_the_profiles_rule_not_its_name(tmp_path: Path, monkeypatch) -> None:
    """Startup runs fresh; a profile whose rules say ``reuses_cache`` is answered from the cache."""
    state = State.open(str(tmp_path / "state"))
    state.write_json("deep-test.json", {"data": {"kind": "worker", "by": "cache"}})
    ran: list[int] = []

    def run() -> dict[str, Any]:
        ran.append(1)
        return {"kind": "worker", "by": "me", "lingered": False, "finished": time.time()}

    def locked() -> dict[str, Any]:
        return deep.locked_run(_ctx(state, "startup"), "deep-test.json", {},
                               lambda entry: entry["data"] if entry else None, run, _judge)

    assert locked()["by"] == "me" and ran == [1]
    monkeypatch.setitem(PROFILE_RULES, "startup", PROFILE_RULES["startup"]._replace(reuses_cache=True))
    locked()
    assert ran == [1], "a profile that reuses the cache ran the check again"
