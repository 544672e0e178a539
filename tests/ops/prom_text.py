"""A strict parser of the Prometheus text format 0.0.4, for tests of what /metrics serves."""

from __future__ import annotations

import re
from typing import Any

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: (-?[0-9]+))?")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')
_TYPES = {"counter", "gauge", "summary", "histogram", "untyped"}
_SUFFIXES = {"summary": ("", "_sum", "_count"), "histogram": ("_bucket", "_sum", "_count")}


def parse_prometheus(text: str) -> dict[str, dict[str, Any]]:
    """Family -> {type, help, samples: [(name, labels, value)]}; asserts on any deviation.

    One HELP and one TYPE per family, before its samples; families never split; samples inside
    their family (with the type's suffixes); label syntax and escapes; Go-style float values; no
    duplicate series; histogram buckets cumulative and ending in +Inf equal to _count.
    """
    if not text:
        return {}
    assert text.endswith("\n")
    families: dict[str, dict[str, Any]] = {}
    done: set[str] = set()
    current: str | None = None
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if parts[1] not in ("HELP", "TYPE"):
                continue
            name = parts[2]
            assert _METRIC_NAME.fullmatch(name), line
            if name != current:
                assert name not in done and name not in families, f"family {name} split"
                if current is not None:
                    done.add(current)
                current = name
            fam = families.setdefault(name, {"samples": []})
            key = parts[1].lower()
            assert key not in fam, f"second {parts[1]} for {name}"
            assert not fam["samples"], f"{parts[1]} after samples of {name}"
            if parts[1] == "TYPE":
                assert parts[3] in _TYPES
            fam[key] = parts[3]
            continue
        m = _SAMPLE.fullmatch(line)
        assert m, f"bad sample line {line!r}"
        name, labels_text, value = m.group(1), m.group(2) or "", m.group(3)
        assert current is not None, f"sample {name} without HELP/TYPE"
        fam = families[current]
        assert name in {current + s for s in _SUFFIXES.get(fam["type"], ("",))}, f"{name} outside {current}"
        labels: dict[str, str] = {}
        pos = 0
        while pos < len(labels_text):
            lm = _LABEL.match(labels_text, pos)
            assert lm, f"bad labels {labels_text!r}"
            assert lm.group(1) not in labels
            labels[lm.group(1)] = lm.group(2)
            pos = lm.end()
        float(value)  # raises for anything but a Go-style float, NaN, +Inf, -Inf
        fam["samples"].append((name, labels, value))
    for name, fam in families.items():
        assert "help" in fam and "type" in fam, f"{name} lacks HELP or TYPE"
        keys = [(*sorted(s[1].items()), s[0]) for s in fam["samples"]]
        assert len(keys) == len(set(keys)), f"duplicate series in {name}"
        if fam["type"] == "histogram":
            _check_buckets(name, fam["samples"])
    return families


def _check_buckets(name: str, samples: list[tuple[str, dict[str, str], str]]) -> None:
    series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    counts: dict[tuple[tuple[str, str], ...], float] = {}
    for sname, labels, value in samples:
        rest = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        if sname == name + "_bucket":
            series.setdefault(rest, []).append((float(labels["le"]), float(value)))
        elif sname == name + "_count":
            counts[rest] = float(value)
    assert set(series) == set(counts), f"{name}: buckets without _count or the reverse"
    for rest, buckets in series.items():
        bounds, values = [b[0] for b in buckets], [b[1] for b in buckets]
        assert bounds == sorted(bounds) and values == sorted(values), f"{name}{rest}: not cumulative"
        assert buckets[-1][0] == float("inf") and buckets[-1][1] == counts[rest]
