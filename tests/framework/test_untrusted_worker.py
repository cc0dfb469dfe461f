"""A worker that does not behave: it lingers after its result, reports numbers no float can
hold, or puts control characters in its strings. Real child processes and real CLI runs;
only the interpreter (a wrapper script, the fake torch) is fake.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from probes import deadlines
from probes.framework import torch_cuda, torch_worker
from probes.result import Result, Status
from tests.conftest import clean_env, run_cli
from tests.framework.conftest import FAKE_TORCH, REAL_PYTHON, Interp, probe
from tests.framework.test_parse import GOOD

SLACK = 1.5  # the worker's own start-up (Python, the fake torch) plus the kill


def lingering(make_interp: Callable[..., Interp], tmp_path: Path, name: str = "linger") -> tuple[Interp, Path]:
    """A wrapper that runs the real worker (fake torch, a valid passing result) and then keeps
    running while ``flag`` exists: the wrapper-script case of HEALTHCHECK_TORCH_PYTHON."""
    flag = tmp_path / f"{name}.flag"
    flag.touch()
    body = (f'if [ -e "{flag}" ]; then "{REAL_PYTHON}" "$@"; sleep 60; exit 0; fi\n'
            f'exec "{REAL_PYTHON}" "$@"')
    return make_interp(name, mode="ok", body=body), flag


def test_a_worker_that_does_not_exit_fails_and_is_not_cached(make_interp: Callable[..., Interp],
                                                              tmp_path: Path,
                                                              marker: Callable[[], list[int]]) -> None:
    py, _ = lingering(make_interp, tmp_path)
    result, elapsed, _ = probe(py, tmp_path, timeout=8.0)
    assert (result.status, result.reason) == (Status.FAIL, "lingered"), result.message
    assert f"printed its result but did not exit within {deadlines.LINGER:.1f} s" in result.message
    assert elapsed < deadlines.LINGER + SLACK, f"took {elapsed:.2f}s"
    assert marker() == [], "the lingering wrapper outlived its run"
    assert not (tmp_path / "state" / torch_cuda.CACHE).exists()
    # Within the TTL, readiness starts a worker again: nothing was cached.
    again, _, _ = probe(py, tmp_path, timeout=8.0)
    assert again.reason == "lingered" and "cached" not in again.message
    assert py.starts == 2


def test_a_lingering_run_withdraws_an_older_pass(make_interp: Callable[..., Interp], tmp_path: Path) -> None:
    py, flag = lingering(make_interp, tmp_path)
    flag.unlink()
    first, _, _ = probe(py, tmp_path)
    assert first.status is Status.PASS and py.starts == 1
    flag.touch()
    fresh, _, _ = probe(py, tmp_path, profile="startup", timeout=8.0)
    assert fresh.reason == "lingered"
    # The pass cached before must not answer readiness after that failure.
    after, _, _ = probe(py, tmp_path, timeout=8.0)
    assert after.reason == "lingered" and py.starts == 3


def test_concurrent_runs_do_not_share_a_lingering_result(make_interp: Callable[..., Interp],
                                                         tmp_path: Path) -> None:
    py, _ = lingering(make_interp, tmp_path)
    results: list[Result] = []

    def one() -> None:
        results.append(probe(py, tmp_path, profile="startup", timeout=20.0)[0])

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [r.reason for r in results] == ["lingered", "lingered"]
    assert not any("shared" in r.message for r in results)
    assert py.starts == 2


def result_line(old: str, new: str) -> str:
    text = torch_worker.PREFIX + json.dumps(GOOD)
    assert old in text
    return text.replace(old, new) + "\n"


def cli_env(interp: object, tmp_path: Path, **extra: str) -> dict[str, str]:
    return clean_env(HEALTHCHECK_TORCH_PYTHON=str(interp), HEALTHCHECK_TORCH_DEVICE="cuda",
                     HEALTHCHECK_STATE_DIR=str(tmp_path / "state"), HEALTHCHECK_TIMEOUT="30",
                     HEALTHCHECK_LOG_FILE=str(tmp_path / "healthcheck.log"), **extra)


@pytest.mark.parametrize(("old", "new"), [
    ('"max_err": 1e-05', '"max_err": ' + "9" * 400),
    ('"free": 1073741824', '"free": ' + "9" * 400),
    ('"op_ms": 0.5', '"op_ms": 1e999'),
    ('"scale": 150.0', '"scale": 1e999'),
], ids=["400-digit-error", "400-digit-free", "1e999-time", "1e999-scale"])
def test_numbers_no_float_can_hold_are_an_unreadable_result(old: str, new: str, make_interp: Callable[..., Interp],
                                                            tmp_path: Path) -> None:
    out_file = tmp_path / "line"
    out_file.write_text(result_line(old, new))
    py = make_interp("huge", body=f'cat "{out_file}"')
    out = run_cli("--only", torch_cuda.SPEC.name, env=cli_env(py, tmp_path), timeout=60)
    both = out.stdout + out.stderr
    assert out.returncode == 1, both
    assert "Traceback" not in both and "internal error" not in both
    assert "torch worker gave an unreadable result (the result line is not readable JSON" in out.stdout, both
    assert out.stdout.splitlines()[0].startswith("unhealthy: torch-cuda:")


@pytest.mark.parametrize(("old", "new"), [
    ('"torch": "2.3.0"', '"torch": "2.3\x01.0"'),
    ('"name": "H100"', '"name": "H1\x0000"'),
    ('"error": null}]}', '"error": null}]'),
    ('"error": null}]}', '"error": null,}]}'),
], ids=["control-character", "nul-in-a-string", "truncated", "trailing-comma"])
def test_a_malformed_result_line_is_bad_output_when_json_was_never_imported(
        old: str, new: str, make_interp: Callable[..., Interp], tmp_path: Path) -> None:
    # --only: the run imports nothing that imports json before the result line is read.
    out_file = tmp_path / "line"
    out_file.write_text(result_line(old, new))
    py = make_interp("malformed", body=f'cat "{out_file}"')
    env = cli_env(py, tmp_path)
    for flags in (("--only", torch_cuda.SPEC.name), ("--only", torch_cuda.SPEC.name, "--json")):
        out = run_cli(*flags, env=env, timeout=60)
        both = out.stdout + out.stderr
        assert out.returncode == 1, both
        assert "internal" not in both and "SystemError" not in both, both
        assert "bad-output" in out.stdout or "unreadable result (the result line is not readable JSON" in both, both


def raw_controls(text: str) -> list[str]:
    return sorted({ch for ch in text if ch != "\n" and not ch.isprintable()})


def walk_strings(doc: Any) -> list[str]:
    if isinstance(doc, dict):
        return [s for v in doc.values() for s in walk_strings(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in walk_strings(v)]
    return [doc] if isinstance(doc, str) else []


def test_control_characters_from_the_worker_are_shown_escaped(make_interp: Callable[..., Interp],
                                                              tmp_path: Path) -> None:
    # The fake torch's version is "2.3.0+fake<NUL><ESC>[31mred<BEL><LF>next" and its device
    # name "Fake<NUL>GPU<ESC>]0;owned<BEL><LF>0" (an ESC ] sequence retitles a terminal).
    assert (FAKE_TORCH / "torch" / "__init__.py").exists()
    py = make_interp("controls", mode="control-chars")
    version = r"2.3.0+fake\x00\x1b[31mred\x07\nnext"
    name = r"Fake\x00GPU\x1b]0;owned\x07\n0"
    env = cli_env(py, tmp_path, HEALTHCHECK_PROFILE="startup")
    out = run_cli("--only", torch_cuda.SPEC.name, env=env, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert raw_controls(out.stdout) == [], out.stdout
    assert version in out.stdout and name in out.stdout, out.stdout
    out = run_cli("--only", torch_cuda.SPEC.name, "--json", env=env, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert raw_controls(out.stdout) == []
    doc = json.loads(out.stdout)
    assert all(raw_controls(s) == [] and "\n" not in s for s in walk_strings(doc))
    check = doc["checks"][f"{torch_cuda.SPEC.name}:{torch_cuda.SPEC.measurement}"][0]
    said = check.get("output") or check["message"]  # health+json leaves output out of passing checks
    assert version in said and name in said, said


def test_a_damaged_cache_entry_is_a_miss_never_a_crash(make_interp: Callable[..., Interp], tmp_path: Path) -> None:
    py = make_interp("ok", mode="ok")
    first, _, _ = probe(py, tmp_path)
    assert first.status is Status.PASS
    path = tmp_path / "state" / torch_cuda.CACHE
    good = json.loads(path.read_text())
    damages: list[Callable[[dict[str, Any]], None]] = [
        lambda e: e["data"]["report"]["devices"][0].update(max_err=float("inf")),  # written as Infinity
        lambda e: e["data"]["report"]["devices"][0].update(free=10**400),
        lambda e: e["data"]["report"]["devices"][0].update(op_ms=float("nan")),
        lambda e: e["data"]["report"].update(count=[1]),
        lambda e: e["data"].update(budget="soon"),
        lambda e: e["data"].update(returncode=1.5),
        lambda e: e["data"].update(phase="\x1b[2J"),
        lambda e: e["data"].update(finished=float("inf")),
        lambda e: e["data"].update(python="/other/python"),
        lambda e: e["data"].update(lingered=True),
        lambda e: e.update(data=[]),
        lambda e: e.update(finished="yesterday"),
    ]
    for i, damage in enumerate(damages):
        entry = json.loads(json.dumps(good))
        entry["finished"] = entry["data"]["finished"] = time.time()
        damage(entry)
        path.write_text(json.dumps(entry))
        result, _, _ = probe(py, tmp_path)
        assert result.status is Status.PASS and "cached" not in result.message, (i, result.message)
        assert py.starts == i + 2, f"damage {i} was served from the cache"
    # An intact entry is still a hit, and cleaned strings stay clean.
    entry = json.loads(json.dumps(good))
    entry["finished"] = entry["data"]["finished"] = time.time()
    entry["data"]["report"]["torch"] = "2.3\x1b[31m"
    path.write_text(json.dumps(entry))
    result, _, _ = probe(py, tmp_path)
    assert "(cached, " in result.message and py.starts == len(damages) + 1
    assert "2.3\\x1b[31m" in result.message and "\x1b" not in result.message
