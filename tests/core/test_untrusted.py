"""probes.untrusted: load_json reads what json.loads accepts, minus what later arithmetic cannot bear;
clean and squeeze make one printable line of any text."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probes import untrusted
from probes.untrusted import MAX_DEPTH, MAX_INT_DIGITS, load_json
from tests.conftest import ROOT

SCALARS = st.none() | st.booleans() | st.integers(-(10**18), 10**18) | st.text(max_size=20) | st.floats(
    allow_nan=False, allow_infinity=False)
DOCS = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=8), inner, max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(DOCS, st.sampled_from(["", " ", "\n\t ", "\r\n"]), st.booleans())
def test_it_reads_what_json_writes(doc, space, as_bytes):
    text = space + json.dumps(doc, indent=None if space == "" else 1, ensure_ascii=as_bytes) + space
    assert load_json(text.encode() if as_bytes else text) == json.loads(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_any_text_gives_a_value_or_a_value_error(text):
    try:
        expected = json.loads(text)
    except ValueError:
        expected = ValueError
    try:
        got = load_json(text)
    except ValueError:
        got = ValueError
    if expected is ValueError or got is ValueError:
        # What json refuses is refused; json's NaN, Infinity and huge numbers are refused too.
        assert got is ValueError or (got == expected), (text, got, expected)
    else:
        assert got == expected or (isinstance(got, float) and math.isnan(got) and math.isnan(expected))


@pytest.mark.parametrize("raw, why", [
    ("", "Expecting value"),
    ("  \n", "Expecting value"),
    ('{"a": 1} {"b": 2}', "Extra data"),
    ("[1,]", "Expecting value"),
    ('{"a": NaN}', "NaN is not a number"),
    ("[-Infinity]", "-Infinity is not a number"),
    ("1e400", "number too large"),
    ("1" * (MAX_INT_DIGITS + 1), "integer too large"),
    ('"tab\there"', "Invalid control character"),
    (b'{"a": "\xff"}', "not UTF-8"),
    ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nested too deeply"),
    ("[" * 200_000 + "]" * 200_000, "nested too deeply"),
])
def test_refused_with_a_value_error(raw, why):
    with pytest.raises(ValueError, match=why):
        load_json(raw)


def test_a_byte_order_mark_is_allowed_in_bytes():
    assert load_json(b'\xef\xbb\xbf{"port": 8888}') == {"port": 8888}


MALFORMED = ['{"port": 8888, "pid": 1', '{"port": 8888,}', '[1, 2,]', '{"a": "x\x00y"}', '["\x01"]',
             '{"a" 1}', '{"a": tru}', '"unterminated', '{"a": 1} x', '']


def test_malformed_json_is_a_value_error_when_json_was_never_imported():
    """A run with --only or --skip imports no json before the first parse: what load_json raises
    must not depend on what ran before it."""
    script = ("import sys\nfrom probes.untrusted import load_json\nassert 'json' not in sys.modules\n"
              f"for raw in {MALFORMED!r}:\n"
              "    for doc in (raw, raw.encode()):\n"
              "        try:\n            load_json(doc)\n        except ValueError:\n            continue\n"
              "        raise SystemExit(f'accepted {raw!r}')\nprint('all refused')\n")
    res = subprocess.run([sys.executable, "-I", "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=False)
    assert (res.returncode, res.stdout.strip()) == (0, "all refused"), res.stderr[-2000:]


@pytest.mark.parametrize("value", ["two\nlines\x1b[2J\u202e", b"two\nlines\x1b[2J\xe2\x80\xae"])
def test_clean_shows_what_is_invisible_and_squeeze_folds_whitespace_first(value):
    assert untrusted.clean(value) == "two\\nlines\\x1b[2J\\u202e"
    assert untrusted.squeeze(value) == "two lines\\x1b[2J\\u202e"
    for once in (untrusted.clean(value), untrusted.squeeze(value)):
        assert untrusted.clean(once) == untrusted.squeeze(once) == once  # cleaned text passes either unchanged
    assert untrusted.clean("x" * 500, 20) == "x" * 17 + "..."


def test_squeeze_is_short_single_line_and_printable():
    text = untrusted.squeeze(b"line one\n\x1b[31mred\x00\n" + b"x" * 500, limit=60)
    assert "\n" not in text and "\x1b" not in text and "\x00" not in text
    assert len(text) == 60 and text.endswith("...")


@pytest.mark.parametrize("blank", [b"\n" * 5000, " \t\n" * 2000])
def test_squeeze_shows_output_after_a_long_blank_start(blank):
    value = blank + b"the error" if isinstance(blank, bytes) else blank + "the error"
    assert untrusted.squeeze(value, 40) == "the error"
