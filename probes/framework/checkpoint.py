"""checkpoint: no process here that holds a CUDA context is locked or checkpointed by CUDA
checkpoint (driver 555+; docs/probes.md, "Deep opt-in checks"). A child (``checkpoint_child.py``)
asks the driver under the deadline: the query can hang while a peer process is locked.

Command-line equivalent::

    cuda-checkpoint --get-state --pid 123
"""

from __future__ import annotations

import os
import sys
import time

from probes import deadlines, untrusted
from probes import framework as fw
from probes.context import Context, logger
from probes.framework import protocol
from probes.result import Result, passed, verdict
from probes.state import process_start_time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any


CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoint_child.py")
MARKER = "checkpointed.json"
MARKER_TTL = 300.0  # seconds a marker holds GPU work back when this probe does not run again
MAX_PIDS = 64
STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}
_GPU_NODE = r"/dev/nvidia\d+"

PAUSED = "traffic paused until it is restored"
SPEC = fw.CHECKPOINT_SPEC


# ---------------------------------------------------------------------------
# Which processes hold a CUDA context here
# ---------------------------------------------------------------------------

def nvml_pids(ctx: Context) -> set[int]:
    """PIDs of the compute processes the nvml probe saw (any namespace: NVML's view)."""
    from probes import hardware

    seen = hardware.seen(ctx.results)
    return {pid for g in seen.gpus for pid, _, _ in g.processes} if seen is not None else set()


def _nspid(pid: int) -> list[int]:
    try:
        raw, _ = untrusted.read_regular(f"/proc/{pid}/status", 16384)
    except (untrusted.Refused, ValueError):
        return []
    for line in raw.decode("ascii", "replace").splitlines():
        if line.startswith("NSpid:"):
            return [int(v) for v in line.split()[1:] if v.isdigit()]
    return []


def _holds_gpu(pid: int) -> bool:
    import re

    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if re.fullmatch(_GPU_NODE, os.readlink(f"/proc/{pid}/fd/{fd}")):
                return True
        except OSError:
            continue
    return False


def local_pids(wanted: Iterable[int]) -> list[int]:
    """Processes of this PID namespace that hold a CUDA context: those whose NSpid contains a
    pid NVML reported, and, since NVML in a container often reports host PIDs, those with a GPU
    device node open. Never this process."""
    wanted = set(wanted)
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        if (wanted and wanted.intersection(_nspid(pid))) or _holds_gpu(pid):  # no status read for nothing
            found.append(pid)
    return sorted(found)[:MAX_PIDS]


# ---------------------------------------------------------------------------
# gather
# ---------------------------------------------------------------------------

_REPORT = {"v": (protocol.INT, False), "loaded": (protocol.BOOL, False), "driver": (protocol.INT, True),
           "api": (protocol.BOOL, False), "init": (protocol.INT, True)}
_STATE = {"pid": (protocol.INT, False), "rc": (protocol.INT, False), "state": (protocol.INT, True)}


def _valid(report: Any) -> dict[str, Any]:
    """The child's report if it matches the schema exactly; raises protocol.Bad otherwise."""
    from probes.framework import checkpoint_child

    protocol.fields(report, _REPORT, "result", nested=("states",))
    if report["v"] != checkpoint_child.SCHEMA or not isinstance(report["states"], list):
        raise protocol.Bad("the result is for another request")
    for i, state in enumerate(report["states"]):
        protocol.fields(state, _STATE, f"result.states[{i}]")
    return report


def parse_output(stdout: bytes) -> dict[str, Any] | None:
    from probes.framework import checkpoint_child

    try:
        return _valid(protocol.result(stdout, checkpoint_child.PREFIX))
    except protocol.Bad:
        return None


def _asked(stderr: bytes) -> int | None:
    """The pid whose query was in progress when the child was ended."""
    last = None
    for line in stderr.decode("ascii", "replace").splitlines():
        if line.startswith("HEALTHCHECK-CHECKPOINT-QUERY ") and line.split()[-1].isdigit():
            last = int(line.split()[-1])
    return last


def _mark(ctx: Context, held: list[int]) -> None:
    if held:
        ctx.state.write_json(MARKER, {"time": time.time(),
                                      "pids": [[p, process_start_time(p)] for p in held]})
    else:
        ctx.state.remove(MARKER)


def _answered(out: bytes) -> bool:
    from probes.framework import checkpoint_child

    return protocol.arrived(out, checkpoint_child.PREFIX)


def gather(ctx: Context) -> dict[str, Any]:
    from probes import proc

    pids = local_pids(nvml_pids(ctx))
    if not pids:
        _mark(ctx, [])
        return {"kind": "none"}
    deadline = ctx.deadline - deadlines.MARGIN
    done = proc.run([sys.executable, CHILD, *map(str, pids)], deadline=deadline, env=dict(os.environ),
                    state=ctx.state, key=SPEC.name, until=_answered)
    report = parse_output(done.stdout)
    if report is None:
        logger().info("checkpoint child rc=%s timed_out=%s stderr: %s", done.returncode, done.timed_out,
                      untrusted.squeeze(done.stderr[-1000:], 300))
    data: dict[str, Any] = {"kind": "child", "pids": pids, "report": report,
                            "timed_out": done.timed_out or done.stuck, "asked": _asked(done.stderr),
                            "returncode": done.returncode}
    if report is not None and report["api"] and report["init"] == 0:
        _mark(ctx, [s["pid"] for s in report["states"] if s["rc"] == 0 and s["state"] in (1, 2)])
    elif data["timed_out"] and data["asked"] is not None:
        _mark(ctx, [data["asked"]])
    return data


def hold(ctx: Context) -> str | None:
    """Why GPU work must not start now (a process here is locked or checkpointed), or None.

    From this run's checkpoint result when it ran, else from the marker an earlier run left
    (honoured for MARKER_TTL seconds, and only while that very process still exists)."""
    res = ctx.results.get(SPEC.name)
    if res is not None:
        return res.message if res.reason in (fw.CHECKPOINTED.reason, fw.CHECKPOINT_HANG.reason) else None
    marker = ctx.state.read_json(MARKER)
    if not marker:
        return None
    when, pids = marker.get("time"), marker.get("pids")
    if not isinstance(when, (int, float)) or not 0 <= time.time() - float(when) < MARKER_TTL:
        return None
    for item in pids if isinstance(pids, list) else ():
        if (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int) and item[1] is not None
                and process_start_time(item[0]) == item[1]):
            return f"process {item[0]} is CUDA-checkpointed: {PAUSED}"
    return None


def on_deadline(ctx: Context) -> Result:
    return verdict(SPEC.name, fw.CHECKPOINT_HANG, "no answer within the deadline: the driver's checkpoint "
                   "state query hangs (it blocks while a process is locked)")


# ---------------------------------------------------------------------------
# judge: pure
# ---------------------------------------------------------------------------

def judge(data: dict[str, Any], ctx: Context) -> Result:
    if data["kind"] == "none":
        return passed(SPEC.name, "no process here holds a CUDA context", observed=0, unit="processes")
    pids, report = data["pids"], data["report"]
    if report is None:
        if data["timed_out"]:
            who = f" for process {data['asked']}" if data.get("asked") is not None else ""
            return verdict(SPEC.name, fw.CHECKPOINT_HANG, f"the driver's checkpoint state query{who} gave no "
                           f"answer by the deadline: a process is probably locked for a checkpoint; {PAUSED}",
                           facts={"pids": pids})
        return verdict(SPEC.name, fw.CHECKPOINT_QUERY_FAILED, "the checkpoint query child gave no readable "
                       f"answer (exit status {data.get('returncode')})")
    if not report["loaded"] or not report["api"]:
        why = ("no libcuda.so.1" if not report["loaded"] else
               f"driver {_driver(report['driver'])} has no cuCheckpointProcessGetState (555+)")
        # A pass, not a skip: the probes that wait for this one must still run.
        return verdict(SPEC.name, fw.CHECKPOINT_NO_API, f"not judged: {why}", remedy=False)
    if report["init"] != 0:
        return verdict(SPEC.name, fw.CHECKPOINT_QUERY_FAILED,
                       f"cuInit failed (CUresult {report['init']}) in the checkpoint query")
    seen = {s["pid"]: STATES.get(s["state"], f"state {s['state']}") for s in report["states"] if s["rc"] == 0}
    facts = {"pids": pids, "states": {str(k): v for k, v in seen.items()}}
    bad = [(p, st) for p, st in seen.items() if st != "running"]
    failed = [p for p, st in bad if st not in ("locked", "checkpointed")]
    if failed:
        pid, cause = failed[0], fw.CHECKPOINT_FAILED
        this = cause._replace(remedy=cause.remedy.replace("--pid N", f"--pid {pid}"))
        return verdict(SPEC.name, this, f"process {pid}'s CUDA checkpoint or restore failed ({seen[pid]})",
                       observed=len(seen), unit="processes", facts=facts)
    if bad:
        pid, st = bad[0]
        what = "CUDA-checkpointed" if st == "checkpointed" else "CUDA-locked for a checkpoint"
        more = f" (and {len(bad) - 1} other process(es))" if len(bad) > 1 else ""
        return verdict(SPEC.name, fw.CHECKPOINTED, f"process {pid} is {what}{more}: {PAUSED}", remedy=False,
                       observed=len(seen), unit="processes", facts=facts)
    return passed(SPEC.name, f"{len(seen)} CUDA process(es) running, none locked or checkpointed (driver "
                  f"{_driver(report['driver'])})", observed=len(seen), unit="processes", facts=facts)


def _driver(version: int | None) -> str:
    return "?" if version is None else f"CUDA {version // 1000}.{version % 1000 // 10}"
