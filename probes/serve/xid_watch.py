"""The NVML event watcher child of `healthcheck serve`: one JSON line per Xid or ECC event.

It runs in its own process (and session) because an NVML call can hang in a wedged
driver: then only this child is stuck, and the server, which reads our stdout, keeps
answering. Xid events are seen only while a process is registered for them, so this
watcher runs for as long as the server does.

Lines on stdout (one JSON object each):
  {"type": "started"}     (NVML is initialised and the GPUs are registered for events: watching)
  {"type": "event", "gpu": 0, "uuid": "GPU-...", "kind": "xid", "data": 79, "time": ...}
      (kind: "xid" | "ecc-single" | "ecc-double" | "slowdown"; data: the Xid number, NVML's event
      data, or for "slowdown" (one per reading with HW slowdown or power brake active, with
      --sample-s) the clock event reasons)
  {"type": "unavailable", "reason": "nvml-not-found", "message": "<one safe line with the remedy>"}
  {"type": "error", "reason": "nvml-error"}     (a failure while watching; the server restarts us)
Details of errors go to stderr (the server's log).

Command-line equivalent: ``python -m probes.serve.xid_watch --wait-ms 500 --sample-s 60``.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("healthcheck.xid_watch")


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="xid_watch", description="Print NVML Xid/ECC events as JSON lines.")
    ap.add_argument("--wait-ms", type=int, default=500, help="NVML wait per loop (stop latency)")
    ap.add_argument("--sample-s", type=float, default=0.0,
                    help="read clock event reasons this often and print slowdown events (0: off)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(levelname)s %(name)s %(message)s")
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        from probes.hardware import nvml_lib
    except Exception:
        log.exception("cannot import the NVML layer")
        emit({"type": "unavailable", "reason": "nvml-bindings-missing",
              "message": "the suite's NVML layer cannot be imported"})
        return 0
    try:
        events = nvml_lib.watch_events(stop, max(1, args.wait_ms), max(0.0, args.sample_s))
        emit({"type": "started"})  # NVML answered and every GPU that can be is registered
        for ev in events:
            emit({"type": "event", "gpu": ev.gpu_index, "uuid": ev.uuid, "kind": ev.kind,
                  "data": ev.data, "time": time.time()})
    except nvml_lib.NvmlUnavailable as exc:
        log.warning("NVML events unavailable: %s", exc.message)
        emit({"type": "unavailable", "reason": exc.reason, "message": exc.message})
        return 0
    except BrokenPipeError:
        return 0  # the server went away
    except Exception as exc:
        log.exception("NVML event watch failed")
        code = nvml_lib.error_code(exc) if nvml_lib.is_nvml_error(exc) else None
        reason = nvml_lib.describe(code).cause.reason if code is not None else "internal-error"
        emit({"type": "error", "reason": reason})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
