"""The CLI's fast path: reuse a running `healthcheck serve`'s fresh results instead of probing.

`healthcheck serve` writes ``serve.json`` into the state dir after every run (its pid and start
time, per profile the results, their age limit and the configuration's fingerprint); ``lookup``
answers from it only while that very server is alive (no reused pid), the results are fresh, the
configuration is the same and nothing is latched (docs/serve.md), else None. It never raises.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

from probes.config import Config
from probes.result import Result
from probes.state import State, process_start_time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SNAPSHOT = "serve.json"
FALSE = ("false", "0", "no", "off")
# Fields that do not change what a run checks.
_NOT_IDENTITY = ("json", "verbose", "timeout", "only", "skip", "log_file")


def fingerprint(config: Config) -> str:
    d = {**config._asdict(), "toggles": dict(config.toggles)}
    for k in _NOT_IDENTITY:
        d.pop(k, None)
    d["selected"] = [s.name for s in config.selected()]
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _alive(pid: Any, start: Any) -> bool:
    """Whether ``pid`` is another live process, started when ``start`` says (no reused pid)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid == os.getpid():
        return False
    started = process_start_time(pid)
    return started is not None and (start is None or started == start)


def lookup(config: Config, state: State) -> list[Result] | None:
    """The serve process's latest results for ``config.profile`` when alive and fresh, else None."""
    try:
        return _lookup(config, state)
    except Exception:  # the fast path is an optimisation: any surprise means "probe yourself"
        return None


def _lookup(config: Config, state: State) -> list[Result] | None:
    # The monitor's own runs set this: they must probe, not read the server's results.
    if os.environ.get("HEALTHCHECK_FASTPATH", "").strip().lower() in FALSE:
        return None
    if config.only or config.skip or not state.enabled:
        return None
    data = state.read_json(SNAPSHOT)
    if data is None or data.get("latched") or not _alive(data.get("pid"), data.get("start")):
        return None
    if state.latch() is not None:
        return None
    entry = (data.get("profiles") or {}).get(config.profile)
    if not isinstance(entry, dict) or entry.get("fingerprint") != fingerprint(config):
        return None
    finished, limit = entry.get("finished"), entry.get("stale_after")
    if not isinstance(finished, (int, float)) or not isinstance(limit, (int, float)):
        return None
    age = time.time() - finished
    if not 0 <= age <= limit:
        return None
    results = [Result.from_dict(r) for r in entry.get("results") or []]
    return results or None
