"""The checkpoint probe's child: after ``cuInit(0)`` (no context is created) it asks the driver's
``cuCheckpointProcessGetState`` (555+) for each pid on its command line, and prints one line,
``PREFIX`` + ``driver``, ``api``, ``init`` (cuInit's CUresult) and ``states`` (``[{"pid", "rc",
"state"}]``; state 0 running, 1 locked, 2 checkpointed, 3 failed; null when rc is not 0).
Standalone (stdlib only, never the ``probes`` package): the query can hang while a peer process is
locked, so the parent runs this file under a deadline, in its own session, and ends it.
Command-line equivalent (one process)::

    cuda-checkpoint --get-state --pid 123
"""

import os
import sys

PREFIX = "HEALTHCHECK-CHECKPOINT-RESULT "
QUERY = "HEALTHCHECK-CHECKPOINT-QUERY "  # on stderr before each query: which pid hung
SCHEMA = 1


HERE = os.path.dirname(os.path.abspath(__file__))
_BASE = []  # type: list


def scaffold():
    """worker_base.py beside this file, loaded by its path (never by name), once."""
    if not _BASE:
        import importlib.util

        spec = importlib.util.spec_from_file_location("healthcheck_worker_base",
                                                      os.path.join(HERE, "worker_base.py"))
        _BASE.append(importlib.util.module_from_spec(spec))
        spec.loader.exec_module(_BASE[0])
    return _BASE[0]


def query(pids, report):
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        report["loaded"] = True
    except OSError:
        lib = None
    if lib is not None:
        version = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
            report["driver"] = version.value
        ask = getattr(lib, "cuCheckpointProcessGetState", None)
        report["api"] = ask is not None
        if ask is not None:
            report["init"] = int(lib.cuInit(0))
            if report["init"] == 0:
                for pid in pids:
                    # Flush what is known so far: if the next query hangs, the parent
                    # still sees which pids answered (one line per step on stderr).
                    state = ctypes.c_int(-1)
                    sys.stderr.write(QUERY + str(pid) + "\n")
                    sys.stderr.flush()
                    rc = int(ask(ctypes.c_int(pid), ctypes.byref(state)))
                    report["states"].append({"pid": pid, "rc": rc, "state": state.value if rc == 0 else None})


def main(argv=None):
    # Nothing in this folder or the current directory may stand in for the standard library.
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != HERE]
    pids = [int(p) for p in (sys.argv[1:] if argv is None else argv)]
    report = {"v": SCHEMA, "loaded": False, "driver": None, "api": False, "init": None, "states": []}
    scaffold().run(PREFIX, None, report, lambda report: query(pids, report))


if __name__ == "__main__":
    main()
