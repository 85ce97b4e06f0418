"""Inline SVG charts: nothing loads from outside the Airflow UI (no CDN, no script).

Each function returns SVG markup (values escaped) that scales to the width of its container,
so a chart reads the same on a phone. Colours come from the page's CSS classes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from html import escape

WIDTH = 640
HEIGHT = 220
PAD_LEFT = 56
PAD_BOTTOM = 28
PAD_TOP = 14
PAD_RIGHT = 12


@dataclasses.dataclass(frozen=True)
class Series:
    """One named series of (x label, value) points; ``css`` picks its colour class."""

    name: str
    points: Sequence[tuple[str, float | None]]
    css: str = "s1"


@dataclasses.dataclass(frozen=True)
class Threshold:
    """A horizontal reference line (a target such as 60 s)."""

    label: str
    value: float


def _svg(title: str, body: str, height: int = HEIGHT) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'preserveAspectRatio="xMidYMid meet" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>{body}</svg>"
    )


def _empty(title: str) -> str:
    return _svg(
        title,
        f'<text class="muted" x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">'
        "no data in this period</text>",
    )


def _nice_max(value: float) -> float:
    """The smallest "round" maximum >= value whose quarter ticks are round too."""
    if value <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(value / 4))
    for step in (1, 2, 2.5, 5, 10):
        if 4 * step * magnitude >= value:
            return float(4 * step * magnitude)
    return float(40 * magnitude)


def _axis(ymax: float, unit: str, labels: Sequence[str], plot_w: float) -> list[str]:
    parts = []
    plot_h = HEIGHT - PAD_TOP - PAD_BOTTOM
    for i in range(5):
        value = ymax * i / 4
        y = PAD_TOP + plot_h - plot_h * i / 4
        parts.append(
            f'<line class="grid" x1="{PAD_LEFT}" x2="{WIDTH - PAD_RIGHT}" y1="{y:.1f}" '
            f'y2="{y:.1f}"/><text class="tick" x="{PAD_LEFT - 6}" y="{y + 4:.1f}" '
            f'text-anchor="end">{value:g}{escape(unit)}</text>'
        )
    if labels:
        every = max(1, len(labels) // 6)
        for i, label in enumerate(labels):
            if i % every and i != len(labels) - 1:
                continue
            x = PAD_LEFT + plot_w * (i + 0.5) / len(labels)
            parts.append(
                f'<text class="tick" x="{x:.1f}" y="{HEIGHT - 8}" text-anchor="middle">'
                f"{escape(label)}</text>"
            )
    return parts


def _legend(items: Sequence[tuple[str, str]]) -> str:
    parts = []
    x = PAD_LEFT
    for name, css in items:
        parts.append(
            f'<rect class="{css}" x="{x}" y="2" width="10" height="10"/>'
            f'<text class="tick" x="{x + 14}" y="11">{escape(name)}</text>'
        )
        x += 24 + 7 * len(name)
    return "".join(parts)


def bars(title: str, series: Sequence[Series], unit: str = "") -> str:
    """Stacked bars, one column per x label (outcomes per hour, runs per day)."""
    labels = [label for label, _ in series[0].points] if series else []
    if not labels:
        return _empty(title)
    totals = [
        sum((s.points[i][1] or 0.0) for s in series if i < len(s.points))
        for i in range(len(labels))
    ]
    ymax = _nice_max(max(totals))
    plot_w = WIDTH - PAD_LEFT - PAD_RIGHT
    plot_h = HEIGHT - PAD_TOP - PAD_BOTTOM
    col = plot_w / len(labels)
    parts = _axis(ymax, unit, labels, plot_w)
    for i, label in enumerate(labels):
        base = 0.0
        for s in series:
            value = (s.points[i][1] or 0.0) if i < len(s.points) else 0.0
            if value <= 0:
                continue
            h = plot_h * value / ymax
            y = PAD_TOP + plot_h - plot_h * base / ymax - h
            parts.append(
                f'<rect class="{s.css}" x="{PAD_LEFT + col * i + col * 0.15:.1f}" y="{y:.1f}" '
                f'width="{col * 0.7:.1f}" height="{h:.1f}">'
                f"<title>{escape(label)} {escape(s.name)}: {value:g}</title></rect>"
            )
            base += value
    parts.append(_legend([(s.name, s.css) for s in series]))
    return _svg(title, "".join(parts))


def lines(
    title: str,
    series: Sequence[Series],
    unit: str = "",
    thresholds: Sequence[Threshold] = (),
) -> str:
    """Lines with points over shared x labels (durations, lags), with target lines."""
    labels: list[str] = []
    for s in series:
        for label, _ in s.points:
            if label not in labels:
                labels.append(label)
    values = [v for s in series for _, v in s.points if v is not None]
    if not values:
        return _empty(title)
    # the scale follows the data and the lowest target; a target far above both is named,
    # not drawn, so small lags stay readable
    floor = min((t.value for t in thresholds), default=0.0)
    ymax = _nice_max(max([*values, floor]))
    plot_w = WIDTH - PAD_LEFT - PAD_RIGHT
    plot_h = HEIGHT - PAD_TOP - PAD_BOTTOM
    index = {label: i for i, label in enumerate(labels)}
    parts = _axis(ymax, unit, labels, plot_w)

    def xy(label: str, value: float) -> tuple[float, float]:
        x = PAD_LEFT + plot_w * (index[label] + 0.5) / len(labels)
        return x, PAD_TOP + plot_h - plot_h * value / ymax

    above = [t for t in thresholds if t.value > ymax]
    for i, t in enumerate(above):
        parts.append(
            f'<text class="tick target-label" x="{WIDTH - PAD_RIGHT - 2}" '
            f'y="{PAD_TOP + 12 * i + 2}" text-anchor="end">'
            f"{escape(t.label)}: above the scale</text>"
        )
    for t in thresholds:
        if t.value > ymax:
            continue
        _, y = xy(labels[0], t.value)
        parts.append(
            f'<line class="target" x1="{PAD_LEFT}" x2="{WIDTH - PAD_RIGHT}" y1="{y:.1f}" '
            f'y2="{y:.1f}"/><text class="tick target-label" x="{WIDTH - PAD_RIGHT - 2}" '
            f'y="{y - 3:.1f}" text-anchor="end">{escape(t.label)}</text>'
        )
    for s in series:
        points = [xy(label, v) for label, v in s.points if v is not None]
        if len(points) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
            parts.append(f'<polyline class="line {s.css}" points="{path}"/>')
        for (label, v), (x, y) in zip(
            [(label, v) for label, v in s.points if v is not None], points, strict=True
        ):
            parts.append(
                f'<circle class="{s.css}" cx="{x:.1f}" cy="{y:.1f}" r="3">'
                f"<title>{escape(label)} {escape(s.name)}: {v:g}{escape(unit)}</title></circle>"
            )
    parts.append(_legend([(s.name, s.css) for s in series]))
    return _svg(title, "".join(parts))


@dataclasses.dataclass(frozen=True)
class Span:
    """One bar of a timeline: a try from its grant to its end."""

    row: str
    start: float
    end: float
    css: str
    label: str


def timeline(title: str, spans: Sequence[Span], unit: str = "s") -> str:
    """A timeline (one row per token): when each try held the lease, relative to the first."""
    if not spans:
        return _empty(title)
    rows = list(dict.fromkeys(s.row for s in spans))
    row_h = 26
    # at least three rows high, so one try still reads as a chart on a phone
    height = PAD_TOP + row_h * max(3, len(rows)) + PAD_BOTTOM
    t0 = min(s.start for s in spans)
    t1 = max(max(s.end for s in spans), t0 + 1e-3)
    plot_w = WIDTH - PAD_LEFT * 2 - PAD_RIGHT
    left = PAD_LEFT * 2
    parts = []
    for i, row in enumerate(rows):
        y = PAD_TOP + row_h * i
        parts.append(
            f'<text class="tick" x="{left - 6}" y="{y + 17}" text-anchor="end">{escape(row)}</text>'
        )
    for s in spans:
        y = PAD_TOP + row_h * rows.index(s.row)
        x = left + plot_w * (s.start - t0) / (t1 - t0)
        w = max(2.0, plot_w * (s.end - s.start) / (t1 - t0))
        parts.append(
            f'<rect class="{s.css}" x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}">'
            f"<title>{escape(s.label)}</title></rect>"
        )
    parts.append(
        f'<text class="tick" x="{left}" y="{height - 8}">0{escape(unit)}</text>'
        f'<text class="tick" x="{WIDTH - PAD_RIGHT}" y="{height - 8}" text-anchor="end">'
        f"{t1 - t0:.1f}{escape(unit)}</text>"
    )
    return _svg(title, "".join(parts), height)
