"""The checkpoint probe's child, run by path with the suite's interpreter (stdlib only): after
``cuInit(0)`` (no context) it asks ``cuCheckpointProcessGetState`` (driver 555+) for each pid on its
command line; the parent bounds it, as the query can hang while a peer process is locked."""

import os
import sys

PREFIX = "HEALTHCHECK-CHECKPOINT-RESULT "
QUERY = "HEALTHCHECK-CHECKPOINT-QUERY "  # on stderr before each query: which pid hung
SCHEMA = 1
HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    # Nothing in this folder or the current directory may stand in for the standard library.
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != HERE]
    import ctypes
    import json

    report = {"v": SCHEMA, "loaded": False, "driver": None, "api": False, "init": None, "states": []}
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        lib = None
    ask = getattr(lib, "cuCheckpointProcessGetState", None)  # None without the library too
    if lib is not None:
        report["loaded"], report["api"] = True, ask is not None
        version = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
            report["driver"] = version.value
    if ask is not None:
        report["init"] = int(lib.cuInit(0))
    for pid in [int(p) for p in sys.argv[1:]] if report["init"] == 0 else ():
        sys.stderr.write(QUERY + str(pid) + "\n")  # said before asking: if the query hangs, which pid
        sys.stderr.flush()
        state = ctypes.c_int(-1)
        rc = int(ask(ctypes.c_int(pid), ctypes.byref(state)))
        report["states"].append({"pid": pid, "rc": rc, "state": state.value if rc == 0 else None})
    sys.stdout.write(PREFIX + json.dumps(report, sort_keys=True) + "\n")
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown after cuInit: it can hang while a peer process is locked


if __name__ == "__main__":
    main()
