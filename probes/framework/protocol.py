"""The workers' protocol as the suite reads it (the writing side is ``worker_base.py``): one line
``PREFIX + JSON`` on stdout and progress markers ``PHASE + name`` on stderr. A report enters the
suite only through here, checked field by field against a schema of kinds, so that no later use
sees a wrong type, a non-finite number or an unbounded string.
"""

from __future__ import annotations

import math

from probes import untrusted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

STR, INT, NUM, MEASURE, BOOL = "str", "int", "num", "measure", "bool"  # a schema: {"name": (kind, nullable)}
MAX_INT = 2**63  # counts, indices, byte sizes: int64 in torch and NVML
MAX_STR = 1000  # characters of any string field, before cleaning
NONFINITE = ("nan", "inf", "-inf")  # how a worker spells a non-finite MEASURE
# Host memory's words (MemoryError as a whole word: torch's OutOfMemoryError is the GPU's): the C
# library's ENOMEM, the dynamic loader's failed mmap(), C++'s failed allocation (then abort()).
MEMORY_WORDS = ("cannot allocate memory", "failed to map segment from shared object", "std::bad_alloc")


class Bad(ValueError):
    """The worker's output breaks the protocol; the message says how (safe to show)."""


def finite(value: Any) -> bool:
    """A JSON number that float() turns into a finite value (a 400-digit integer does not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def check(value: Any, kind: str, nullable: bool, where: str) -> None:
    """Raise Bad unless ``value`` is of ``kind`` (or None, when ``nullable``)."""
    if value is None:
        if nullable:
            return
        raise Bad(f"{where} is missing")
    if kind == STR:
        ok = isinstance(value, str) and len(value) <= MAX_STR
    elif kind == BOOL:
        ok = isinstance(value, bool)
    elif kind == INT:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and not -MAX_INT <= value < MAX_INT:
            raise Bad(f"{where} is out of range")
    else:  # NUM, or MEASURE: a number, or how the worker spells a non-finite one
        if kind == MEASURE and value in NONFINITE:
            return
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and not finite(value):
            raise Bad(f"{where} is not a finite number")
    if not ok:
        raise Bad(f"{where} has the wrong type")


def fields(obj: Any, spec: Mapping[str, tuple[str, bool]], where: str, nested: tuple[str, ...] = ()) -> None:
    """Raise Bad unless ``obj`` is an object with exactly the fields of ``spec``, each of its kind,
    and of ``nested`` (objects or lists the caller checks itself)."""
    if not isinstance(obj, dict):
        raise Bad(f"{where} is not an object")
    if set(obj) != {*spec, *nested}:
        raise Bad(f"{where} has unexpected or missing fields")
    for key, (kind, nullable) in spec.items():
        check(obj[key], kind, nullable, f"{where}.{key}")


def cleaned(value: Any, limit: int, limits: Mapping[str, int] | None = None, key: str = "") -> Any:
    """A copy of a validated report with every string one printable line of at most ``limit``
    characters (``limits``: per field name); numbers, booleans and None stay what they are."""
    if isinstance(value, dict):
        return {k: cleaned(v, limit, limits, k) for k, v in value.items()}
    if isinstance(value, list):
        return [cleaned(v, limit, limits, key) for v in value]
    if isinstance(value, str):
        return untrusted.clean(value, (limits or {}).get(key, limit))
    return value


def result(stdout: bytes, prefix: str) -> Any:
    """The JSON of the one result line in ``stdout``; Bad when there is none, more than one, or it is
    not readable JSON (malformed, too deep, NaN, a number too large for a float)."""
    hits = [line for line in stdout.decode("utf-8", "replace").splitlines() if line.startswith(prefix)]
    if len(hits) != 1:
        raise Bad("more than one result line" if hits else "no result line")
    try:
        return untrusted.load_json(hits[0][len(prefix):])
    except ValueError as exc:
        raise Bad(f"the result line is not readable JSON: {untrusted.clean(exc, 80)}") from None


def arrived(stdout: bytes, prefix: str) -> bool:
    """Whether the output so far holds a whole result line, its line break included."""
    marker = prefix.encode()
    return marker in stdout and any(line.startswith(marker) and line.endswith((b"\n", b"\r"))
                                    for line in stdout.splitlines(keepends=True))


def out_of_memory(text: bytes | str) -> bool:
    """Whether ``text`` (a worker's stderr or error message) says host memory ran out."""
    import re

    low = (text.decode("utf-8", "replace") if isinstance(text, bytes) else text).lower()
    return any(word in low for word in MEMORY_WORDS) or re.search(r"\bmemoryerror\b", low) is not None


def last_phase(stderr: bytes, phase: str, names: str) -> str | None:
    """The last progress marker in ``stderr`` whose whole name matches the pattern ``names``."""
    import re

    found = None
    for line in stderr.decode("utf-8", "replace").splitlines():
        if line.startswith(phase) and re.fullmatch(names, line[len(phase):].strip()):
            found = line[len(phase):].strip()
    return found
