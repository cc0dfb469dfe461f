"""The workers' shared scaffold: the result channel, phase markers, an error's common fields, strict
JSON numbers, the parent-death signal. Standalone like them (stdlib only, Python 3.6+); each loads it
by its path once its folder and the current directory are off ``sys.path``."""

import os
import sys


def measure(value):
    """A float as strict JSON allows it: non-finite values as "nan", "inf" or "-inf"."""
    value = float(value)
    return str(value) if value != value or abs(value) == float("inf") else value


def text(exc, limit, one_line=True):
    message = str(exc).strip()
    return (message.replace("\n", " ") if one_line else message)[:limit]


def error_code(exc):
    """``torch.AcceleratorError.error_code`` (a cudaError_t, torch 2.8 and later), or None."""
    code = getattr(exc, "error_code", None)
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def described(exc, limit, one_line=True):
    return {"type": type(exc).__name__, "message": text(exc, limit, one_line), "code": error_code(exc)}


def phase(marker, name):
    sys.stderr.write(marker + name + "\n")
    sys.stderr.flush()


def with_the_suite():
    """Arm the parent-death signal (SIGKILL) in a worker behind an interpreter wrapper too; False when
    the suite, named by the last run marker in ``HEALTHCHECK_RUN_ID`` (``<pid>-<start>-<n>-<random>``),
    is already gone (docs/probes.md, "Containment")."""
    parts = os.environ.get("HEALTHCHECK_RUN_ID", "").split(":")[-1].split("-")
    if len(parts) != 4 or not parts[0].isdigit() or not parts[1].isdigit():
        return True
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, 9, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG, SIGKILL
            return True
    except (OSError, AttributeError):
        return True
    if os.getppid() == int(parts[0]):
        return True  # armed while the suite is our parent: its death now kills us
    # A wrapper that does not exec sits between us (with the run's marker: the next run ends it and us),
    # or we were re-parented already.
    try:
        with open("/proc/" + str(os.getppid()) + "/environ", "rb") as fh:
            if b"HEALTHCHECK_RUN_ID=" + os.environb[b"HEALTHCHECK_RUN_ID"] in fh.read().split(b"\0"):
                return True
    except OSError:
        pass
    try:
        with open("/proc/" + parts[0] + "/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return fields[19] == parts[1].encode() and fields[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def run(prefix, marker, report, work, failed, trace=False):
    """Run ``work(report)``, print ``report`` as the one result line on stdout and exit at once;
    ``failed(exc)`` makes the error of an exception that escapes (``trace``: its traceback first)."""
    if not with_the_suite():
        os._exit(1)  # the suite that started us is gone: nobody reads the answer
    result_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints, ours or torch's C++ code's, go to stderr, never to the result channel
    phase(marker, "start")
    try:
        work(report)
    except Exception as exc:
        if trace:
            import traceback

            traceback.print_exc()
        report["error"] = failed(exc)
    import json

    os.write(result_fd, (prefix + json.dumps(report, sort_keys=True) + "\n").encode("utf-8"))
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: it can hang after a fatal CUDA error or a failed collective
