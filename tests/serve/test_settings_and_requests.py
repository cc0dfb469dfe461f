"""What `healthcheck serve` accepts: the address it binds, its intervals, the requests it answers.

Settings are judged by settings.load (the same code serve runs) and by a real serve process;
requests are raw bytes on a real socket to a real server.
"""

from __future__ import annotations

import subprocess

import pytest

from probes.config import ConfigError
from probes.serve import settings
from tests.conftest import ROOT, clean_env
from tests.serve.conftest import ALL_OFF, PYTHON

# --------------------------------------------------------------------------- the address


@pytest.mark.parametrize("raw", [
    "0", "1", "127.1", "0x7f000001", "256.1.1.1", "1.2.3.4.5", "example.invalid", "localhost.localdomain", "*",
    "[::1]", "::1::", "fe80::1%lo", "127.0.0.1:8779", "\uff11\uff12\uff17.0.0.1", "\u0661.0.0.1", "1" * 100_000,
])
def test_a_host_that_is_no_address_literal_is_refused_naming_the_setting(raw: str):
    with pytest.raises(ConfigError) as env_error:
        settings.load(clean_env(HEALTHCHECK_SERVE_HOST=raw))
    with pytest.raises(ConfigError) as flag_error:
        settings.load(clean_env(HEALTHCHECK_SERVE_HOST="127.0.0.1"), host=raw)
    for error, name in ((env_error, "HEALTHCHECK_SERVE_HOST="), (flag_error, "--host=")):
        text = str(error.value)
        assert text.startswith(name) and "accepted: an IPv4 or IPv6 address" in text, text
        assert len(text) < 400 and text.isprintable()


@pytest.mark.parametrize(("raw", "bound"), [
    ("127.0.0.1", "127.0.0.1"), (" ::1 ", "::1"), ("0.0.0.0", "0.0.0.0"), ("::", "::"),
    ("localhost", "127.0.0.1"), ("LocalHost", "127.0.0.1"), ("192.0.2.7", "192.0.2.7"),
    ("::ffff:127.0.0.1", "::ffff:127.0.0.1"),
])
def test_address_literals_and_localhost_are_accepted(raw: str, bound: str):
    assert settings.load(clean_env(HEALTHCHECK_SERVE_HOST=raw)).host == bound
    assert settings.load(clean_env(), host=raw).host == bound


def _serve(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "probes", "serve", "--port", "0", *args], cwd=ROOT,
                          env=clean_env(**ALL_OFF, **env), capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize(("args", "env", "name"), [
    ([], {"HEALTHCHECK_SERVE_HOST": "example.invalid"}, "HEALTHCHECK_SERVE_HOST"),
    (["--host", "256.1.1.1"], {}, "--host"),
    ([], {"HEALTHCHECK_SERVE_HOST": "0"}, "HEALTHCHECK_SERVE_HOST"),
    # Well-formed, but no address of this machine (TEST-NET-1 is never assigned).
    ([], {"HEALTHCHECK_SERVE_HOST": "192.0.2.1"}, "HEALTHCHECK_SERVE_HOST=192.0.2.1 cannot be bound here"),
    (["--host", "::ffff:192.0.2.1"], {}, "--host=::ffff:192.0.2.1 cannot be bound here"),
])
def test_an_address_serve_cannot_bind_is_a_configuration_error(args: list[str], env: dict[str, str], name: str):
    r = _serve(*args, **env)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 3, r
    assert len(lines) == 1 and name in lines[0] and "accepted:" in lines[0], r.stderr
    assert "Unknown error" not in r.stderr and "--port" not in r.stderr and "Traceback" not in r.stderr


# --------------------------------------------------------------------------- timing settings


@pytest.mark.parametrize(("env", "interval"), [
    ({"HEALTHCHECK_SERVE_INTERVAL": "0.0000001"}, None),
    ({"HEALTHCHECK_SERVE_INTERVAL": "liveness=0.2"}, None),
    ({}, "0.1"),
    ({}, "readiness=15,startup=0.24"),
    ({"HEALTHCHECK_SERVE_SLOWDOWN_SAMPLE": "0.0001"}, None),
    ({"HEALTHCHECK_SERVE_SLOWDOWN_SAMPLE": "0.09"}, None),
])
def test_intervals_too_short_to_pause_are_refused(env: dict[str, str], interval: str | None):
    with pytest.raises(ConfigError, match="accepted: "):
        settings.load(clean_env(**env), interval=interval)


def test_the_floors_are_where_the_docs_say():
    s = settings.load(clean_env(HEALTHCHECK_SERVE_SLOWDOWN_SAMPLE="0.1"), interval="0.25")
    assert dict(s.intervals) == {"startup": 0.25, "readiness": 0.25, "liveness": 0.25}
    assert s.slowdown_sample == 0.1
    assert settings.load(clean_env(HEALTHCHECK_SERVE_SLOWDOWN_SAMPLE="0")).slowdown_sample == 0  # off
    with pytest.raises(ConfigError, match=r"at least 0\.25 "):
        settings.load(clean_env(), interval="0.2499")
    with pytest.raises(ConfigError, match=r"0 for off, or seconds from 0\.1 to 3600"):
        settings.load(clean_env(HEALTHCHECK_SERVE_SLOWDOWN_SAMPLE="0.0999"))
