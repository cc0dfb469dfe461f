"""The nvidia-smi probe: the real judge on gathered data, and the real probe against stub executables."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from probes import proc
from probes.hardware import nvidia_smi
from probes.result import Status
from tests.fakes.nvidia_smi_stub import MESSAGES, gpu_rows, started_pids, write_stub
from tests.hardware.conftest import assert_gone, make_ctx


def gathered(returncode: int | None = 0, stdout: str = "", stderr: str = "", **kw) -> proc.Completed:
    return proc.Completed(nvidia_smi.ARGV, returncode, stdout.encode(), stderr.encode(), **kw)


# ---- judge on gathered data ------------------------------------------------------------------

def test_two_gpus_pass_with_facts(ctx):
    r = nvidia_smi.judge(gathered(0, gpu_rows(2)), ctx)
    assert r.status is Status.PASS
    assert r.observed == 2 and r.unit == "gpus"
    assert "2 GPUs visible" in r.message
    assert r.facts["count"] == 2
    assert [g["index"] for g in r.facts["gpus"]] == [0, 1]
    assert r.facts["gpus"][1]["uuid"].startswith("GPU-")
    assert r.facts["gpus"][0]["name"] == "NVIDIA A100-SXM4-80GB"


def test_fewer_gpus_than_expected_fails():
    r = nvidia_smi.judge(gathered(0, gpu_rows(1)), make_ctx(gpu_count=2))
    assert r.status is Status.FAIL
    assert r.reason == "gpu-count"
    assert "1 GPU visible (expected at least 2)" in r.message
    assert "HEALTHCHECK_GPU_COUNT" in r.message


def test_zero_expected_and_zero_visible_passes():
    r = nvidia_smi.judge(gathered(0, ""), make_ctx(gpu_count=0))
    assert r.status is Status.PASS and r.observed == 0


@pytest.mark.parametrize(("code", "reason", "words"), [
    (6, "no-devices", "--gpus all"),
    (9, "driver-not-loaded", "modprobe nvidia"),
    (12, "nvml-not-found", "NVIDIA Container Toolkit"),
    (14, "inforom-corrupted", "RMA"),
    (15, "gpu-lost", "reboot the node"),
    (255, "nvml-unknown-error", "recreate the container"),
])
def test_documented_exit_codes(ctx, code, reason, words):
    r = nvidia_smi.judge(gathered(code, MESSAGES[code] + "\n"), ctx)
    assert r.status is Status.FAIL
    assert r.reason == reason
    assert words in r.message
    assert "\n" not in r.message


# nvidia-smi(1) RETURN VALUE, and the NVML codes nvidia-smi passes on (16-18)
DOCUMENTED = (2, 3, 4, 6, 8, 9, 10, 12, 13, 14, 15, 255)


@pytest.mark.parametrize(("code", "reason", "words"), [
    (2, "bad-argument", "use the nvidia-smi that the NVIDIA Container Toolkit mounts"),
    (3, "not-supported", "check the driver on the host"),
    (4, "no-permission", "container_use_devices"),
    (8, "insufficient-power", "power cables"),
    (10, "irq-issue", "interrupt"),
    (13, "nvml-too-old", "remove the driver libraries from the image"),
    (16, "reset-required", "reset the GPU"),
    (17, "blocked-by-os", "recreate the container"),
    (18, "driver-mismatch", "reboot the node, or reload the kernel module"),
])
def test_every_documented_exit_code_has_its_cause_and_remedy(ctx, code, reason, words):
    r = nvidia_smi.judge(gathered(code, ""), ctx)
    assert r.status is Status.FAIL and r.reason == reason and words in r.message and f"exit {code}" in r.message


def test_the_exit_code_table_holds_what_nvidia_documents():
    assert set(DOCUMENTED) | {16, 17, 18} == set(nvidia_smi.EXIT_CODES)
    assert nvidia_smi.EXIT_CODES[9].documented == "NVIDIA driver is not loaded"
    assert nvidia_smi.EXIT_CODES[255].documented == "Other error or internal driver error occurred"
    assert "nvidia-smi/index.html" in nvidia_smi.__doc__ and "nvml-api" in nvidia_smi.__doc__
    for code, entry in nvidia_smi.EXIT_CODES.items():
        assert entry.cause in nvidia_smi.SPEC.causes and f"exit {code}" in entry.cause.cause


@pytest.mark.parametrize(("code", "text", "reason"), [
    (18, "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.144", "driver-mismatch"),
    (255, "Failed to initialize NVML: Driver/library version mismatch", "driver-mismatch"),
    (17, "Failed to initialize NVML: GPU access blocked by the operating system", "blocked-by-os"),
    (255, "Failed to initialize NVML: GPU access blocked by the operating system", "blocked-by-os"),
    (4, "Failed to initialize NVML: Insufficient Permissions", "no-permission"),
    (255, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
          "latest NVIDIA driver is installed and running.", "driver-not-loaded"),
    (0, "Failed to initialize NVML: Driver/library version mismatch", "driver-mismatch"),  # a wrapper ate the code
])
def test_what_nvidia_smi_prints_decides_over_its_exit_code(ctx, code, text, reason):
    r = nvidia_smi.judge(gathered(code, text + "\n"), ctx)
    assert r.reason == reason and any(t in r.message for t, _ in nvidia_smi.TEXTS if t in text), r.message


def test_255_without_unknown_error_is_a_plain_exit_code(ctx):
    r = nvidia_smi.judge(gathered(255, "", "something else broke"), ctx)
    assert r.reason == "exit-code" and "exit 255" in r.message and "something else broke" in r.message


def test_not_on_path(ctx):
    r = nvidia_smi.judge(proc.Completed(nvidia_smi.ARGV, None, spawn_error="not found"), ctx)
    assert r.status is Status.FAIL and r.reason == "not-found"
    assert "start the container with --gpus all" in r.message


def test_cannot_start(ctx):
    r = nvidia_smi.judge(proc.Completed(nvidia_smi.ARGV, None, spawn_error="permission denied"), ctx)
    assert r.reason == "cannot-start" and "permission denied" in r.message


def test_a_limit_of_the_container_is_not_checked_with_the_runners_cause(ctx):
    import errno

    from probes import childio, runner

    words = childio.spawn_error(OSError(errno.EAGAIN, "try again"), "nvidia-smi", None, None)
    r = nvidia_smi.judge(proc.Completed(nvidia_smi.ARGV, None, spawn_error=words), ctx)
    assert (r.status, r.reason, r.action, r.actor) == (Status.WARN, "limit", runner.LIMIT.action, "tenant")
    assert r.message == f"not checked: nvidia-smi {words}"


def test_killed_by_signal(ctx):
    r = nvidia_smi.judge(gathered(-11), ctx)
    assert r.reason == "killed" and "SIGSEGV" in r.message


@pytest.mark.parametrize("code", [129, 137, 200, 254])
def test_an_exit_above_128_is_an_exit_not_a_signal(ctx, code):
    # nvidia-smi is not run through a shell: only Completed.signal says a signal killed it.
    r = nvidia_smi.judge(gathered(code, "", "boom"), ctx)
    assert r.reason != "killed" and f"exit {code}" in r.message and "signal" not in r.message


def test_a_missing_interpreter_is_not_a_missing_nvidia_smi(ctx):
    r = nvidia_smi.judge(proc.Completed(nvidia_smi.ARGV, None, spawn_error="interpreter missing"), ctx)
    assert r.reason == "cannot-start" and "interpreter is missing" in r.message and "PATH" not in r.message


def test_deadline_and_stuck(ctx):
    r = nvidia_smi.judge(gathered(None, timed_out=True, elapsed=2.0), ctx)
    assert r.reason == "deadline" and "2.0s" in r.message and "dmesg" in r.message
    r = nvidia_smi.judge(gathered(None, timed_out=True, stuck=True, elapsed=2.3), ctx)
    assert r.reason == "stuck" and "SIGKILL" in r.message and "reboot the node" in r.message


def test_an_earlier_stuck_nvidia_smi_holds_back_the_next(ctx):
    r = nvidia_smi.judge(gathered(None, stuck=True, held_by=4242), ctx)
    assert r.reason == "stuck"
    assert "earlier nvidia-smi (pid 4242) is still stuck" in r.message and "not starting another" in r.message


def test_lost_gpu_while_the_other_is_still_reported(ctx):
    out = gpu_rows(1) + "Unable to determine the device handle for GPU0000:41:00.0: Unknown Error\n"
    r = nvidia_smi.judge(gathered(255, out), ctx)
    assert r.status is Status.FAIL and r.reason == "gpu-lost"
    assert "GPU 0000:41:00.0 is lost" in r.message and "1 GPU still reported" in r.message
    assert r.facts["count"] == 1 and r.observed == 1


def test_lost_gpu_message_on_stderr(ctx):
    r = nvidia_smi.judge(gathered(15, "", MESSAGES[15]), ctx)
    assert r.reason == "gpu-lost" and "no other GPU reported" in r.message


@pytest.mark.parametrize("junk", [
    "<html>proxy error</html>",
    "0, NVIDIA A100, not-a-uuid",
    "\x1b[31m\x00\x01 binary \xff",
    "index, name, uuid",
])
def test_unparseable_output_fails_with_a_safe_excerpt(ctx, junk):
    r = nvidia_smi.judge(gathered(0, gpu_rows(1) + junk + "\n"), ctx)
    assert r.status is Status.FAIL and r.reason == "unparseable"
    assert "\x1b" not in r.message and "\x00" not in r.message and "\n" not in r.message
    assert len(r.message) < 300


def test_truncated_output_is_unparseable(ctx):
    r = nvidia_smi.judge(gathered(0, "0, x" * 1000, truncated=True), ctx)
    assert r.reason == "unparseable" and len(r.message) < 300


# ---- the real probe against stub executables ----------------------------------------------------

def run_probe(budget: float = 5.0, gpu_count: int = 2):
    c = make_ctx(gpu_count=gpu_count, budget=budget)
    t0 = time.monotonic()
    r = nvidia_smi.judge(nvidia_smi.gather(c), c)
    return r, time.monotonic() - t0


def test_stub_healthy(stub_bin):
    write_stub(stub_bin, "ok", gpus=2)
    r, _ = run_probe()
    assert r.status is Status.PASS and r.observed == 2


def test_stub_one_gpu_short(stub_bin):
    write_stub(stub_bin, "ok", gpus=1)
    r, _ = run_probe(gpu_count=2)
    assert r.reason == "gpu-count"


def test_not_on_path_stub(stub_bin):
    r, _ = run_probe()
    assert r.reason == "not-found"


@pytest.mark.parametrize(("code", "reason"), [(6, "no-devices"), (9, "driver-not-loaded"),
                                              (12, "nvml-not-found"), (14, "inforom-corrupted"),
                                              (15, "gpu-lost"), (255, "nvml-unknown-error")])
def test_stub_exit_codes(stub_bin, code, reason):
    write_stub(stub_bin, "exit", code=code)
    r, _ = run_probe()
    assert r.status is Status.FAIL and r.reason == reason


def test_stub_lost_gpu(stub_bin):
    write_stub(stub_bin, "lost")
    r, _ = run_probe()
    assert r.reason == "gpu-lost" and r.facts["count"] == 1


@pytest.mark.parametrize("behaviour", ["garbage", "huge"])
def test_stub_garbage(stub_bin, behaviour):
    write_stub(stub_bin, behaviour)
    r, _ = run_probe()
    assert r.reason == "unparseable" and len(r.message) < 300


def test_stub_signal(stub_bin):
    write_stub(stub_bin, "signal")
    r, _ = run_probe()
    assert r.reason == "killed"


@pytest.mark.parametrize("behaviour", ["hang", "ignore-term"])
def test_stub_hang_returns_at_the_deadline_and_leaves_nothing(stub_bin, behaviour):
    write_stub(stub_bin, behaviour, sleep=30)
    r, took = run_probe(budget=1.0)
    assert r.status is Status.FAIL and r.reason == "deadline"
    assert took < 1.0 + 0.5
    assert_gone(started_pids(stub_bin))


def test_stub_grandchild_holding_stdout(stub_bin):
    write_stub(stub_bin, "grandchild", sleep=30)
    r, took = run_probe(budget=3.0)
    assert r.status is Status.PASS and r.observed == 2
    assert took < 3.0
    pids = started_pids(stub_bin)
    assert len(pids) == 2
    assert_gone(pids)


# ---- strange and hostile output: a miss or a clear failure, never an internal error -----------

def _raw_stub(bin_dir, body: str) -> None:
    path = bin_dir / "nvidia-smi"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _cli(bin_dir, *args: str, **env: str):
    from tests.conftest import ROOT, clean_env

    return subprocess.run([sys.executable, "-m", "probes", "--only", "nvidia-smi", *args],
                          env=clean_env(PATH=f"{bin_dir}:/usr/bin:/bin", HEALTHCHECK_STATE_DIR=str(bin_dir / "st"),
                                        **env),
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("index", ["\u00b2", "\u0663", "1\u00b9"])
def test_unicode_digits_as_an_index_are_unparseable_not_an_internal_error(stub_bin, index):
    _raw_stub(stub_bin, f"printf '{index}, NVIDIA A100, GPU-00000000-1111-2222-3333-000000000000\\n'")
    r, _ = run_probe()
    assert r.status is Status.FAIL and r.reason == "unparseable"
    res = _cli(stub_bin)
    assert res.returncode == 1 and "cannot parse nvidia-smi output" in res.stdout
    assert "internal error" not in res.stdout


def test_megabytes_on_stderr_with_a_valid_list_on_stdout_pass(stub_bin):
    rows = gpu_rows(2).replace("\n", "\\n")
    _raw_stub(stub_bin, f"head -c 5000000 /dev/zero | tr '\\0' 'w' >&2\nprintf '{rows}'")
    r, _ = run_probe()
    assert r.status is Status.PASS and r.observed == 2, r.message


def test_the_largest_accepted_gpu_count_is_read_in_full(stub_bin):
    rows = stub_bin / "rows.txt"
    rows.write_text(gpu_rows(1024, "NVIDIA H100 80GB HBM3 with a long marketing name"))
    _raw_stub(stub_bin, f"cat {rows}")
    r, _ = run_probe(gpu_count=1024)
    assert r.status is Status.PASS and r.observed == 1024, r.message
    res = _cli(stub_bin, HEALTHCHECK_GPU_COUNT="1024")
    assert res.returncode == 0 and "1024 GPUs visible" in res.stdout


def test_control_characters_in_a_gpu_name_are_made_visible_everywhere(stub_bin):
    _raw_stub(stub_bin, "printf '0, NVIDIA\\033[2J\\007\\000 A100, GPU-00000000-1111-2222-3333-000000000000\\n'")
    r, _ = run_probe(gpu_count=1)
    assert r.status is Status.PASS
    assert r.facts["gpus"][0]["name"] == "NVIDIA\\x1b[2J\\x07\\x00 A100"
    for args in ((), ("--json",), ("-v",)):
        res = _cli(stub_bin, *args, HEALTHCHECK_GPU_COUNT="1")
        assert res.returncode == 0
        assert not any(ch in res.stdout for ch in "\x00\x07\x1b"), res.stdout
        assert "NVIDIA\\x1b[2J\\x07\\x00 A100" in res.stdout.replace("\\\\", "\\")


@pytest.mark.parametrize("shebang", ["#!/opt/nowhere/bin/sh", "#!/usr/bin/python9.99"])
def test_stub_whose_interpreter_is_missing_cannot_start(stub_bin, shebang):
    stub = stub_bin / "nvidia-smi"
    stub.write_text(f"{shebang}\necho '0, x, GPU-1'\n")
    stub.chmod(0o755)
    r, _ = run_probe()
    assert r.reason == "cannot-start" and "interpreter is missing" in r.message and "not found" not in r.message
