"""Server-side SVG charts for the Analytics page: no script, no external asset, every label escaped.

Colours are presentation attributes (not style attributes), so the page's strict Content-Security-
Policy needs no exception for them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from html import escape

PALETTE = ("#2563eb", "#d97706", "#059669", "#dc2626", "#7c3aed", "#0891b2", "#4b5563", "#be185d")
TEXT = "#1f2937"
GRID = "#d1d5db"


def _svg(width: int, height: int, title: str, desc: str, body: list[str]) -> str:
    uid = "chart-" + (re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "x")  # ids unique on a page of charts
    return (f'<svg xmlns="http://www.w3.org/2000/svg" role="img" viewBox="0 0 {width} {height}" '
            f'width="100%" aria-labelledby="{uid}-t {uid}-d"><title id="{uid}-t">{escape(title)}</title>'
            f'<desc id="{uid}-d">{escape(desc)}</desc>{"".join(body)}</svg>')


def _short(label: str, n: int) -> str:
    return label if len(label) <= n else "…" + label[-(n - 1):]


def _empty(title: str, width: int = 640) -> str:
    return _svg(width, 60, title, "no data yet",
                [f'<text x="10" y="35" fill="{TEXT}" font-size="14">No data yet.</text>'])


def hbars(rows: Sequence[tuple[str, float]], title: str, width: int = 640) -> str:
    """Horizontal bars, one per (label, value), longest first as given."""
    if not rows:
        return _empty(title, width)
    label_w, bar_h, gap = 230, 18, 6
    top = max(value for _, value in rows) or 1
    span = width - label_w - 70
    body = []
    for i, (label, value) in enumerate(rows):
        y = 10 + i * (bar_h + gap)
        w = max(1.0, span * value / top)
        body.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end" fill="{TEXT}" font-size="12">'
                    f'{escape(_short(label, 34))}</text>'
                    f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{PALETTE[0]}">'
                    f'<title>{escape(label)}: {value:,.0f}</title></rect>'
                    f'<text x="{label_w + w + 4:.1f}" y="{y + 13}" fill="{TEXT}" font-size="12">{value:,.0f}</text>')
    height = 20 + len(rows) * (bar_h + gap)
    desc = "; ".join(f"{label}: {value:,.0f}" for label, value in rows)
    return _svg(width, height, title, desc, body)


def stacked_columns(columns: Sequence[str], series: Mapping[str, Sequence[float]], title: str, width: int = 640) -> str:
    """One column per x label (e.g. a day), stacked by series (e.g. an agent tool), with a legend."""
    if not columns or not series:
        return _empty(title, width)
    height, left, bottom, legend_h = 240, 50, 40, 22
    plot_h = height - bottom - legend_h - 10
    totals = [sum(values[i] for values in series.values()) for i in range(len(columns))]
    top = max(totals) or 1
    step = (width - left - 10) / len(columns)
    bar_w = max(2.0, step * 0.7)
    body = [f'<line x1="{left}" y1="{legend_h + plot_h}" x2="{width - 10}" y2="{legend_h + plot_h}" stroke="{GRID}"/>',
            f'<text x="{left - 6}" y="{legend_h + 10}" text-anchor="end" fill="{TEXT}" font-size="11">{top:,.0f}</text>',
            f'<text x="{left - 6}" y="{legend_h + plot_h}" text-anchor="end" fill="{TEXT}" font-size="11">0</text>']
    for k, name in enumerate(series):
        body.append(f'<rect x="{left + k * 110}" y="4" width="12" height="12" fill="{PALETTE[k % len(PALETTE)]}"/>'
                    f'<text x="{left + k * 110 + 16}" y="14" fill="{TEXT}" font-size="12">{escape(_short(name, 12))}</text>')
    every = max(1, len(columns) // 8)  # at most ~8 x labels
    for i, column in enumerate(columns):
        x = left + i * step + (step - bar_w) / 2
        y = float(legend_h + plot_h)
        for k, (name, values) in enumerate(series.items()):
            h = plot_h * values[i] / top
            if h <= 0:
                continue
            y -= h
            body.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                        f'fill="{PALETTE[k % len(PALETTE)]}"><title>{escape(column)} {escape(name)}: '
                        f'{values[i]:,.0f}</title></rect>')
        if i % every == 0:
            body.append(f'<text x="{x + bar_w / 2:.1f}" y="{height - bottom + 16}" text-anchor="middle" '
                        f'fill="{TEXT}" font-size="11">{escape(column[-5:])}</text>')
    desc = "; ".join(f"{column}: {total:,.0f}" for column, total in zip(columns, totals, strict=True))
    return _svg(width, height, title, desc, body)


def line(points: Sequence[tuple[str, float]], title: str, unit: str = "", width: int = 640) -> str:
    """A line over ordered (x label, value) points, e.g. the lake's size after each index run."""
    if not points:
        return _empty(title, width)
    height, left, bottom = 200, 70, 30
    plot_h = height - bottom - 20
    top = max(value for _, value in points) or 1
    step = (width - left - 20) / max(1, len(points) - 1)
    xy = [(left + i * step, 10 + plot_h * (1 - value / top)) for i, (_, value) in enumerate(points)]
    path = " ".join(f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}" for i, (x, y) in enumerate(xy))
    body = [f'<line x1="{left}" y1="{10 + plot_h}" x2="{width - 20}" y2="{10 + plot_h}" stroke="{GRID}"/>',
            f'<text x="{left - 6}" y="16" text-anchor="end" fill="{TEXT}" font-size="11">{top:,.0f}{escape(unit)}</text>',
            f'<path d="{path}" fill="none" stroke="{PALETTE[0]}" stroke-width="2"/>']
    for (x, y), (label, value) in zip(xy, points, strict=True):
        body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{PALETTE[0]}">'
                    f'<title>{escape(label)}: {value:,.1f}{escape(unit)}</title></circle>')
    body.append(f'<text x="{left}" y="{height - 8}" fill="{TEXT}" font-size="11">{escape(points[0][0])}</text>'
                f'<text x="{width - 20}" y="{height - 8}" text-anchor="end" fill="{TEXT}" font-size="11">'
                f'{escape(points[-1][0])}</text>')
    desc = f"{len(points)} points from {points[0][0]} ({points[0][1]:,.1f}{unit}) to {points[-1][0]} ({points[-1][1]:,.1f}{unit})"
    return _svg(width, height, title, desc, body)
