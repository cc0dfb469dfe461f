"""Real samples written by others (see README.md beside this file): the header, then the sample."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
HEADER = re.compile(rb"# (source|exit|expect): (.*)\n")


class Sample(NamedTuple):
    name: str
    source: str
    expect: str  # "pass N" or "fail REASON" (nvidia-smi); "latch", "warn" or "count" (xid)
    exit: int | None
    body: bytes  # verbatim


def load(kind: str) -> list[Sample]:
    """Every sample under ``kind`` (``nvidia-smi`` or ``xid``), sorted by file name."""
    out = []
    for path in sorted((HERE / kind).glob("*.txt")):
        data, fields = path.read_bytes(), {}
        while m := HEADER.match(data):
            fields[m[1].decode()] = m[2].decode()
            data = data[m.end():]
        code = fields.get("exit")
        out.append(Sample(path.stem, fields["source"], fields["expect"],
                          int(code.split()[0]) if code is not None else None, data))
    return out
