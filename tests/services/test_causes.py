"""The services' causes: each says who acts and how, and each warn or fail comes from its probe's catalog."""

from __future__ import annotations

from typing import Any

import pytest

from probes.result import Status
from probes.services import jupyter, jupyter_kernel, ssh, ssh_keys, ssh_login
from probes.spec import ACTIONS, ACTORS

MODULES = (jupyter, jupyter_kernel, ssh, ssh_keys, ssh_login)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.NAME)
def test_every_cause_says_who_acts_and_how(module: Any) -> None:
    for cause in module.SPEC.causes:
        assert cause.action in ACTIONS and cause.actor in ACTORS, (module.NAME, cause.reason)


WHERE = {"host": "127.0.0.1", "port": 22, "budget": 3.0}


@pytest.mark.parametrize(("module", "data", "action", "actor"), [
    (ssh, {**WHERE, "outcome": "refused", "listening": []}, "restart-app", "tenant"),
    (ssh, {**WHERE, "outcome": "resolve", "host": "nowhere.invalid"}, "fix-config", "tenant"),
    (ssh, {**WHERE, "outcome": "timeout", "received": 4, "partial": b"SSH-", "excerpt": ""}, "restart-app", "tenant"),
    (ssh_keys, {"outcome": "no-such-user", "user": "bob"}, "fix-config", "tenant"),
    (ssh_login, {"outcome": "no-key"}, "fix-config", "tenant"),
    (jupyter_kernel, {"kind": "kernel", "outcome": "api", "http": 404, "net": "http", "where": "127.0.0.1:8888"},
     "fix-config", "tenant"),
    (jupyter_kernel, {"kind": "kernel", "outcome": "reply", "device": "cuda", "observed": 1.0,
                      "stdout": jupyter_kernel.PREFIX + '{"torch": "2.9.1", "available": true, "count": 1, '
                      '"op": {"max_err": 5.0, "scale": 1.0}}'}, "service-hardware", "operator"),
])
def test_a_judge_gives_its_causes_remedy_and_who_acts(module: Any, data: dict[str, Any], action: str,
                                                       actor: str) -> None:
    r = module.judge(data, None)
    found = {c.reason: c for c in module.SPEC.causes}[r.reason]
    assert r.status is Status(found.status) and (r.action, r.actor) == (action, actor), r
    assert r.message.endswith(": " + found.remedy.replace("`", "")), r.message
