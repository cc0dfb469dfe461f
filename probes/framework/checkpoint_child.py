"""The checkpoint probe's child (stdlib only, never the ``probes`` package): after ``cuInit(0)`` (no
context) it asks ``cuCheckpointProcessGetState`` (driver 555+) for each pid on its command line and
prints ``driver``, ``api``, ``init`` (cuInit's CUresult) and ``states`` (``[{"pid", "rc", "state"}]``).
The query can hang while a peer process is locked: the parent runs it under a deadline.
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
        import runpy
        import types

        _BASE.append(types.SimpleNamespace(**runpy.run_path(os.path.join(HERE, "worker_base.py"))))
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
                    # Said before asking: if the query hangs, the parent sees which pid it was.
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
