"""Configuration: flags > environment > defaults; every bad value is one line naming what is accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from probes import config, registry
from probes.config import ConfigError, load
from probes.framework.deep import Torch
from probes.hardware import common as hw
from probes.services.jupyter import JupyterSettings
from probes.services.ssh import SshSettings
from probes.spec import PROFILE_RULES, Setting


def test_defaults():
    cfg = load({})
    assert cfg.profile == "readiness" and cfg.timeout == PROFILE_RULES["readiness"].timeout
    assert cfg.of(JupyterSettings).jupyter_port == 8888 and cfg.of(SshSettings).ssh_port == 22
    assert cfg.host == "127.0.0.1"
    assert cfg.of(Torch).torch_device == "cuda" and cfg.of(hw.Expected).gpu_count == 1
    on = [s.name for s in registry.PROBES if s.default_on and "readiness" in s.profiles]
    assert [s.name for s in cfg.selected()] == on
    assert {"nvidia-smi", "nvml", "torch-cuda", "jupyter", "ssh"} <= set(on)
    assert not {"model", "nccl"} & set(on)  # the deep checks are opt-in


@pytest.mark.parametrize("raw,value", [("true", True), ("1", True), ("YES", True), ("on", True),
                                       ("false", False), ("0", False), ("No", False), ("off", False)])
def test_toggle_spellings(raw, value):
    assert load({"ENABLE_SSH_CHECK": raw}).toggles["ENABLE_SSH_CHECK"] is value


@pytest.mark.parametrize("env,needle", [
    ({"ENABLE_SSH_CHECK": "maybe"}, "ENABLE_SSH_CHECK='maybe' is not a boolean (accepted: true/false"),
    ({"HEALTHCHECK_TIMEOUT": "-1"}, "HEALTHCHECK_TIMEOUT='-1' is not a number (accepted: digits with an optional "
                                    "fraction, e.g. 25 or 2.5, greater than 0"),
    ({"HEALTHCHECK_TIMEOUT": "0"}, "HEALTHCHECK_TIMEOUT='0' is out of range (accepted: a number greater than 0"),
    ({"HEALTHCHECK_TIMEOUT": "nan"}, "HEALTHCHECK_TIMEOUT='nan' is not a number"),
    # One grammar with the front door: no exponent, underscore or non-ASCII digits (float() takes them).
    ({"HEALTHCHECK_TIMEOUT": "1e1"}, "HEALTHCHECK_TIMEOUT='1e1' is not a number"),
    ({"HEALTHCHECK_TIMEOUT": "1_0"}, "HEALTHCHECK_TIMEOUT='1_0' is not a number"),
    ({"HEALTHCHECK_TIMEOUT": "\u0663"}, "HEALTHCHECK_TIMEOUT='\u0663' is not a number"),
    ({"HEALTHCHECK_TIMEOUT": "\xa05"}, "HEALTHCHECK_TIMEOUT='\\xa05' is not a number"),
    ({"HEALTHCHECK_GPU_COUNT": "\u00b2"}, "HEALTHCHECK_GPU_COUNT='\u00b2' is not an integer (accepted: digits"),
    ({"HEALTHCHECK_SSH_PORT": "\u0662\u0662"}, "HEALTHCHECK_SSH_PORT='\u0662\u0662' is not a port number"),
    ({"HEALTHCHECK_TIMEOUT": "soon"}, "HEALTHCHECK_TIMEOUT='soon' is not a number"),
    ({"HEALTHCHECK_SSH_PORT": "70000"}, "HEALTHCHECK_SSH_PORT='70000' is not a port number (accepted: an integer 1-65535)"),
    ({"HEALTHCHECK_JUPYTER_PORT": "0"}, "HEALTHCHECK_JUPYTER_PORT='0' is not a port number"),
    ({"HEALTHCHECK_PROFILE": "nope"}, "HEALTHCHECK_PROFILE='nope' is not accepted (accepted: startup, readiness, liveness)"),
    ({"HEALTHCHECK_GPU_COUNT": "1.5"}, "HEALTHCHECK_GPU_COUNT='1.5' is not an integer"),
    ({"HEALTHCHECK_TORCH_DEVICE": "tpu"}, "HEALTHCHECK_TORCH_DEVICE='tpu' is not accepted (accepted: cuda, cpu)"),
    ({"HEALTHCHECK_HOST": "a b"}, "HEALTHCHECK_HOST='a b' is not accepted"),
    ({"HEALTHCHECK_JUPYTER_BASE_URL": "lab"}, "is not a URL path"),
])
def test_bad_values_name_variable_value_and_accepted(env, needle):
    with pytest.raises(ConfigError) as err:
        load(env)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_each_profile_says_what_its_run_may_do():
    """What liveness leaves out is data: the hardware probes run exactly in the profiles that judge the
    hardware, and a probe that only runs a GPU worker (model, nccl) only where a worker may start."""
    assert config.DEFAULT_PROFILE in PROFILE_RULES
    hardware = {name for name, rules in PROFILE_RULES.items() if rules.hardware}
    workers = {name for name, rules in PROFILE_RULES.items() if rules.spawns_worker}
    assert hardware and "liveness" not in hardware | workers
    for spec in registry.PROBES:
        if spec.layer == "hardware":
            assert set(spec.profiles) == hardware, spec.name
        if spec.name in ("model", "nccl"):
            assert set(spec.profiles) <= workers, spec.name
    assert load({}, profile="liveness").profile_rules is PROFILE_RULES["liveness"]


def test_flags_override_environment():
    cfg = load({"HEALTHCHECK_PROFILE": "startup"}, profile="liveness")
    assert cfg.profile == "liveness" and cfg.timeout == PROFILE_RULES["liveness"].timeout
    with pytest.raises(ConfigError, match="--profile='nope'"):
        load({}, profile="nope")


def test_only_overrides_toggles_and_skip_removes():
    off = {t: "false" for t in registry.TOGGLES}
    assert [s.name for s in load(off, only="ssh").selected()] == ["ssh"]
    assert "ssh" not in [s.name for s in load({}, skip="ssh,nvml").selected()]
    with pytest.raises(ConfigError, match=r"--only: unknown probe 'nosuchprobe' \(accepted: nvidia-smi"):
        load({}, only="nosuchprobe")
    with pytest.raises(ConfigError, match="names no probe"):
        load({}, skip=" , ")


def test_liveness_never_runs_nvidia_smi_or_nvml():
    names = [s.name for s in load({}, profile="liveness").selected()]
    assert "nvidia-smi" not in names and "nvml" not in names and "jupyter" in names


def test_unprintable_and_long_values_are_shown_safely():
    with pytest.raises(ConfigError) as err:
        load({"HEALTHCHECK_SSH_PORT": "\x1b[2J\n\x07" + "9" * 100})
    text = str(err.value)
    assert "\x1b" not in text and "\n" not in text and len(text) < 200
    assert "'\\x1b[2J\\n\\x07999" in text  # made visible, not dropped


def test_whitespace_around_values_is_ascii_whitespace_only():
    assert load({"HEALTHCHECK_TIMEOUT": " \t7.5\n", "HEALTHCHECK_PROFILE": "\fliveness "}).timeout == 7.5
    with pytest.raises(ConfigError):
        load({"HEALTHCHECK_PROFILE": "\u2003liveness"})  # str.strip() would take it; the front door does not


@pytest.mark.parametrize("raw", ["\u00b2", "48,\u00b9\u00b3", "1e2", "-79"])
def test_serve_xid_lists_refuse_what_int_cannot_read(raw):
    from probes.serve.cli import load as serve_settings

    with pytest.raises(ConfigError) as err:
        serve_settings({"HEALTHCHECK_XID_CRITICAL": raw})
    assert str(err.value).startswith("HEALTHCHECK_XID_CRITICAL=")
    assert "accepted: comma-separated integers 1-9999" in str(err.value)


def test_base_url_gets_trailing_slash():
    assert load({"HEALTHCHECK_JUPYTER_BASE_URL": "/lab"}).of(JupyterSettings).jupyter_base_url == "/lab/"


# ---------------------------------------------------------------- every setting, validated to what its user can take

HUGE = {"5000-digits": "9" * 5000, "100k-digits": "1" * 100_000, "100k-letters": "x" * 100_000,
        "100k-path": "/" + "a" * 100_000, "zeros-then-5000-digits": "0" * 50 + "7" * 5000,
        "100k-spaces-then-1": " " * 100_000 + "1", "5000-tabs-around-true": "\t" * 2500 + "true" + "\t" * 2500}


def every_setting() -> list[Setting]:
    return [*config.GLOBAL_SETTINGS, *registry.SETTINGS]


@pytest.mark.parametrize("value", list(HUGE.values()), ids=list(HUGE))
def test_a_huge_value_of_any_setting_is_one_bounded_config_error(value):
    envs = [s.env for s in every_setting()] + list(registry.TOGGLES)
    for env in envs:
        with pytest.raises(ConfigError) as err:
            load({env: value})
        text = str(err.value)
        assert text.startswith(f"{env}=") and "\n" not in text and len(text) < 400, (env, text[:500])


def test_an_integer_past_pythons_int_string_limit_is_exit_3_in_one_line():
    from tests.conftest import run_cli

    for env in ("HEALTHCHECK_GPU_COUNT", "HEALTHCHECK_SHM_MIN_MIB", "HEALTHCHECK_MODEL_MAX_BYTES",
                "HEALTHCHECK_NCCL_MIN_SHM_MIB", "HEALTHCHECK_TORCH_TTL", "HEALTHCHECK_SSH_PORT"):
        out = run_cli(env={**_no_probes(), env: "4" * 4301})
        assert out.returncode == 3 and out.stdout == "", out.stdout + out.stderr[:500]
        assert out.stderr.count("\n") == 1 and len(out.stderr) < 400 and "Traceback" not in out.stderr
        assert f"healthcheck: {env}='4444" in out.stderr and "is too long: 4301 characters" in out.stderr
    # Under the length bound but past any bound's digits: out of range before int() reads it; a
    # leading run of zeros is still the number.
    with pytest.raises(ConfigError, match=r"HEALTHCHECK_GPU_COUNT='4444.* is out of range"):
        load({"HEALTHCHECK_GPU_COUNT": "4" * 4000})
    cfg = load({"HEALTHCHECK_GPU_COUNT": "0" * 4000 + "3", "HEALTHCHECK_TIMEOUT": "0" * 2000 + "2.5" + "0" * 2000})
    assert (cfg.of(hw.Expected).gpu_count, cfg.timeout) == (3, 2.5)


def _no_probes() -> dict[str, str]:
    from tests.conftest import clean_env

    return clean_env(**{t: "false" for t in registry.TOGGLES}, HEALTHCHECK_CHECKS_DIR="/nonexistent")


def test_serve_host_of_100k_characters_is_one_bounded_line():
    from tests.conftest import PYTHON, ROOT

    env = {**_no_probes(), "HEALTHCHECK_SERVE_HOST": "h" * 100_000}
    import subprocess

    out = subprocess.run([PYTHON, "-m", "probes", "serve", "--port", "1"], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 3 and out.stderr.count("\n") == 1 and len(out.stderr) < 400, out.stderr[:500]


REFUSED_HOSTS = ["\u00b2", "\uff11\uff12\uff17.0.0.1", "\uff4cocalhost", "ex\u00e4mple.com", "127.0.0.1\u200b",
                 "local host", "a/b", "h" * 254]
HOSTS = ["127.0.0.1", "::1", "localhost", "fe80::1%eth0", "jupyter_svc.ns.svc", "[::1]"]


def test_a_host_is_an_ip_address_or_an_ascii_name_else_refused_at_config_time():
    for host in REFUSED_HOSTS:
        with pytest.raises(ConfigError, match=r"HEALTHCHECK_HOST=.* is not (a host|accepted)"):
            load({"HEALTHCHECK_HOST": host})
    for host in HOSTS:
        assert load({"HEALTHCHECK_HOST": f" {host} "}).host == host


def test_a_non_ascii_host_is_exit_3_not_an_internal_error_in_a_probe():
    from tests.conftest import run_cli

    env = {**_no_probes(), "ENABLE_JUPYTER_CHECK": "true", "HEALTHCHECK_HOST": "\u00b2"}
    out = run_cli("--profile", "liveness", env=env)
    assert out.returncode == 3 and "HEALTHCHECK_HOST='\u00b2' is not a host" in out.stderr, out.stdout + out.stderr


@pytest.mark.parametrize("env", ["HEALTHCHECK_STATE_DIR", "HEALTHCHECK_LOG_FILE", "HEALTHCHECK_CHECKS_DIR"])
@pytest.mark.parametrize("path", ["state", "./state", "../up/log", "~/healthcheck", "relative/dir/"])
def test_a_relative_path_is_refused(env, path):
    with pytest.raises(ConfigError, match=f"{env}=.* is not an absolute path"):
        load({env: path})


def test_a_relative_state_dir_is_exit_3_and_creates_nothing(tmp_path):
    import subprocess

    from tests.conftest import PYTHON

    for env in ("HEALTHCHECK_STATE_DIR", "HEALTHCHECK_LOG_FILE"):
        out = subprocess.run([PYTHON, "-m", "probes", "--profile", "liveness"], env={**_no_probes(), env: "here"},
                             cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 3 and f"{env}='here' is not an absolute path" in out.stderr, out.stderr
        assert list(tmp_path.iterdir()) == []


def test_a_component_longer_than_name_max_is_refused():
    with pytest.raises(ConfigError, match="path component longer than 255 bytes"):
        load({"HEALTHCHECK_STATE_DIR": "/tmp/" + "d" * 256})


@pytest.fixture(scope="module")
def latin1_locale(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An ISO-8859-1 locale compiled into a private directory (localedef, ~0.3 s; nothing
    system-wide), as the environment that selects it."""
    import shutil
    import subprocess

    localedef = shutil.which("localedef")
    if localedef is None or not Path("/usr/share/i18n/charmaps/ISO-8859-1.gz").exists():
        pytest.skip("needs localedef and the ISO-8859-1 charmap (Debian: locales)")
    where = tmp_path_factory.mktemp("locales")
    subprocess.run([localedef, "-i", "en_US", "-f", "ISO-8859-1", str(where / "en_US.ISO-8859-1")],
                   capture_output=True, timeout=60, check=False)
    env = {"LOCPATH": str(where), "LC_ALL": "en_US.ISO-8859-1"}
    from tests.conftest import PYTHON

    seen = subprocess.run([PYTHON, "-c", "import sys; print(sys.getfilesystemencoding())"],
                          env={**_no_probes(), **env}, capture_output=True, text=True, timeout=60, check=False)
    if seen.stdout.strip() != "iso8859-1":
        pytest.skip(f"the compiled Latin-1 locale is not taken ({seen.stdout.strip() or seen.stderr[:200]})")
    return env


def test_a_utf8_path_under_a_latin1_locale_is_taken_and_used_as_the_same_bytes(tmp_path, latin1_locale):
    """Python reads the environment in the locale's encoding: under Latin-1, the UTF-8 bytes of 'à'
    (C3 A0) become 'Ã' and a no-break space, and those of '€' (E2 82 AC) hold a control character.
    The path is valid, and the suite must use its bytes as they are."""
    import subprocess

    from tests.conftest import PYTHON

    base = tmp_path / "voilà-€"
    checks = base / "checks"
    checks.mkdir(parents=True, mode=0o755)
    base.chmod(0o755)
    check = checks / "ok"
    check.write_text("#!/bin/sh\necho fine\n")
    check.chmod(0o755)
    env = {k: v for k, v in _no_probes().items() if not k.startswith(("LC_", "LANG"))}
    env.update(latin1_locale, HEALTHCHECK_STATE_DIR=str(base / "état"), HEALTHCHECK_CHECKS_DIR=str(checks),
               HEALTHCHECK_LOG_FILE=str(base / "journal.log"), ENABLE_TORCH_CHECK="true",
               HEALTHCHECK_TORCH_DEVICE="cpu", HEALTHCHECK_TORCH_PYTHON="/nonexistent/python")
    out = subprocess.run([PYTHON, "-m", "probes", "--only", "ok,torch-cuda"], env=env, cwd=tmp_path,
                         capture_output=True, timeout=60, check=False)
    text = out.stdout.decode("latin-1")
    assert out.returncode == 1 and "is not accepted" not in text + out.stderr.decode("latin-1"), text
    assert "PASS ok " in text and "fine" in text, text
    # The same bytes reached the system: the state dir (torch-cuda's caching), the checks dir
    # (the drop-in ran), the log file.
    assert (base / "état").is_dir() and "ok=pass" in (base / "journal.log").read_text()


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),  # opt-in: no probe key, no login
    ({"HEALTHCHECK_SSH_PROBE_KEY": "/run/k"}, True),
    ({"HEALTHCHECK_SSH_PROBE_KEY": "/run/k", "ENABLE_SSH_CHECK": "false"}, False),
    ({"HEALTHCHECK_SSH_PROBE_KEY": "/run/k", "ENABLE_SSH_CHECK": "false", "ENABLE_SSH_LOGIN_CHECK": "true"}, True),
    ({"ENABLE_SSH_CHECK": "true", "ENABLE_SSH_LOGIN_CHECK": "true"}, True),
])
def test_the_ssh_login_follows_the_ssh_toggle_and_stays_opt_in(env, on):
    """ENABLE_SSH_CHECK=false (a container without sshd, as an arbitrary UID runs the image) turns
    the login off too, though the image sets the probe key; its own toggle still wins."""
    from probes.services import ssh_login

    assert load(env).enabled(ssh_login.SPEC) is on
