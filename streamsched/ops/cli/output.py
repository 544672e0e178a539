"""``-o/--output table|json``: one document printed for tools (one JSON line) or for people (a
table, or ``key  value`` lines)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def table(doc: Any) -> str:
    """A list of mappings as columns (their keys, in first-seen order); a mapping as aligned
    ``key  value`` lines; anything else as JSON."""
    if isinstance(doc, list) and all(isinstance(row, dict) for row in doc):
        if not doc:
            return "(none)"
        keys = list(dict.fromkeys(k for row in doc for k in row))
        rows = [[k.upper() for k in keys], *[[_cell(row.get(k)) for k in keys] for row in doc]]
        widths = [max(len(r[i]) for r in rows) for i in range(len(keys))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
    if isinstance(doc, dict):
        width = max((len(str(k)) for k in doc), default=0)
        return "\n".join(f"{k!s:<{width}}  {_cell(v)}" for k, v in doc.items())
    return json.dumps(doc)


def show(args: argparse.Namespace, doc: Any, render: Callable[[Any], str] | None = None) -> None:
    """Print ``doc`` as ``args.output`` asks (``render`` makes the table; default :func:`table`)."""
    if getattr(args, "output", "json") == "json":
        print(json.dumps(doc))
    else:
        print((render or table)(doc))
