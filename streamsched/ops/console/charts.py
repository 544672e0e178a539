"""Server-side charts as inline SVG: no script runs in the browser (the console's pages allow
none). Every text that goes into the SVG is escaped here, since templates insert it as markup.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from markupsafe import Markup, escape

WIDTH, HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 14, 28
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
MAX_SERIES = len(PALETTE)
"""Series drawn in one chart (more are named in the legend as not drawn)."""


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * exp:
            return float(step * exp)
    return float(10 * exp)


def _clock(at: float) -> str:
    return time.strftime("%H:%M", time.gmtime(at))


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def _frame(title: str, y_max: float, t0: float, t1: float) -> list[str]:
    plot_h = HEIGHT - TOP - BOTTOM
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
           f"<title>{escape(title)}</title>",
           f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{plot_h}" '
           'fill="#fafafa" stroke="#ccc"/>']
    for i in range(5):
        y = TOP + plot_h - plot_h * i / 4
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{LEFT - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">'
                   f"{_fmt(y_max * i / 4)}</text>")
    out.append(f'<text x="{LEFT}" y="{HEIGHT - 8}" font-size="10">{_clock(t0)} UTC</text>')
    out.append(f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 8}" font-size="10" text-anchor="end">'
               f"{_clock(t1)} UTC</text>")
    return out


def _empty(title: str, note: str) -> Markup:
    return Markup(f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{WIDTH}" height="60" '
                  f'viewBox="0 0 {WIDTH} 60" role="img" aria-label="{escape(title)}">'
                  f"<title>{escape(title)}</title>"
                  f'<text x="8" y="34" font-size="12" fill="#777">{escape(note)}</text></svg>')


def legend(names: Sequence[str]) -> list[tuple[str, str]]:
    """(colour, name) of the series a chart draws, in order."""
    return [(PALETTE[i % len(PALETTE)], n) for i, n in enumerate(names[:MAX_SERIES])]


def line_chart(title: str, series: dict[str, list[tuple[float, float]]]) -> Markup:
    """One polyline per series of (time, value) points on a shared time and value axis."""
    drawn = {k: v for k, v in list(series.items())[:MAX_SERIES] if v}
    points = [p for values in drawn.values() for p in values]
    if not points:
        return _empty(title, "no samples yet: the sampler fills this in while the console runs")
    t0, t1 = min(p[0] for p in points), max(p[0] for p in points)
    span = max(t1 - t0, 1.0)
    y_max = _nice_max(max(p[1] for p in points))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    out = _frame(title, y_max, t0, t1)
    for colour, name in legend(list(series)):
        values = drawn.get(name)
        if not values:
            continue
        coords = " ".join(f"{LEFT + plot_w * (t - t0) / span:.1f},{TOP + plot_h - plot_h * v / y_max:.1f}"
                          for t, v in values)
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}">'
                   f"<title>{escape(name)}</title></polyline>")
    out.append("</svg>")
    return Markup("".join(out))


def bar_chart(title: str, minutes: Sequence[tuple[int, int, int]],
              labels: tuple[str, str] = ("executions", "failures")) -> Markup:
    """Two bars per minute (``labels``: the first value in blue, the second in red)."""
    if not minutes:
        return _empty(title, "no full minute sampled yet")
    y_max = _nice_max(max(max(a, b) for _, a, b in minutes))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slots = max(len(minutes), 10)
    slot = plot_w / slots
    bar = max(1.0, slot * 0.4)
    out = _frame(title, y_max, minutes[0][0], minutes[-1][0])
    for i, (minute, first, second) in enumerate(minutes):
        x = LEFT + slot * i + slot * 0.1
        for j, (value, colour) in enumerate(((first, PALETTE[0]), (second, PALETTE[1]))):
            h = plot_h * value / y_max
            out.append(f'<rect x="{x + j * bar:.1f}" y="{TOP + plot_h - h:.1f}" width="{bar:.1f}" '
                       f'height="{h:.1f}" fill="{colour}"><title>{_clock(minute)} UTC: {value} '
                       f"{escape(labels[j])}</title></rect>")
    out.append("</svg>")
    return Markup("".join(out))
