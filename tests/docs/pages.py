"""The documentation as tests read it: README.md and every docs/**/*.md page, and their sections.

Tests that check what the documentation says find the section by its title wherever it lives,
so moving a section from one page to another does not break them (losing it does).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pages() -> dict[str, str]:
    """Each page's path relative to the checkout (README.md, docs/...) and its text."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in paths}


def sections(title: str) -> dict[str, str]:
    """Every section titled ``title`` (any heading level, case as written), by page: its text up
    to the next heading of the same or a higher level. Headings inside code blocks are skipped."""
    found: dict[str, str] = {}
    for page, text in pages().items():
        headings = _headings(text)
        for k, (start, level, name) in enumerate(headings):
            if name.strip() != title:
                continue
            end = next((s for s, lv, _ in headings[k + 1:] if lv <= level), len(text))
            found[page] = text[start:end]
            break
    return found


def _headings(text: str) -> list[tuple[int, int, str]]:
    """(offset, level, title) of each ATX heading outside fenced code blocks."""
    out: list[tuple[int, int, str]] = []
    offset, fence = 0, ""
    for line in text.splitlines(keepends=True):
        marker = re.match(r"\s*(`{3,}|~{3,})", line)
        if marker and (not fence or marker[1].startswith(fence)):
            fence = "" if fence else marker[1]
        elif not fence and (heading := re.match(r"(#{1,6})\s+(.*?)\s*#*\s*$", line)):
            out.append((offset, len(heading[1]), heading[2]))
        offset += len(line)
    return out
