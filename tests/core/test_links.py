"""Every relative link in README.md and docs/*.md names an existing file and, after ``#``, a heading there."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def broken_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        name, _, anchor = target.partition("#")
        dest = (page.parent / name).resolve() if name else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(target)
    return broken


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_resolves():
    found = {str(page.relative_to(ROOT)): broken_links(page) for page in pages()}
    assert {page: links for page, links in found.items() if links} == {}


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "b.md").write_text("# Here it is\n", encoding="utf-8")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#here-it-is) [file](gone.md) [anchor](b.md#not-here) [self](#nowhere)\n"
                    "```\n[in code](ignored.md)\n```\n", encoding="utf-8")
    assert broken_links(page) == ["gone.md", "b.md#not-here", "#nowhere"]
