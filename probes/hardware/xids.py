"""NVIDIA's Xid catalog, reduced to what a health check acts on.

Each Xid has the catalog's immediate resolution (its "Resolution Bucket (Immediate Action)"
for Ampere and newer GPUs, from NVIDIA's "Xid Errors" documentation): ``ignore``,
``restart-app`` (the application's error, or another tenant's), ``reset-gpu``, ``reboot``
(the node) or ``contact-support``. ``healthcheck serve`` latches unhealthy only on Xids
whose resolution needs a GPU reset or a node reboot (:data:`LATCHING`); the others are
counted and shown. An Xid not in the table is shown as "other", never latched: the table
keeps to entries checked against the catalog (a wrong latch takes a node out until restart;
HEALTHCHECK_XID_CRITICAL adds more).

Operators override it with ``HEALTHCHECK_XID_CRITICAL`` (latch on these too) and
``HEALTHCHECK_XID_IGNORE`` (count only, never latch or warn); see probes.serve.settings.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time (see probes/_typing.py)
if TYPE_CHECKING:
    from typing import NamedTuple
else:
    from probes._typing import NamedTuple

IGNORE, RESTART_APP, RESET_GPU, REBOOT, CONTACT_SUPPORT = (
    "ignore", "restart-app", "reset-gpu", "reboot", "contact-support")
LATCHING = frozenset({RESET_GPU, REBOOT})


class Xid(NamedTuple):
    resolution: str
    meaning: str


CATALOG: dict[int, Xid] = {
    8: Xid(RESTART_APP, "GPU stopped processing (channel timeout)"),
    13: Xid(RESTART_APP, "graphics engine exception (an application fault: bad address, illegal "
                         "instruction)"),
    31: Xid(RESTART_APP, "GPU memory page fault (an application's invalid memory access)"),
    43: Xid(RESTART_APP, "GPU stopped processing (a channel was reset after an application fault)"),
    45: Xid(IGNORE, "preemptive cleanup after an earlier error (the application exited or was killed)"),
    48: Xid(RESET_GPU, "double-bit ECC error (uncorrectable memory error)"),
    63: Xid(IGNORE, "ECC page retirement or row remap recorded (the nvml probe judges the pending state)"),
    64: Xid(RESET_GPU, "ECC page retirement or row remap recording failure"),
    68: Xid(RESTART_APP, "video decoder (NVDEC) exception"),
    74: Xid(RESET_GPU, "NVLink error"),
    79: Xid(REBOOT, "GPU has fallen off the bus"),
    92: Xid(IGNORE, "high single-bit ECC error rate (corrected)"),
    94: Xid(RESTART_APP, "contained ECC error (only the application that touched the memory is affected)"),
    95: Xid(RESET_GPU, "uncontained ECC error (every application on the GPU is affected)"),
    109: Xid(RESTART_APP, "context switch timeout"),
    119: Xid(RESET_GPU, "GSP RPC timeout"),
    120: Xid(RESET_GPU, "GSP error"),
    140: Xid(RESET_GPU, "unrecovered ECC error"),
    154: Xid(IGNORE, "GPU recovery action changed (the nvml probe judges the recovery action itself)"),
}


def resolution(xid: int) -> str | None:
    """The catalog's immediate resolution for an Xid, or None when the table does not know it."""
    entry = CATALOG.get(xid)
    return entry.resolution if entry is not None else None


def latches(xid: int) -> bool:
    return resolution(xid) in LATCHING

