"""End to end: the GPU dev image on a real Docker engine (CPU base, GPU checks off unless stubbed).

Proves the image's HEALTHCHECK parameters, the starting -> healthy -> unhealthy -> healthy cycle
driven by real services (sshd killed, Jupyter frozen), our own deadline on a hanging nvidia-smi
without leftover processes, per-container SSH host keys with password and root login refused,
Jupyter's token kept out of logs and argv, and that the notebook user cannot hang, crash,
steer or fake root's Jupyter probe through files in its runtime directory.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (
    DOCUMENTED,
    Health,
    docker,
    exec_in,
    health_of,
    inspect,
    last_output,
    record_timing,
    wait_for_health,
)

from probes import __version__

pytestmark = pytest.mark.e2e

# Fast overrides for the failure tests: the image's --timeout stays (35 s, above the suite's
# own hard deadline), interval and retries shrink so a test takes seconds, not minutes.
FAST = Health(interval="2s", start_period="60s", start_interval="1s", retries=2)
SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """'1m30s' / '35s' / '500ms' -> seconds."""
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text):
        total += float(number) * SECONDS[unit]
    return total


def worst_case_unhealthy(interval: float, timeout: float, retries: int) -> float:
    """Longest time from a service failing to `unhealthy` (a probe had just started and passed):
    the probe in flight (<= timeout), then `retries` failing probes, each one interval after the
    previous ended and each at most `timeout` long."""
    return timeout + retries * (interval + timeout)


def parse_time(stamp: str) -> dt.datetime:
    # Docker writes nanoseconds; Python takes microseconds.
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", stamp.replace("Z", "+00:00"))
    return dt.datetime.fromisoformat(stamp)


def probe_seconds(entry: dict[str, str]) -> float:
    return (parse_time(entry["End"]) - parse_time(entry["Start"])).total_seconds()


def wait_until(predicate, timeout: float, what: str, poll: float = 0.25) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what} not reached within {timeout:.0f}s")
        time.sleep(poll)


def services_answer(cid: str) -> bool:
    return exec_in(cid, "healthcheck", "--only", "jupyter,ssh", check=False).returncode == 0


def test_image_carries_the_documented_healthcheck_and_version(image: str) -> None:
    config = inspect(image)["Config"]
    hc = config["Healthcheck"]
    assert hc["Test"] == ["CMD", "/usr/local/bin/healthcheck"], "exec form, through the front door"
    assert (hc["Interval"] / 1e9, hc["Timeout"] / 1e9, hc["StartPeriod"] / 1e9, hc["StartInterval"] / 1e9,
            hc["Retries"]) == DOCUMENTED
    # The suite's readiness deadline (25 s) and the front door's hard stop (+3 s) end before
    # Docker's timeout, so a stuck probe reports our reason, never "exceeded timeout".
    assert hc["Timeout"] / 1e9 > 25 + 3
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env.get("JUPYTER_RUNTIME_DIR"), "the probe needs the server's runtime dir in the image env"
    assert config["Entrypoint"][0].endswith("tini"), "tini must be PID 1"
    # A plain `docker build` labels the image with the suite's release, as the manifests tag it.
    assert config["Labels"]["org.opencontainers.image.version"] == __version__


def test_suite_lives_in_its_own_venv(start_container) -> None:  # type: ignore[no-untyped-def]
    cid = start_container(healthcheck=False, command=("sleep", "600"))
    # Installed as pip installs into any Python, the front door and healthcheck-probes hard-linked
    # into /usr/local/bin: no symbolic link for the front door to resolve on every probe.
    out = exec_in(cid, "bash", "-c",
                  "for f in healthcheck healthcheck-probes; do [ ! -L /usr/local/bin/$f ] && "
                  "[ /usr/local/bin/$f -ef /opt/healthcheck/.venv/bin/$f ] && echo linked || echo not-linked; done; "
                  "/opt/healthcheck/.venv/bin/python -c 'import probes, sys; print(probes.__file__)'; "
                  "/opt/healthcheck/.venv/bin/python -c 'import torch' 2>/dev/null || echo no-torch-in-venv; "
                  "ls /etc/ssh/ | grep -c ssh_host_ || true; "
                  "ls /opt/healthcheck/.venv/lib/python3*/site-packages/ | grep -c '[.]pth$' || true").stdout.split()
    assert out[:2] == ["linked", "linked"], out
    assert out[2].startswith("/opt/healthcheck/.venv/lib/")
    assert out[3] == "no-torch-in-venv", "the suite never imports torch itself"
    assert out[4] == "0", "the image must not carry SSH host keys"
    assert out[5] == "0", "no .pth file runs at the start of every probe (setuptools' shim)"
    # A user's pip install into the image's Python does not touch the suite's environment.
    exec_in(cid, "python3", "-m", "pip", "uninstall", "-y", "-q", "psutil", check=False)
    assert exec_in(cid, "healthcheck", "--help").returncode == 0
    assert exec_in(cid, "/opt/healthcheck/.venv/bin/python", "-c", "import psutil").returncode == 0
    # The suite's bytecode was compiled in the build, so no probe compiles it (or needs to write there).
    cached = exec_in(cid, "/opt/healthcheck/.venv/bin/python", "-I", "-c",
                     "import importlib.util as u, os, probes; home = os.path.dirname(probes.__file__); "
                     "print(all(os.path.exists(u.cache_from_source(f'{home}/{n}.py')) "
                     "for n in ('cli', 'runner', 'config', 'services/ssh')))").stdout.split()
    assert cached == ["True"], cached


def test_starts_healthy_within_start_period_with_builtin_healthcheck(start_container, image: str) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    cid = start_container()  # the image's own HEALTHCHECK, no overrides
    assert health_of(cid)["Status"] == "starting"
    start_period = inspect(image)["Config"]["Healthcheck"]["StartPeriod"] / 1e9
    wait_for_health(cid, "healthy", timeout=start_period)
    to_healthy = time.monotonic() - t0
    out = last_output(cid)
    assert out.startswith("healthy:"), out
    for check in ("PASS torch-cuda", "PASS jupyter", "PASS ssh"):
        assert check in out, out
    assert "matmul" in out, "the real tensor op ran"
    log = health_of(cid)["Log"]
    first = probe_seconds(log[0])

    # Measurements for the tuning section: Jupyter's start-up, a cold (startup profile:
    # fresh torch import + op) and a warm (readiness, cached torch result) probe.
    started = parse_time(inspect(cid)["State"]["StartedAt"])
    stamps = docker("logs", "-t", cid).stderr.splitlines() + docker("logs", "-t", cid).stdout.splitlines()
    ready = [parse_time(line.split()[0]) for line in stamps if "is running at" in line]
    t = time.monotonic()
    cold = exec_in(cid, "healthcheck", "--profile", "startup")
    cold_s = time.monotonic() - t
    assert cold.returncode == 0, cold.stdout
    t = time.monotonic()
    warm = exec_in(cid, "healthcheck")
    warm_s = time.monotonic() - t
    assert warm.returncode == 0, warm.stdout
    record_timing("run_to_healthy_s", round(to_healthy, 2))
    record_timing("first_probe_s", round(first, 2))
    if ready:
        record_timing("jupyter_ready_s", round((ready[0] - started).total_seconds(), 2))
    record_timing("startup_profile_exec_s", round(cold_s, 2))
    record_timing("readiness_cached_exec_s", round(warm_s, 2))


def test_sshd_killed_makes_it_unhealthy_and_back(start_container) -> None:  # type: ignore[no-untyped-def]
    cid = start_container(health=FAST)
    wait_for_health(cid, "healthy", timeout=60)
    t0 = time.monotonic()
    exec_in(cid, "pkill", "-x", "sshd")
    worst = worst_case_unhealthy(duration(FAST.interval or ""), 35.0, FAST.retries or 0)
    wait_for_health(cid, "unhealthy", timeout=worst)
    record_timing("ssh_killed_to_unhealthy_s_interval2_retries2", round(time.monotonic() - t0, 2))
    out = last_output(cid)
    assert out.startswith("unhealthy: ssh:"), out
    assert "FAIL ssh" in out and "PASS jupyter" in out
    assert health_of(cid)["Log"][-1]["ExitCode"] == 1

    exec_in(cid, "/usr/sbin/sshd")  # daemonises; tini adopts it
    wait_for_health(cid, "healthy", timeout=worst)
    assert last_output(cid).startswith("healthy:")


def test_frozen_jupyter_makes_it_unhealthy_and_back(start_container) -> None:  # type: ignore[no-untyped-def]
    # SIGSTOP: the kernel still completes TCP handshakes on the port, but nothing answers HTTP.
    cid = start_container(health=FAST)
    wait_for_health(cid, "healthy", timeout=60)
    runtime = exec_in(cid, "bash", "-c", "ls $JUPYTER_RUNTIME_DIR/jpserver-*.json").stdout.split()
    assert len(runtime) == 1, runtime
    pid = re.search(r"jpserver-(\d+)\.json", runtime[0]).group(1)  # type: ignore[union-attr]
    assert exec_in(cid, "ps", "-o", "user=", "-p", pid).stdout.strip() == "dev", "Jupyter runs as the user"
    t0 = time.monotonic()
    exec_in(cid, "kill", "-STOP", pid)
    worst = worst_case_unhealthy(duration(FAST.interval or ""), 35.0, FAST.retries or 0)
    try:
        wait_for_health(cid, "unhealthy", timeout=worst)
        record_timing("jupyter_frozen_to_unhealthy_s_interval2_retries2", round(time.monotonic() - t0, 2))
        out = last_output(cid)
        assert out.startswith("unhealthy: jupyter:"), out
        assert "FAIL jupyter" in out and "PASS ssh" in out
        failing = [probe_seconds(e) for e in health_of(cid)["Log"] if e["ExitCode"] != 0]
        record_timing("probe_with_frozen_jupyter_s", round(max(failing), 2))
    finally:
        exec_in(cid, "kill", "-CONT", pid)
    wait_for_health(cid, "healthy", timeout=worst)


HANGING_NVIDIA_SMI = """#!/bin/bash
# A wedged driver: ignores TERM, holds its output pipe open through a child, never answers.
echo call >>/var/stub/calls
trap '' TERM
sleep 300 &
sleep 300
"""


def snapshot(cid: str) -> dict[int, str]:
    """pid -> 'stat comm args' of every process in the container except the ps itself."""
    out = exec_in(cid, "ps", "-eo", "pid=,stat=,comm=,args=").stdout
    procs = {}
    for line in out.splitlines():
        fields = line.split(None, 3)
        if len(fields) >= 3 and fields[2] != "ps":
            procs[int(fields[0])] = " ".join(fields[1:])
    return procs


def test_hanging_nvidia_smi_reports_our_deadline_and_leaves_nothing(start_container, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    stub = tmp_path / "nvidia-smi"
    stub.write_text(HANGING_NVIDIA_SMI)
    stub.chmod(0o755)
    calls_dir = tmp_path / "stub"
    calls_dir.mkdir()
    calls = calls_dir / "calls"
    # A 1 s run budget (hard stop 4 s) under a 10 s Docker timeout keeps 20 runs short; the
    # stub runs once per probe run, so its call count is the run count. A run that left a process
    # would leave one per run: 20 runs show it as well as 50 did.
    cid = start_container(
        "-v", f"{stub}:/usr/local/bin/nvidia-smi:ro", "-v", f"{calls_dir}:/var/stub",
        env={"ENABLE_GPU_CHECK": "true", "HEALTHCHECK_TIMEOUT": "1"},
        health=Health(interval="500ms", timeout="10s", start_period="1s", start_interval="500ms", retries=1),
    )
    wait_until(lambda: services_answer(cid), 90, "sshd and Jupyter answering")
    baseline = snapshot(cid)

    def runs() -> int:
        return len(calls.read_text().splitlines()) if calls.exists() else 0

    wait_until(lambda: runs() >= 20, 120, "20 probe runs")
    health = health_of(cid)
    assert health["Status"] == "unhealthy"
    for entry in health["Log"]:
        assert entry["ExitCode"] == 1, entry
        assert "exceeded timeout" not in entry["Output"], entry
        assert entry["Output"].startswith("unhealthy: nvidia-smi:"), entry
        assert "deadline" in entry["Output"], entry
        assert probe_seconds(entry) < 10
    record_timing("probe_with_hanging_nvidia_smi_timeout1_s",
                  round(max(probe_seconds(e) for e in health["Log"]), 2))

    # Anything still there across two snapshots taken more than one whole probe run apart
    # (run + hard deadline < 5 s) and not there at the start is a leftover.
    first = snapshot(cid)
    n = runs()
    wait_until(lambda: runs() >= n + 2, 60, "two more probe runs")
    time.sleep(0.5)
    second = snapshot(cid)
    persistent = {pid: desc for pid, desc in second.items() if first.get(pid) == desc}
    leftovers = {pid: desc for pid, desc in persistent.items() if pid not in baseline}
    assert leftovers == {}, f"processes left behind by probe runs: {leftovers}"
    zombies = {pid: desc for pid, desc in persistent.items() if desc.startswith("Z")}
    assert zombies == {}, f"zombies: {zombies}"


@pytest.fixture(scope="module")
def keyed(start_shared, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:  # type: ignore[no-untyped-def]
    """Two containers (no HEALTHCHECK) whose user has one public key, both answering; the private half.
    The tests below only read them, but the last, which stops the second."""
    key = tmp_path_factory.mktemp("key") / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "e2e", "-f", str(key)], check=True,
                   capture_output=True, timeout=60)
    public = key.with_suffix(".pub").read_text().strip()
    pair = [start_shared(healthcheck=False, env={"SSH_AUTHORIZED_KEYS": public}) for _ in range(2)]
    for cid in pair:
        wait_until(lambda cid=cid: services_answer(cid), 90, "sshd and Jupyter answering")
    return pair[0], pair[1], key.read_text()


def test_ssh_host_keys_per_container_and_only_key_login(keyed: tuple[str, str, str]) -> None:
    a, b, private = keyed
    key = "cat /etc/ssh/ssh_host_ed25519_key.pub"
    assert exec_in(a, "bash", "-c", key).stdout != exec_in(b, "bash", "-c", key).stdout

    effective = exec_in(a, "/usr/sbin/sshd", "-T").stdout.lower().splitlines()
    for line in ("passwordauthentication no", "kbdinteractiveauthentication no", "permitrootlogin no",
                 "pubkeyauthentication yes", "permitemptypasswords no"):
        assert line in effective, line
    # The loopback penalty exemption is installed exactly when this sshd (9.8+) knows it.
    version = re.search(r"OpenSSH_(\d+)\.(\d+)", exec_in(a, "ssh", "-V").stderr)
    assert version, "ssh -V names no OpenSSH version"
    knows = (int(version.group(1)), int(version.group(2))) >= (9, 8)
    assert any(x.startswith("persourcepenaltyexemptlist 127.0.0.0/8") for x in effective) == knows
    assert (exec_in(a, "test", "-e", "/etc/ssh/sshd_config.d/20-penalty-exempt.conf",
                    check=False).returncode == 0) == knows

    exec_in(a, "bash", "-c", "umask 077 && cat >/tmp/k", input=private)
    ssh = ["ssh", "-i", "/tmp/k", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
           "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10"]
    ok = exec_in(a, *ssh, "dev@127.0.0.1", "id", "-un", check=False)
    assert (ok.returncode, ok.stdout.strip()) == (0, "dev"), ok.stderr  # the key works for the user

    # The same key is refused for root.
    exec_in(a, "bash", "-c", "install -d -m 700 /root/.ssh && cp ~dev/.ssh/authorized_keys /root/.ssh/")
    root = exec_in(a, *ssh, "root@127.0.0.1", "true", check=False)
    assert root.returncode == 255 and "Permission denied" in root.stderr, root.stderr
    # Passwords are not even offered: the server lists publickey as its only method.
    password = exec_in(a, "ssh", "-o", "PubkeyAuthentication=no", "-o", "BatchMode=yes",
                       "-o", "PreferredAuthentications=password,keyboard-interactive",
                       "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                       "dev@127.0.0.1", "true", check=False)
    assert password.returncode == 255
    assert "Permission denied (publickey)" in password.stderr, password.stderr


def test_jupyter_token_stays_secret_and_stop_is_clean(keyed: tuple[str, str, str]) -> None:
    cid = keyed[1]
    token = exec_in(cid, "bash", "-c", "cat $JUPYTER_RUNTIME_DIR/token").stdout.strip()
    assert len(token) >= 32
    logs = docker("logs", cid)
    assert token not in logs.stdout + logs.stderr, "the token must never reach the logs"
    assert token not in exec_in(cid, "ps", "-eo", "args").stdout, "the token must not be on argv"
    api = ("import sys, urllib.request, urllib.error\n"
           "def get(path):\n"
           "    try:\n"
           "        return urllib.request.urlopen('http://127.0.0.1:8888' + path, timeout=5).status\n"
           "    except urllib.error.HTTPError as e:\n"
           "        return e.code\n"
           "print(get('/api/status'), get('/api/status?token=' + sys.argv[1]))\n")
    assert exec_in(cid, "python3", "-c", api, token).stdout.split() == ["403", "200"], "a token is required"

    docker("stop", "-t", "20", cid, timeout=60)
    state = inspect(cid)["State"]
    assert state["ExitCode"] == 0, "TERM reached both services and the entrypoint ended cleanly"
    logs = docker("logs", "--tail", "5", cid)
    assert "stopping sshd, jupyter" in logs.stderr + logs.stdout


# ---------------------------------------------------------------- the notebook user against root's probe
# /run/jupyter belongs to the notebook user `dev`; the HEALTHCHECK runs as root and reads it.

FAKE_JUPYTER = r"""
import os, socket, sys
port, log = int(sys.argv[1]), sys.argv[2]
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", port))
srv.listen(16)
with open(log, "a") as f:
    f.write(f"listening {os.getpid()}\n")
while True:
    conn, peer = srv.accept()
    with open(log, "a") as f:
        f.write(f"connection from {peer[0]}\n")
    try:
        conn.settimeout(2)
        conn.recv(4096)
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n'
                     b'{"version": "9.9.9"}')
    except OSError:
        pass
    conn.close()
"""
FAKE_PORT = 9999
FAKE_LOG = "/tmp/fake-jupyter.log"

WRITE_AS_DEV = r"""
import json, os, sys
path, doc = sys.argv[1], json.loads(sys.argv[2])
with open(path, "w") as f:
    f.write("[" * 30000 + "]" * 30000 if doc == "nested" else json.dumps(doc))
"""


def container_address(cid: str) -> str:
    """The container's own non-loopback address (where its default route leaves)."""
    code = ("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "s.connect(('192.0.2.1', 9))\nprint(s.getsockname()[0])\n")
    addr = exec_in(cid, "python3", "-c", code).stdout.strip()
    assert addr and not addr.startswith("127."), addr
    return addr


def as_dev_write(cid: str, name: str, doc: object) -> None:
    exec_in(cid, "python3", "-c", WRITE_AS_DEV, f"/run/jupyter/{name}", json.dumps(doc), user="dev")


def start_fake_jupyter(cid: str) -> int:
    """The notebook user's fake Jupyter on 0.0.0.0:FAKE_PORT (it logs every connection); its pid."""
    docker("exec", "-d", "-u", "dev", cid, "python3", "-c", FAKE_JUPYTER, str(FAKE_PORT), FAKE_LOG)
    found: list[str] = []

    def up() -> bool:
        out = exec_in(cid, "cat", FAKE_LOG, check=False).stdout
        found[:] = re.findall(r"^listening (\d+)$", out, re.M)
        return bool(found)

    wait_until(up, 30, "the fake Jupyter listening")
    return int(found[0])


def fake_connections(cid: str) -> list[str]:
    return [line for line in exec_in(cid, "cat", FAKE_LOG).stdout.splitlines() if line.startswith("connection")]


def jupyter_pid(cid: str) -> int:
    names = exec_in(cid, "bash", "-c", "ls /run/jupyter").stdout.split()
    pids = [int(m.group(1)) for n in names if (m := re.fullmatch(r"jpserver-(\d+)\.json", n))]
    assert len(pids) == 1, names
    return pids[0]


def next_health_result(cid: str, after: float, timeout: float) -> dict[str, str]:
    """The first Docker health result whose probe started after ``after`` (a time.time())."""
    found: list[dict[str, str]] = []

    def newer() -> bool:
        found[:] = [e for e in health_of(cid).get("Log") or [] if parse_time(e["Start"]).timestamp() > after]
        return bool(found)

    wait_until(newer, timeout, "a health check run after the change")
    return found[0]


def test_notebook_user_files_cannot_hang_crash_or_steer_the_probe(start_container) -> None:  # type: ignore[no-untyped-def]
    cid = start_container(health=FAST)
    wait_for_health(cid, "healthy", timeout=60)
    real = jupyter_pid(cid)
    fake_pid = start_fake_jupyter(cid)
    addr = container_address(cid)
    since = time.time()
    # All at once, each a file the probe must pass over: a fifo (would hang a reader), JSON nested too
    # deep for a parser, the fake's pid and port with a hostname off loopback, and the real server's
    # pid and port with that hostname and another base URL: a probe that used either of the last two
    # would connect to addr (the fake logs it; Jupyter logs the 404 for /elsewhere/api).
    exec_in(cid, "mkfifo", "/run/jupyter/jpserver-1.json", user="dev")
    as_dev_write(cid, "jpserver-2.json", "nested")
    as_dev_write(cid, "jpserver-3.json", {"pid": fake_pid, "port": FAKE_PORT, "hostname": addr,
                                          "base_url": "/", "secure": False, "token": "t"})
    as_dev_write(cid, "jpserver-4.json", {"pid": real, "port": 8888, "hostname": addr,
                                          "base_url": "/elsewhere/", "secure": False, "token": "t"})
    t0 = time.monotonic()
    out = exec_in(cid, "healthcheck", "--only", "jupyter", check=False)
    assert time.monotonic() - t0 < 10, "the probe was held up"
    assert out.returncode == 0, out.stdout
    assert "PASS jupyter" in out.stdout and "127.0.0.1:8888" in out.stdout, out.stdout
    entry = next_health_result(cid, since, timeout=60)
    assert entry["ExitCode"] == 0 and entry["Output"].startswith("healthy:"), entry
    assert fake_connections(cid) == [], "the probe connected where a runtime file said"
    logs = docker("logs", cid)
    assert "/elsewhere/" not in logs.stdout + logs.stderr, "the probe used the file's hostname and base URL"


def test_notebook_users_fake_server_cannot_stand_in_for_a_stopped_jupyter(start_container) -> None:  # type: ignore[no-untyped-def]
    cid = start_container(health=FAST)
    wait_for_health(cid, "healthy", timeout=60)
    real = jupyter_pid(cid)
    fake_pid = start_fake_jupyter(cid)
    addr = container_address(cid)
    # Its runtime file says "Jupyter is here, on port 9999" (loopback, a live pid that really
    # holds that port); another says the same with the container's own address.
    as_dev_write(cid, f"jpserver-{fake_pid}.json", {"pid": fake_pid, "port": FAKE_PORT, "hostname": "localhost",
                                                    "base_url": "/", "secure": False, "token": "t"})
    as_dev_write(cid, "jpserver-3.json", {"pid": fake_pid, "port": FAKE_PORT, "hostname": addr,
                                          "base_url": "/", "secure": False, "token": "t"})
    exec_in(cid, "kill", str(real))
    wait_until(lambda: exec_in(cid, "kill", "-0", str(real), check=False).returncode != 0, 30,
               "the real Jupyter stopped")
    worst = worst_case_unhealthy(duration(FAST.interval or ""), 35.0, FAST.retries or 0)
    wait_for_health(cid, "unhealthy", timeout=worst)
    out = last_output(cid)
    assert out.startswith("unhealthy: jupyter:"), out
    assert "nothing listening on 127.0.0.1:8888" in out and "FAIL jupyter" in out and "PASS ssh" in out, out
    assert "9.9.9" not in out and "deadline" not in out, out
    assert "; not used: jpserver-" in out, "the refused runtime files are mentioned"
    assert fake_connections(cid) == [], "the probe connected to the notebook user's fake server"


def test_dockers_default_shm_warns_with_the_remedy_and_stays_healthy(start_container):
    """Docker's default /dev/shm (64 MiB) breaks NCCL and DataLoader workers: a warning, not a failure."""
    cid = start_container("--shm-size=64m", health=FAST)
    wait_for_health(cid, "healthy", timeout=90)
    out = last_output(cid)
    assert out.startswith("healthy with warnings: runtime: /dev/shm is 64 MiB"), out
    assert "--shm-size" in out.splitlines()[0]
