"""The health check's notice in the first cell a person runs in a kernel (docs/image.md, "Notices").
Read as a configuration, this file adds a start line (``exec_lines``) that runs it again with the
shell; run so, it registers the ``pre_run_cell`` hook."""

import contextlib
import os
import stat
import sys
import time

MAX_SIZE = 4096
CHECK_CELL = ("def _healthcheck(", "HEALTHCHECK-KERNEL-RESULT ")  # probes/services/jupyter_kernel.py


def ago(seconds):
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


def shown(text):
    return "".join(ch for ch in text if ch.isprintable())[:300]


def lines(text, now):
    """The person's lines at ``now`` (epoch seconds): docker/gpu-health-notice.sh's."""
    head, _, rest = text.partition("\n")
    parts = head.split(" ", 3)
    if len(parts) < 3 or parts[2] not in ("healthy", "starting", "unhealthy") or not all(
            p.isascii() and p.isdigit() and len(p) <= 12 for p in parts[:2]):
        return []
    age = max(0, int(now) - int(parts[0]))
    said = [shown(x) for x in rest.split("\n")[:2]] if parts[2] == "unhealthy" else []
    said = said if said and said[0] else []
    out = []
    if age > int(parts[1]):
        out.append(f"gpu-health: not checked since {shown(parts[3] if len(parts) > 3 else '')} ({ago(age)}); "
                   f"last verdict: {said[0] if said else parts[2]}")
    elif said:
        out.append(f"gpu-health: {said[0]} (checked {ago(age)})")
    return out + [f"gpu-health: {s}" for s in said[1:] if s]


def notice(env=os.environ):
    if env.get("HEALTHCHECK_NOTICES", "").strip().lower() in ("false", "0", "no", "off"):
        return []
    fd = os.open(env.get("HEALTHCHECK_NOTICE_FILE") or "/run/healthcheck-notice/notice",
                 os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.geteuid()) or st.st_size > MAX_SIZE:
            return []
        data = os.read(fd, MAX_SIZE + 1)
    finally:
        os.close(fd)
    return lines(data[:MAX_SIZE].decode("utf-8", "replace"), time.time())


def arm(shell):
    def first_cell(info=None):
        try:
            source = getattr(info, "raw_cell", None) or ""
            if not getattr(info, "store_history", True) or (
                    source.startswith(CHECK_CELL[0]) and CHECK_CELL[1] in source):
                return
            shell.events.unregister("pre_run_cell", first_cell)
            said = notice()
            if said:  # sent with the cell's output: a flush here would wait on the kernel's IO thread
                sys.stderr.write("".join(f"{line}\n" for line in said))
        except Exception:  # noqa: S110 - never into the user's code
            pass

    shell.events.register("pre_run_cell", first_cell)


if "get_ipython" in globals():  # run by the kernel's start line below: the shell is up
    with contextlib.suppress(Exception):  # a kernel without the notice, never a broken kernel
        arm(globals()["get_ipython"]())
elif "get_config" in globals():  # read by IPython as a kernel's configuration
    globals()["get_config"]().InteractiveShellApp.exec_lines.append(
        f"exec(__import__('pathlib').Path({__file__!r}).read_bytes(), {{'get_ipython': get_ipython}})")
