"""The model probe with the real CPU torch: real model files made here, loaded by the real worker."""

from __future__ import annotations

import json
import os
import pickle
import struct
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from probes import config as config_mod
from probes.config import Config
from probes.context import Context
from probes.framework import deep, model, model_worker
from probes.result import Result, Status
from probes.state import State

from .conftest import REAL_PYTHON


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) + 1.0


def run_probe(tmp_path: Path, path: object, *, python: object = REAL_PYTHON, profile: str = "readiness",
              timeout: float = 60.0, results: dict[str, Result] | None = None,
              **settings: Any) -> tuple[Result, dict[str, Any]]:
    cfg = Config()._replace(profile=profile, torch_python=str(python), torch_device="cpu",
                              model_path=None if path is None else str(path), **settings)
    ctx = Context(cfg, time.monotonic() + timeout, dict(results or {}), State.open(str(tmp_path / "state")))
    data = model.gather(ctx)
    return model.judge(data, ctx), data


@pytest.fixture
def scripted(tmp_path: Path) -> tuple[Path, torch.Tensor]:
    torch.manual_seed(1)
    net = torch.jit.script(Net())
    path = tmp_path / "net.pt"
    net.save(str(path))
    with torch.no_grad():
        out = net(torch.zeros(2, 4))
    return path, out


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).flatten().tolist() if t.numel() else []
        data = bytes(raw)
        header[name] = {"dtype": {torch.float32: "F32", torch.float16: "F16"}[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def test_torchscript_loads_and_matches_expected_output(tmp_path: Path, scripted: tuple[Path, torch.Tensor]) -> None:
    path, out = scripted
    expect = tmp_path / "expect.pt"
    torch.save(out, str(expect))
    result, data = run_probe(tmp_path, path, model_input="2x4:float32", model_expect=str(expect))
    assert result.status is Status.PASS, result.message
    report = data["report"]
    assert report["format"] == "torchscript" and report["loader"] == "torch.jit.load"
    assert report["params"] == 4 * 3 + 3 and report["param_bytes"] == 15 * 4
    assert report["forward_ms"] is not None and report["max_err"] == 0.0
    assert "15 parameters" in result.message and "matches the expected output" in result.message
    assert result.unit == "ms" and result.observed == report["load_ms"]


def test_safetensors_loads_without_the_package(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    w = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    write_safetensors(path, {"w": w, "b": torch.ones(5, dtype=torch.float16)})
    result, data = run_probe(tmp_path, path)
    assert result.status is Status.PASS, result.message
    report = data["report"]
    assert report["format"] == "safetensors"
    assert report["loader"] in ("frombuffer", "safetensors")
    assert report["params"] == 11 and report["param_bytes"] == 6 * 4 + 5 * 2 == report["bytes"]


def test_state_dict_loads_with_weights_only(tmp_path: Path) -> None:
    path = tmp_path / "sd.pt"
    torch.save(torch.nn.Linear(8, 2).state_dict(), str(path))
    result, data = run_probe(tmp_path, path)
    assert result.status is Status.PASS, result.message
    assert data["report"]["format"] == "state-dict" and data["report"]["loader"] == "torch.load"
    assert data["report"]["params"] == 18


@pytest.mark.parametrize("kind", ["torchscript", "safetensors", "state-dict"])
def test_truncated_file_is_corrupt(tmp_path: Path, scripted: tuple[Path, torch.Tensor], kind: str) -> None:
    if kind == "torchscript":
        src = scripted[0]
    elif kind == "safetensors":
        src = tmp_path / "w.safetensors"
        write_safetensors(src, {"w": torch.ones(64)})
    else:
        src = tmp_path / "sd.pt"
        torch.save(torch.nn.Linear(8, 2).state_dict(), str(src))
    cut = tmp_path / f"cut-{kind}"
    data = src.read_bytes()
    cut.write_bytes(data[: len(data) - 40])
    result, _ = run_probe(tmp_path, cut)
    assert result.status is Status.FAIL and result.reason == "model-corrupt", result.message


class Planted:
    """Unpickling this would create the marker file: a model file that runs code when loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_pickle_that_would_run_code_is_refused(tmp_path: Path, how: str) -> None:
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pt"
    payload = {"weight": torch.ones(2), "x": Planted(marker)}
    if how == "pickle":
        path.write_bytes(pickle.dumps(payload, protocol=2))
    else:
        torch.save(payload, str(path))
    assert not marker.exists()
    result, _ = run_probe(tmp_path, path)
    assert result.status is Status.FAIL and result.reason == "unsafe-pickle", result.message
    assert not marker.exists()


def test_output_mismatch_fails(tmp_path: Path, scripted: tuple[Path, torch.Tensor]) -> None:
    path, out = scripted
    expect = tmp_path / "expect.pt"
    torch.save(out * 1.01, str(expect))
    result, _ = run_probe(tmp_path, path, model_input="2x4:float32", model_expect=str(expect))
    assert result.status is Status.FAIL and result.reason == "output-mismatch", result.message
    # within a looser tolerance the same output passes
    result, _ = run_probe(tmp_path, path, profile="startup", model_input="2x4:float32",
                          model_expect=str(expect), model_tolerance=0.05)
    assert result.status is Status.PASS, result.message


def test_output_of_another_shape_fails(tmp_path: Path, scripted: tuple[Path, torch.Tensor]) -> None:
    path, _ = scripted
    expect = tmp_path / "expect.pt"
    torch.save(torch.zeros(3, 3), str(expect))
    result, _ = run_probe(tmp_path, path, model_input="2x4:float32", model_expect=str(expect))
    assert result.status is Status.FAIL and result.reason == "output-mismatch", result.message


def test_model_larger_than_the_budget_is_not_loaded(tmp_path: Path) -> None:
    path = tmp_path / "sd.pt"
    torch.save({"w": torch.ones(1000)}, str(path))
    result, data = run_probe(tmp_path, path, model_max_bytes=1000)
    assert result.status is Status.FAIL and result.reason == "would-not-fit", result.message
    assert data["report"]["load_ms"] is None  # said before trying
    assert "HEALTHCHECK_MODEL_MAX_BYTES" in result.message and "3.9 KiB" in result.message


def test_missing_unreadable_and_unsupported(tmp_path: Path) -> None:
    result, _ = run_probe(tmp_path, tmp_path / "nope.pt")
    assert result.reason == "model-missing" and result.status is Status.FAIL
    result, _ = run_probe(tmp_path, tmp_path)
    assert result.reason == "model-unreadable"
    text = tmp_path / "notes.txt"
    text.write_text("not a model\n")
    result, _ = run_probe(tmp_path, text)
    assert result.reason == "unsupported-format", result.message
    if os.geteuid() != 0:
        locked = tmp_path / "locked.pt"
        torch.save({"w": torch.ones(1)}, str(locked))
        locked.chmod(0)
        result, _ = run_probe(tmp_path, locked)
        assert result.reason == "model-unreadable"


def test_forward_needs_torchscript(tmp_path: Path) -> None:
    path = tmp_path / "sd.pt"
    torch.save({"w": torch.ones(3)}, str(path))
    result, _ = run_probe(tmp_path, path, model_input="1x3:float32")
    assert result.reason == "bad-input"


def test_readiness_reuses_a_pass_and_startup_runs_fresh(tmp_path: Path, make_interp: Any) -> None:
    interp = make_interp("py")
    path = tmp_path / "sd.pt"
    torch.save({"w": torch.ones(3)}, str(path))
    first, _ = run_probe(tmp_path, path, python=interp)
    second, data = run_probe(tmp_path, path, python=interp)
    assert first.status is second.status is Status.PASS
    assert interp.starts == 1 and data["cache"]["how"] == "ttl" and "cached" in second.message
    run_probe(tmp_path, path, python=interp, profile="startup")
    assert interp.starts == 2
    # a changed file is another model: the cached pass does not apply
    torch.save({"w": torch.ones(4)}, str(path))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    third, _ = run_probe(tmp_path, path, python=interp)
    assert interp.starts == 3 and third.facts["params"] == 4


def test_failure_is_not_reused(tmp_path: Path, make_interp: Any) -> None:
    interp = make_interp("py")
    run_probe(tmp_path, tmp_path / "nope.pt", python=interp)
    run_probe(tmp_path, tmp_path / "nope.pt", python=interp)
    assert interp.starts == 2


def test_hanging_worker_ends_by_the_deadline(tmp_path: Path, make_interp: Any, marker: Any) -> None:
    interp = make_interp("hang", body='trap "" TERM; sleep 300 & sleep 300; wait')
    path = tmp_path / "sd.pt"
    torch.save({"w": torch.ones(3)}, str(path))
    start = time.monotonic()
    result, _ = run_probe(tmp_path, path, python=interp, timeout=2.0)
    assert time.monotonic() - start < 8
    assert result.status is Status.FAIL and result.reason == "deadline", result.message
    assert marker() == []


def test_off_by_default_and_on_with_a_path(tmp_path: Path) -> None:
    env = {"HEALTHCHECK_CHECKS_DIR": str(tmp_path / "none")}
    off = config_mod.load(env)
    assert "model" not in [s.name for s in off.selected()]
    on = config_mod.load({**env, "HEALTHCHECK_MODEL_PATH": "/models/m.pt"})
    assert "model" in [s.name for s in on.selected()]
    assert on.toggles["ENABLE_MODEL_CHECK"] is True
    vetoed = config_mod.load({**env, "HEALTHCHECK_MODEL_PATH": "/m.pt", "ENABLE_MODEL_CHECK": "false"})
    assert "model" not in [s.name for s in vetoed.selected()]
    live = config_mod.load({**env, "HEALTHCHECK_MODEL_PATH": "/m.pt", "HEALTHCHECK_PROFILE": "liveness"})
    assert "model" not in [s.name for s in live.selected()]
    assert "model" not in [s.name for s in Config().selected()]
    with pytest.raises(config_mod.ConfigError):
        config_mod.load({**env, "HEALTHCHECK_MODEL_MAX_BYTES": "-1"})


def test_worker_result_is_validated(tmp_path: Path) -> None:
    good = {"v": model_worker.SCHEMA, "device": "cpu", "torch": "2", "format": "state-dict", "loader": "torch.load",
            "file_bytes": 1, "bytes": 1, "budget": 2, "budget_source": "x", "load_ms": 1.0, "params": 1,
            "param_bytes": 4, "peak_gpu": None, "forward_ms": None, "max_err": None, "scale": None,
            "error": None}
    def parse(report: dict[str, Any], device: str = "cpu") -> tuple[Any, str | None]:
        line = (model_worker.PREFIX + json.dumps(report) + "\n").encode()
        return deep.parse(line, model_worker.PREFIX, lambda r: model.validate(r, device))

    assert parse(good)[0] is not None
    assert parse(good, "cuda")[0] is None
    for bad in ({**good, "params": "1"}, {**good, "extra": 1}, {**good, "format": "onnx"},
                {**good, "error": {"kind": "rm -rf", "type": "x", "message": "y"}}):
        report, problem = parse(bad)
        assert report is None and problem
    report, _ = parse({**good, "torch": "2\x1b[31m"})
    assert report is not None and "\x1b" not in report["torch"]


@pytest.mark.gpu
def test_torchscript_loads_and_runs_on_the_gpu(tmp_path: Path, scripted: tuple[Path, torch.Tensor]) -> None:
    if not torch.cuda.is_available():  # a stub nvidia-smi (make gpu-verify FAKE=1) passes the marker's check
        pytest.skip("needs CUDA: this torch has no GPU")
    path, out = scripted
    expect = tmp_path / "expect.pt"
    torch.save(out, str(expect))
    cfg = Config()._replace(profile="startup", torch_python=REAL_PYTHON, torch_device="cuda",
                            model_path=str(path), model_input="2x4:float32", model_expect=str(expect))
    ctx = Context(cfg, time.monotonic() + 120, {}, State.open(str(tmp_path / "state")))
    data = model.gather(ctx)
    result = model.judge(data, ctx)
    assert result.status is Status.PASS, result.message
    report = data["report"]
    assert report["peak_gpu"] and report["peak_gpu"] > 0 and report["budget_source"] == "free GPU memory"
    assert "peak GPU memory" in result.message


# ---------------------------------------------------------------- special files, exception texts, the input setting

def special_files(tmp_path: Path) -> dict[str, Path]:
    import socket

    fifo = tmp_path / "fifo.pt"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock.pt"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))  # left bound: the file stays a socket for the test's life
    return {"fifo": fifo, "socket": sock_path, "device": Path("/dev/zero")}


def test_a_special_file_as_the_model_is_refused_at_once(tmp_path: Path) -> None:
    for what, path in special_files(tmp_path).items():
        start = time.monotonic()
        result, data = run_probe(tmp_path, path, profile="startup", timeout=15.0)
        assert time.monotonic() - start < 10, f"{what}: waited on it"
        assert (result.status, result.reason) == (Status.FAIL, "model-unreadable"), (what, result.message)
        assert "not a regular file (a FIFO, socket or device)" in result.message
        assert data["report"]["format"] is None  # nothing was read from it


def test_a_special_file_as_the_expected_output_is_refused_before_the_model_loads(
        tmp_path: Path, scripted: tuple[Path, torch.Tensor]) -> None:
    path, _ = scripted
    for what, expect in special_files(tmp_path).items():
        start = time.monotonic()
        result, data = run_probe(tmp_path, path, profile="startup", timeout=15.0, model_input="2x4:float32",
                                 model_expect=str(expect))
        assert time.monotonic() - start < 10, f"{what}: waited on it"
        assert (result.status, result.reason) == (Status.FAIL, "expect-unreadable"), (what, result.message)
        assert "not a regular file" in result.message and data["report"]["load_ms"] is None


class LogLines(list):
    """The suite's log lines during a test (probes.context.logger has no handler of its own)."""

    def __enter__(self) -> LogLines:
        import logging

        from probes.context import logger

        self.handler = logging.Handler()
        self.handler.emit = lambda record: self.append(record.getMessage())  # type: ignore[method-assign]
        self.level = logger().level
        logger().addHandler(self.handler)
        logger().setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        from probes.context import logger

        logger().removeHandler(self.handler)
        logger().setLevel(self.level)


def test_exception_texts_go_to_the_log_never_to_the_output(tmp_path: Path,
                                                          scripted: tuple[Path, torch.Tensor]) -> None:
    path, _ = scripted
    unsafe = tmp_path / "expect-with-code.pt"  # torch.load's refusal: a long text with a URL, maybe escapes
    torch.save({"x": Planted(tmp_path / "code-ran")}, str(unsafe))
    loop = tmp_path / "loop.pt"  # an errno text: "Too many levels of symbolic links"
    loop.symlink_to(loop)
    cut = tmp_path / "cut.pt"  # the legacy reader's own words
    torch.save(torch.nn.Linear(8, 2).state_dict(), str(cut), _use_new_zipfile_serialization=False)
    cut.write_bytes(cut.read_bytes()[:-40])
    cases = [({"model_input": "2x4:float32", "model_expect": str(unsafe)}, path, "expect-unreadable", "Weights only"),
             ({}, loop, "model-unreadable", "Too many levels of symbolic links"),
             ({}, cut, "model-corrupt", "unexpected EOF")]
    for settings, model_path, reason, detail in cases:
        with LogLines() as log:
            result, _ = run_probe(tmp_path, model_path, profile="startup", **settings)
        assert result.reason == reason, result.message
        for text in (detail, "weights_only", "\\x1b", "\x1b", "http", "Error"):
            assert text not in result.message, result.message
        assert any(detail in line for line in log), (detail, log)
    assert not (tmp_path / "code-ran").exists()


def test_the_workers_own_phrases_are_the_only_messages_it_names_itself() -> None:
    import ast

    tree = ast.parse(Path(model_worker.__file__).read_text())
    said = [node.args[1].value for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "Failure" and len(node.args) == 2
            and isinstance(node.args[1], ast.Constant)]
    assert said and set(said) <= set(model_worker.PHRASES), set(said) - set(model_worker.PHRASES)


BAD_INPUTS = ["-1x4:float32", "\u0661x\u0664:float32", "\u00b2x4:float32", "2x4:float32:ones", "2x4:float32:",
              "2x4", "2x0:float32", "2x4:complex64", "2x4:float32:zeros:more", "1x1x1x1x1x1x1x1x1:float32",
              "1234567890x4:float32", " :float32"]


def test_a_bad_model_input_is_a_configuration_error_with_one_line() -> None:
    for raw in BAD_INPUTS:
        with pytest.raises(config_mod.ConfigError) as err:
            config_mod.load({"HEALTHCHECK_MODEL_INPUT": raw, "HEALTHCHECK_CHECKS_DIR": "/nonexistent"})
        text = str(err.value)
        assert text.startswith("HEALTHCHECK_MODEL_INPUT=") and "is not SHAPE:DTYPE" in text and "\n" not in text, text
        assert "accepted: e.g. 1x3x224x224:float16" in text and len(text) < 400
    ok = config_mod.load({"HEALTHCHECK_MODEL_INPUT": " 2X4:float16:seeded ", "HEALTHCHECK_CHECKS_DIR": "/nonexistent"})
    assert ok.of(model.Settings).model_input == "2X4:float16:seeded"


def test_the_cli_refuses_a_bad_model_input_with_exit_3(tmp_path: Path) -> None:
    from tests.conftest import clean_env, run_cli

    for raw in ("-1x4:float32", "\u0663x4:float32", "2x4:float32:ones"):
        out = run_cli(env=clean_env(HEALTHCHECK_MODEL_PATH=str(tmp_path / "m.pt"), HEALTHCHECK_MODEL_INPUT=raw,
                                    HEALTHCHECK_STATE_DIR=str(tmp_path / "state")))
        assert out.returncode == 3 and out.stdout == "" and out.stderr.count("\n") == 1, out.stdout + out.stderr
        assert "HEALTHCHECK_MODEL_INPUT=" in out.stderr and "Traceback" not in out.stderr


def test_the_worker_reads_only_ascii_digits_and_takes_a_leading_dash_as_the_inputs() -> None:
    for raw in ("\u0663x4:float32", "\u00b2x4:float32"):
        with pytest.raises(model_worker.Failure):
            model_worker.parse_input(raw)
    args = model_worker.parse_args(["--path=/m.pt", "--input=-1x4:float32", "--expect=-e.pt"])
    assert (args.input, args.expect) == ("-1x4:float32", "-e.pt")
    with pytest.raises(model_worker.Failure):
        model_worker.parse_input(args.input)


def test_a_sticky_cuda_error_known_only_by_its_number_latches(tmp_path: Path, make_interp: Any) -> None:
    """torch 2.8+ names a CUDA error by ``error_code``; a message the table does not know (cut, or
    reworded) leaves the number as the only evidence, and it must reach the judge as a number."""
    report = {"v": model_worker.SCHEMA, "device": "cpu", "torch": "2.9", "format": "state-dict",
              "loader": "torch.load", "file_bytes": 1, "bytes": 1, "budget": 2, "budget_source": "x",
              "load_ms": None, "params": None, "param_bytes": None, "peak_gpu": None, "forward_ms": None,
              "max_err": None, "scale": None,
              "error": {"kind": "forward", "type": "AcceleratorError", "message": "the forward pass failed",
                        "code": 700}}
    line = tmp_path / "line"
    line.write_text(model_worker.PREFIX + json.dumps(report) + "\n")
    interp = make_interp("sticky", body=f'cat "{line}"')
    path = tmp_path / "sd.pt"
    torch.save({"w": torch.ones(3)}, str(path))
    result, data = run_probe(tmp_path, path, python=interp)
    assert data["report"]["error"]["code"] == 700
    assert result.status is Status.FAIL and result.reason == "cuda-fatal", result.message
    latch = State.open(str(tmp_path / "state")).latch()
    assert latch is not None and latch["source"] == "model", latch
