"""Telling the person at the keyboard (probes/notice.py): the decisions as pure functions (a verdict
in, the log line and the published notice out), then whole `python -m probes` runs against the stub
nvidia-smi and the fake NVML: one line in the container's log per change however many runs fail,
the published notice, the off switch, and a real PID namespace whose PID 1 has just started."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from probes import dropins, notice, registry, runner
from probes.config import Config
from probes.hardware.common import GPU_COUNT_LOW, GPU_LOST
from probes.result import Result, Status, passed, verdict
from probes.runner import Outcome
from probes.spec import PROFILE_RULES
from probes.state import State
from tests.conftest import ROOT
from tests.fakes.nvidia_smi_stub import write_stub
from tests.hardware.conftest import cli_env, fake_nvml  # noqa: F401  (the fixture)

LIFE = "boot:ns1.2"
T0 = 1_800_000_000.0  # a verdict's time
LONG_AGO = T0 - 3600  # a container started an hour before


def outcome(*results: Result, profile: str = "readiness") -> Outcome:
    return Outcome(profile, tuple(r._replace(time=T0) for r in results))


def lost() -> Verdict:
    return notice.verdict_of(outcome(passed("nvidia-smi", "2 GPUs"),
                                     verdict("nvml", GPU_LOST, "GPU 1 is lost (1 other GPU still reports)")),
                             registry.PROBES)


def too_few() -> Verdict:
    return notice.verdict_of(outcome(verdict("nvidia-smi", GPU_COUNT_LOW, "1 GPU visible, 2 expected")),
                             registry.PROBES)


Verdict = notice.Verdict
HEALTHY = Verdict(T0)


def run(steps: list[tuple[Verdict, float]], started: float = LONG_AGO) -> list[tuple[str | None, str]]:
    """Each verdict at its time through decide(), the record carried over: (log line, notice) each."""
    kept = None
    out = []
    for v, at in steps:
        kept, line, text = notice.decide(kept, v._replace(time=at), life=LIFE, started=started, stale=90)
        out.append((line, text))
    return out


def test_a_change_is_told_once_and_the_repair_once():
    told = run([(HEALTHY, T0), (lost(), T0 + 30), (lost(), T0 + 60), (lost(), T0 + 90), (HEALTHY, T0 + 120),
                (HEALTHY, T0 + 150)])
    lines = [line for line, _ in told]
    assert lines[0] is None and lines[2:4] == [None, None] and lines[5] is None
    assert lines[1] == ("gpu-health: unhealthy since 08:00 UTC: nvml: GPU 1 is lost (1 other GPU still reports); "
                        f"{notice.OPERATOR} (reset-gpu)")
    assert lines[4] == "gpu-health: healthy again at 08:02 UTC"
    # The notice: the verdict's time, how long until stale, the state; the person's lines when unhealthy.
    assert told[3][1] == (f"{int(T0 + 90)} 90 unhealthy 08:01 UTC\n"
                          "unhealthy since 08:00 UTC: nvml: GPU 1 is lost (1 other GPU still reports)\n"
                          f"{notice.OPERATOR}\n")
    assert told[5][1] == f"{int(T0 + 150)} 90 healthy 08:02 UTC\n"


def test_another_cause_is_a_change_the_same_cause_with_other_figures_is_not():
    other = lost()._replace(what="nvml: GPU 0 is lost")
    lines = [line for line, _ in run([(lost(), T0), (other, T0 + 30), (too_few(), T0 + 60)])]
    assert lines[0] is not None and lines[1] is None
    assert lines[2] is not None and lines[2].startswith("gpu-health: unhealthy since 08:01 UTC: nvidia-smi: ")


def test_operator_and_tenant_words_come_from_the_catalog():
    v = lost()
    assert (v.key, v.what, v.words, v.action) == (
        "nvml/gpu-lost", "nvml: GPU 1 is lost (1 other GPU still reports)",
        "not fixable from inside this container; your platform's operator is alerted if alerting is set up",
        "reset-gpu")
    tenant = too_few()
    assert tenant.what == "nvidia-smi: 1 GPU visible, 2 expected"  # the remedy is said once, in the words
    assert tenant.words == "you can fix this: " + GPU_COUNT_LOW.remedy.replace("`", "")
    # A cause every probe may report (the runner's), and a drop-in's.
    late = notice.verdict_of(outcome(verdict("nvml", runner.DEADLINE, "no answer within 5.0s")), ())
    assert late.words == notice.OPERATOR and late.action == "retry"
    mine = notice.verdict_of(outcome(verdict("site-check", dropins.FAILED, "disk full", remedy=False)), ())
    assert mine.words == "you can fix this: see the check's message" and mine.what == "site-check: disk full"


def test_a_drop_in_that_hangs_is_told_in_its_own_causes_words(tmp_path):
    # The runner's `deadline` is the operator's (a stuck probe of the suite); a drop-in's is the
    # image owner's own check hanging: the tenant fixes it.
    (tmp_path / "site-check").write_text("#!/bin/sh\nsleep 60\n")
    (tmp_path / "site-check").chmod(0o755)
    found = dropins.specs(str(tmp_path))
    hung = notice.verdict_of(outcome(verdict("site-check", dropins.DEADLINE, "no answer within 10.0s")), found)
    assert hung.words == "you can fix this: " + dropins.DEADLINE.remedy.replace("`", ""), hung.words


def test_a_warning_or_a_pass_is_healthy():
    warned = Result("nvml", Status.WARN, "GPU 0 is hot", reason="hot", actor="operator")
    assert notice.verdict_of(outcome(warned, passed("nvidia-smi", "2 GPUs")), registry.PROBES).key == ""


def test_a_failure_in_the_start_period_before_the_first_pass_is_not_told():
    started = T0 - 10
    told = run([(lost(), T0), (lost(), T0 + 20), (lost(), T0 + 49)], started=started)
    assert [line for line, _ in told] == [None, None, None]
    assert [text.split()[2] for _, text in told] == ["starting"] * 3
    # Past the start period it is told at once; a healthy container that boots slowly shows nothing.
    assert run([(lost(), T0 + 51)], started=started)[0][0] is not None
    assert run([(lost(), T0), (HEALTHY, T0 + 20)], started=started)[1] == (
        None, f"{int(T0 + 20)} 90 healthy 08:00 UTC\n")
    # After the first pass, a failure is told even within the start period.
    assert run([(HEALTHY, T0), (lost(), T0 + 5)], started=started)[1][0] is not None


def test_a_new_container_life_starts_with_nothing_told():
    kept, line, _ = notice.decide(None, lost(), life=LIFE, started=LONG_AGO, stale=90)
    assert line is not None
    again, line, _ = notice.decide(kept, lost(), life="other", started=LONG_AGO, stale=90)
    assert line is not None and again["life"] == "other"  # told in the new life's log too
    _, line, _ = notice.decide(kept, HEALTHY, life="other", started=LONG_AGO, stale=90)
    assert line is None  # nothing was told in this life: no "healthy again"


def test_stale_after_is_the_profiles_period_times_its_retries():
    assert {p.name: p.stale_after for p in PROFILE_RULES.values() if p.tells} == {
        "startup": 90, "readiness": 90}
    assert (PROFILE_RULES["readiness"].period, PROFILE_RULES["readiness"].retries) == (30.0, 3)
    assert not PROFILE_RULES["liveness"].tells


@pytest.fixture
def told(tmp_path, monkeypatch):
    """tell() with a real state dir, the log line into a file of the test's (the internal LOG_ENV)."""
    log = tmp_path / "pid1-stderr"
    log.touch()
    monkeypatch.setenv(notice.LOG_ENV, str(log))
    state = State.open(str(tmp_path / "state"))
    published = tmp_path / "run" / "notice"

    def tell(profile: str, *results: Result, **cfg: object) -> tuple[str, str | None]:
        config = Config(profile=profile, notice_file=str(published), **cfg)
        notice.tell(config, state, outcome(*results, profile=profile))
        return log.read_text(), published.read_text() if published.exists() else None

    return tell


def test_liveness_and_partial_runs_change_nothing(told):
    gone = verdict("nvml", GPU_LOST, "GPU 1 is lost")
    assert told("liveness", gone) == ("", None)
    assert told("readiness", gone, only=("nvml",)) == ("", None)
    assert told("readiness", gone, skip=("ssh",)) == ("", None)
    log, published = told("startup", gone)
    assert log.count("\n") == 1 and published is not None and " unhealthy " in published.splitlines()[0]
    assert told("liveness", passed("jupyter", "ok")) == (log, published)  # a liveness pass says nothing


def test_notices_off_tell_nothing_and_take_the_notice_away(told):
    gone = verdict("nvml", GPU_LOST, "GPU 1 is lost")
    assert told("readiness", gone)[1] is not None
    log, published = told("readiness", passed("nvml", "ok"), notices=False)
    assert log.count("\n") == 1 and published is None  # no "healthy again" either


def test_the_notice_dir_is_made_0755_an_existing_one_keeps_its_mode(told, tmp_path):
    old = os.umask(0o077)
    try:
        told("readiness", verdict("nvml", GPU_LOST, "GPU 1 is lost"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o755  # made: readable by the readers
    (tmp_path / "run").chmod(0o700)  # the operator's own choice: never changed
    told("readiness", passed("nvml", "ok"))
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o700
    assert (tmp_path / "run" / "notice").read_text().split()[2] == "healthy"


# ---------------------------------------------------------------- whole runs

HARDWARE_ONLY = {"ENABLE_JUPYTER_CHECK": "false", "ENABLE_SSH_CHECK": "false", "ENABLE_TORCH_CHECK": "false"}


@pytest.fixture
def check(fake_nvml, tmp_path):  # noqa: F811
    """check(healthy) -> exit status of one `python -m probes` run (readiness) against the fakes:
    a lost GPU or two healthy ones. Its log line goes to ``check.log`` (the internal LOG_ENV)."""
    bin_dir, scenario, log = tmp_path / "bin", tmp_path / "scenario.txt", tmp_path / "pid1-stderr"
    log.touch()
    (tmp_path / "run").mkdir()  # /run: the notice's directory is made in it

    def go(healthy: bool, *args: str, argv0: tuple[str, ...] = (), **env: str) -> subprocess.CompletedProcess[str]:
        write_stub(bin_dir, "ok" if healthy else "lost")
        scenario.write_text("gpus 2\n" if healthy else "gpus 2\ngpu 1 lost\n")
        full = cli_env(tmp_path, stub_dir=bin_dir, scenario_file=scenario, **HARDWARE_ONLY,
                       HEALTHCHECK_CHECKS_DIR=str(tmp_path / "no-drop-ins"),
                       HEALTHCHECK_NOTICE_FILE=str(tmp_path / "run" / "healthcheck-notice" / "notice"),
                       **{notice.LOG_ENV: str(log), **env})
        return subprocess.run([*argv0, sys.executable, "-m", "probes", *args], env=full, cwd=ROOT,
                              capture_output=True, text=True, timeout=60, check=False)

    go.log = log  # type: ignore[attr-defined]
    go.published = tmp_path / "run" / "healthcheck-notice" / "notice"  # type: ignore[attr-defined]
    return go


def test_several_failing_runs_write_one_line_and_the_repair_one(check):
    assert [check(False).returncode for _ in range(3)] == [1, 1, 1]
    lines = check.log.read_text().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("gpu-health: unhealthy since ") and ": nvidia-smi: GPU 0000:41:00.0 is lost" in lines[0]
    assert lines[0].endswith(f"{notice.OPERATOR} (reset-gpu)") and len(lines[0]) <= notice.MAX_LINE
    published = check.published.read_text().splitlines()
    assert published[0].split()[1:3] == ["90", "unhealthy"] and published[2] == notice.OPERATOR
    # World-readable in a directory of the suite's user; the state stays private.
    assert stat.S_IMODE(check.published.stat().st_mode) == 0o644
    assert stat.S_IMODE(check.published.parent.stat().st_mode) == 0o755
    assert stat.S_IMODE((check.published.parents[2] / "state" / "notice.json").stat().st_mode) == 0o600
    assert [check(True).returncode for _ in range(2)] == [0, 0]
    lines = check.log.read_text().splitlines()
    assert len(lines) == 2 and lines[1].startswith("gpu-health: healthy again at "), lines
    assert check.published.read_text().split()[2] == "healthy"
    assert check(False, "--profile", "liveness").returncode == 0  # says nothing about the GPU
    assert len(check.log.read_text().splitlines()) == 2


def test_concurrent_failing_checks_tell_the_change_once(check):
    with ThreadPoolExecutor(6) as pool:
        codes = list(pool.map(lambda _: check(False).returncode, range(6)))
    assert codes == [1] * 6
    assert len(check.log.read_text().splitlines()) == 1, check.log.read_text()


def test_notices_off_write_no_line_and_publish_nothing(check):
    assert check(True).returncode == 0 and check.published.exists()
    assert check(False, HEALTHCHECK_NOTICES="off").returncode == 1
    assert check.log.read_text() == "" and not check.published.exists()
    bad = check(False, HEALTHCHECK_NOTICES="maybe")
    assert bad.returncode == 3 and "HEALTHCHECK_NOTICES='maybe'" in bad.stderr


def test_a_notice_dir_another_user_can_change_is_not_written(check, tmp_path):
    shared = tmp_path / "run" / "healthcheck-notice"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    assert check(False).returncode == 1
    assert not (shared / "notice").exists()
    assert len(check.log.read_text().splitlines()) == 1  # the log line does not depend on it


UNSHARE = ("unshare", "--pid", "--fork", "--mount-proc")


@pytest.mark.skipif(os.geteuid() != 0, reason="a new PID namespace needs root here")
def test_in_a_container_that_just_started_a_failure_shows_nothing_anywhere(check, tmp_path):
    script = tmp_path / "pid1.sh"
    script.write_text('"$@" >/dev/null 2>&1\n"$@" >/dev/null 2>&1\necho "exit $?"\n')
    proc = check(False, argv0=(*UNSHARE, "bash", str(script)), **{notice.LOG_ENV: ""})
    assert proc.stdout == "exit 1\n" and proc.stderr == "", proc.stderr  # PID 1's stderr: no line
    assert check.published.read_text().split()[2] == "starting"  # the readers show nothing


@pytest.mark.skipif(os.geteuid() != 0, reason="a new PID namespace needs root here")
def test_by_default_the_line_goes_to_pid_1s_stderr(check, tmp_path):
    # A first pass ends the start period; PID 1 is the shell, its stderr the test's pipe.
    script = tmp_path / "pid1.sh"
    script.write_text('run() { HEALTHCHECK_GPU_COUNT=$1 "${@:2}" >/dev/null 2>&1; }\n'
                      'run 2 "$@"; for i in 1 2 3; do run 3 "$@"; done; echo "exit $?"\n')
    proc = check(True, argv0=(*UNSHARE, "bash", str(script)), **{notice.LOG_ENV: ""})
    assert proc.stdout == "exit 1\n"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-health: unhealthy since "), proc.stderr
    assert "you can fix this: start the container with more GPUs" in lines[0]
    assert check.log.read_text() == ""
