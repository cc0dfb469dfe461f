"""The suite's number grammar: plain ASCII digits, an optional fraction, nothing else (``float()``
takes ' 1e3 ', 'nan' and '1_000'; ``str.isdigit`` takes '\u00b2', which ``int()`` refuses)."""

from __future__ import annotations

NUMBER_FORM = "digits with an optional fraction, e.g. 25 or 2.5"


def is_integer_text(text: str) -> bool:
    return bool(text) and all("0" <= ch <= "9" for ch in text)


def is_number_text(text: str) -> bool:
    whole, dot, frac = text.partition(".")
    if frac and not is_integer_text(frac):
        return False
    return is_integer_text(whole) or (not whole and bool(dot) and bool(frac))
