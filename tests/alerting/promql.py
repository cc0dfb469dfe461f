"""Just enough PromQL to list what an expression reads, and to hold it against what serve exports.

``read(expr)`` gives each vector selector (metric name and label matchers) and the label names
of every by/without/on/ignoring/group_left/group_right clause. The tokenizer knows every
token PromQL has; anything else raises, so an expression it cannot read fails the test
instead of passing unread. ``problems(...)`` names each metric, label or label value that
the exported series do not have.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

TOKEN = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[0-9a-z:]*\])
  | (?P<number>0x[0-9a-fA-F]+|(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?(?:ms|[smhdwy])?
                (?:[0-9]+(?:ms|[smhdwy]))*)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=,(){}@])
""", re.VERBOSE)
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
                "topk", "quantile", "limitk", "limit_ratio"}
WORDS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "start", "end"}
# Label values whose labels the rules must spell exactly as serve does.
SIMPLE = re.compile(r"^[A-Za-z0-9_.-]+(\|[A-Za-z0-9_.-]+)*$")


@dataclass
class Selector:
    name: str
    matchers: list[tuple[str, str, str]] = field(default_factory=list)  # (label, op, value)


@dataclass
class Read:
    selectors: list[Selector] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)


def tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot read PromQL at {expr[pos:pos + 30]!r} in {expr!r}")
        if m.lastgroup != "space":
            out.append((m.lastgroup or "", m.group()))
        pos = m.end()
    return out


def _unquote(text: str) -> str:
    return text[1:-1].encode().decode("unicode_escape") if text[0] != "`" else text[1:-1]


def read(expr: str) -> Read:
    toks = tokens(expr)
    result = Read()
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else ""
        if kind == "ident" and text in GROUPING:
            i += 1
            if nxt == "(":
                i += 1
                while toks[i][1] != ")":
                    if toks[i][0] == "ident":
                        result.grouping.add(toks[i][1])
                    i += 1
                i += 1
            continue
        if kind == "ident" and (nxt == "(" or text.lower() in WORDS
                                or (text in AGGREGATIONS and nxt in ("by", "without"))):
            i += 1  # a function, an aggregation or an operator word
            continue
        if kind == "ident" or text == "{":
            sel = Selector(text if kind == "ident" else "")
            i += 1
            if kind == "ident" and nxt == "{":
                i += 1
            if kind == "ident" and nxt != "{":
                result.selectors.append(sel)
                continue
            while toks[i][1] != "}":
                if toks[i][1] == ",":
                    i += 1
                    continue
                label, op, value = toks[i][1], toks[i + 1][1], toks[i + 2]
                if toks[i][0] != "ident" or op not in ("=", "!=", "=~", "!~") or value[0] != "string":
                    raise ValueError(f"cannot read the label matcher at {toks[i:i + 3]} in {expr!r}")
                sel.matchers.append((label, op, _unquote(value[1])))
                i += 3
            i += 1
            if not sel.name:
                names = [v for label, op, v in sel.matchers if label == "__name__" and op == "="]
                sel.name = names[0] if names else ""
            result.selectors.append(sel)
            continue
        i += 1
    return result


def template_queries(text: str) -> list[str]:
    """The PromQL inside an annotation's ``query`` calls (printf's %s filled with a dummy)."""
    return [q.replace("%s", "x") for q in re.findall(r"printf\s+`([^`]*)`", text)]


def template_labels(text: str) -> set[str]:
    return set(re.findall(r"\$labels\.([A-Za-z_][A-Za-z0-9_]*)", text))


def problems(where: str, expr: str, exported: Mapping[str, set[str]],
             domains: Mapping[str, Iterable[str]], annotations: Iterable[str] = ()) -> list[str]:
    """What ``expr`` (and the ``$labels`` its annotations use) names that ``exported`` lacks.

    ``exported``: metric name -> the label names its series carry; ``domains``: label name ->
    every value serve can give it (checked for =, =~ and != matchers with plain values)."""
    out: list[str] = []
    got = read(expr)
    labels: set[str] = set()
    for sel in got.selectors:
        if sel.name not in exported:
            out.append(f"{where}: metric {sel.name or '(no name)'} is not exported")
            continue
        labels |= exported[sel.name]
        for label, op, value in sel.matchers:
            if label != "__name__" and label not in exported[sel.name]:
                out.append(f"{where}: {sel.name} has no label {label}")
            elif label in domains and op != "!~" and SIMPLE.match(value):
                allowed = set(domains[label])
                out += [f"{where}: {sel.name}{{{label}{op}...}}: no series has {label}={v!r} "
                        f"(serve gives {', '.join(sorted(allowed))})" for v in value.split("|") if v not in allowed]
    out += [f"{where}: grouping by {label}, which no metric here has" for label in sorted(got.grouping - labels)]
    for text in annotations:
        queried: set[str] = set()
        for query in template_queries(text):
            out += problems(f"{where} (template query)", query, exported, domains)
            queried |= {label for sel in read(query).selectors for label in exported.get(sel.name, ())}
        out += [f"{where}: an annotation uses $labels.{label}, which no metric here has"
                for label in sorted(template_labels(text) - labels)]
        out += [f"{where}: an annotation's query result has no label {label}"
                for label in sorted(set(re.findall(r"\.Labels\.([A-Za-z_][A-Za-z0-9_]*)", text)) - queried)]
    return out
