"""checkpoint (opt-in): no process here holding a CUDA context is locked or checkpointed by CUDA
checkpoint, asked in a child under the deadline (docs/probes.md, "Deep opt-in checks"). Command-line
equivalent: ``cuda-checkpoint --get-state --pid 123``."""

from __future__ import annotations

import os
import sys
import time

from probes import deadlines, untrusted
from probes.context import Context, logger
from probes.framework import deep
from probes.result import Result, passed, verdict
from probes.spec import Spec, cause
from probes.state import process_start_time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NAME = "checkpoint"
MARKER = "checkpointed.json"
MARKER_TTL = 300.0  # seconds a marker holds GPU work back when this probe does not run again
STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}
PAUSED = "traffic paused until it is restored"

CHECKPOINTED = cause("checkpointed", "a process here holding a CUDA context is LOCKED or CHECKPOINTED "
                     "(readiness only; liveness passes, nothing latches; torch-cuda, nccl and model start no "
                     "GPU work)", "none while it is paused on purpose: traffic resumes when it is restored "
                     "(`cuda-checkpoint --toggle --pid N`)", action="none", actor="tenant")
FAILED = cause("checkpoint-failed", "the driver reports a process's checkpoint or restore FAILED",
               "restore it again (`cuda-checkpoint --toggle --pid N`) or restart that process; if that "
               "fails, restart the container", action="restart-app", actor="tenant")
HANG = cause("query-hang", "the driver's state query gave no answer by the deadline (it blocks while a peer "
             "process is locked)", "check `cuda-checkpoint --get-state` on each process; wait for the "
             "restore", action="retry", actor="tenant")
NO_API = cause("no-checkpoint-api", "driver without `cuCheckpointProcessGetState` (before 555) or no "
               "`libcuda.so.1`: not judged (a pass, so the GPU probes that wait for this one still run)",
               "none", "pass", action="none", actor="tenant")
QUERY_FAILED = cause("query-failed", "the child could not ask the driver (`cuInit` failed, or unreadable "
                     "output)", "check `nvidia-smi`; details in the log", action="fix-config",
                     actor="operator")

SPEC = Spec(
    NAME, layer="framework", module=__name__, toggle="ENABLE_CHECKPOINT_CHECK", timeout=5.0,
    profiles=("startup", "readiness"), requires=("nvml",), measurement="processes", default_on=False,
    about="no CUDA process here is locked or checkpointed by CUDA checkpoint (opt-in; driver 555+)",
    causes=(CHECKPOINTED, FAILED, HANG, NO_API, QUERY_FAILED),
)


def local_pids(ctx: Context) -> list[int]:
    """Processes here (never this one) holding a CUDA context: NVML's compute processes by NSpid, and,
    since NVML in a container often reports host PIDs, those with a GPU device node open."""
    from probes.hardware import common as hw

    seen = hw.seen(ctx.results)
    wanted = {pid for g in seen.gpus for pid, _, _ in g.processes} if seen is not None else set()
    found = []
    for pid in (int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != os.getpid()):
        try:
            raw = untrusted.read_regular(f"/proc/{pid}/status", 16384)[0] if wanted else b""
        except (untrusted.Refused, ValueError):
            raw = b""
        nspid = [v for line in raw.decode("ascii", "replace").splitlines() if line.startswith("NSpid:")
                 for v in line.split()[1:]]
        if wanted.intersection(int(v) for v in nspid if v.isdigit()) or _holds_gpu(pid):
            found.append(pid)
    return sorted(found)[:64]


def _holds_gpu(pid: int) -> bool:
    import re

    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if re.fullmatch(r"/dev/nvidia\d+", os.readlink(f"/proc/{pid}/fd/{fd}")):
                return True
        except OSError:
            continue
    return False


_REPORT = {"v": "int", "loaded": "bool", "driver": "int?", "api": "bool", "init": "int?",
           "states": [{"pid": "int", "rc": "int", "state": "int?"}]}


def parse_output(stdout: bytes) -> dict[str, Any] | None:
    from probes.framework import checkpoint_child

    try:
        report = deep.result(stdout, checkpoint_child.PREFIX)
        deep.fields(report, _REPORT, "result")
    except deep.Bad:
        return None
    return report if report["v"] == checkpoint_child.SCHEMA else None


def _mark(ctx: Context, held: list[int]) -> None:
    if held:
        ctx.state.write_json(MARKER, {"time": time.time(),
                                      "pids": [[p, process_start_time(p)] for p in held]})
    else:
        ctx.state.remove(MARKER)


def gather(ctx: Context) -> dict[str, Any]:
    from probes import proc
    from probes.framework import checkpoint_child

    pids = local_pids(ctx)
    if not pids:
        _mark(ctx, [])
        return {"kind": "none"}
    done = proc.run([sys.executable, checkpoint_child.__file__, *map(str, pids)], env=dict(os.environ),
                    deadline=ctx.deadline - deadlines.MARGIN, state=ctx.state, key=NAME,
                    until=lambda out: deep.arrived(out, checkpoint_child.PREFIX))
    report = parse_output(done.stdout)
    if report is None:
        logger().info("checkpoint child rc=%s timed_out=%s stderr: %s", done.returncode, done.timed_out,
                      untrusted.squeeze(done.stderr[-1000:], 300))
    # The pid whose query was in progress when the child was ended (it marks each on stderr first).
    asked = deep.last_phase(done.stderr, checkpoint_child.QUERY, r"\d{1,10}")
    data: dict[str, Any] = {"kind": "child", "pids": pids, "report": report,
                            "timed_out": done.timed_out or done.stuck, "returncode": done.returncode,
                            "asked": None if asked is None else int(asked)}
    if report is not None and report["api"] and report["init"] == 0:
        _mark(ctx, [s["pid"] for s in report["states"] if s["rc"] == 0 and s["state"] in (1, 2)])
    elif data["timed_out"] and data["asked"] is not None:
        _mark(ctx, [data["asked"]])
    return data


def hold(ctx: Context) -> str | None:
    """Why GPU work must not start now: this run's checkpoint result, else an earlier run's marker while
    it is younger than MARKER_TTL and that very process still exists; None to go ahead."""
    res = ctx.results.get(NAME)
    if res is not None:
        return res.message if res.reason in (CHECKPOINTED.reason, HANG.reason) else None
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
    return verdict(NAME, HANG, "no answer within the deadline: the driver's checkpoint "
                   "state query hangs (it blocks while a process is locked)")


def judge(data: dict[str, Any], ctx: Context) -> Result:
    if data["kind"] == "none":
        return passed(NAME, "no process here holds a CUDA context", observed=0, unit="processes")
    pids, report = data["pids"], data["report"]
    if report is None:
        if data["timed_out"]:
            who = f" for process {data['asked']}" if data.get("asked") is not None else ""
            return verdict(NAME, HANG, f"the driver's checkpoint state query{who} gave no "
                           f"answer by the deadline: a process is probably locked for a checkpoint; {PAUSED}",
                           facts={"pids": pids})
        return verdict(NAME, QUERY_FAILED, "the checkpoint query child gave no readable "
                       f"answer (exit status {data.get('returncode')})")
    if not report["loaded"] or not report["api"]:
        why = ("no libcuda.so.1" if not report["loaded"] else
               f"driver {_driver(report['driver'])} has no cuCheckpointProcessGetState (555+)")
        # A pass, not a skip: the probes that wait for this one must still run.
        return verdict(NAME, NO_API, f"not judged: {why}", remedy=False)
    if report["init"] != 0:
        return verdict(NAME, QUERY_FAILED, f"cuInit failed (CUresult {report['init']}) in the checkpoint "
                       "query")
    seen = {s["pid"]: STATES.get(s["state"], f"state {s['state']}") for s in report["states"] if s["rc"] == 0}
    facts = {"pids": pids, "states": {str(k): v for k, v in seen.items()}}
    bad = [(p, st) for p, st in seen.items() if st != "running"]
    failed = [p for p, st in bad if st not in ("locked", "checkpointed")]
    if failed:
        pid = failed[0]
        this = FAILED._replace(remedy=FAILED.remedy.replace("--pid N", f"--pid {pid}"))
        return verdict(NAME, this, f"process {pid}'s CUDA checkpoint or restore failed ({seen[pid]})",
                       observed=len(seen), unit="processes", facts=facts)
    if bad:
        pid, st = bad[0]
        what = "CUDA-checkpointed" if st == "checkpointed" else "CUDA-locked for a checkpoint"
        more = f" (and {len(bad) - 1} other process(es))" if len(bad) > 1 else ""
        return verdict(NAME, CHECKPOINTED, f"process {pid} is {what}{more}: {PAUSED}", remedy=False,
                       observed=len(seen), unit="processes", facts=facts)
    return passed(NAME, f"{len(seen)} CUDA process(es) running, none locked or checkpointed (driver "
                  f"{_driver(report['driver'])})", observed=len(seen), unit="processes", facts=facts)


def _driver(version: int | None) -> str:
    return "?" if version is None else f"CUDA {version // 1000}.{version % 1000 // 10}"
