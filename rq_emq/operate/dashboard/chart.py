"""The panel's one chart, drawn on the server as inline SVG: stalls (marks), recoveries,
horse crashes and failures at max attempts per minute over the last hour, each point's
minute on hover as a time of day (UTC). No script, no library, nothing fetched: the machines that
run a dashboard may have no internet, and the page must render as it is served."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

WIDTH, HEIGHT = 720, 200
MARGIN_LEFT, MARGIN_BOTTOM, MARGIN_TOP = 34, 18, 20
#: What each line shows, its colour, and the kinds of the ring it adds up.
SERIES = (
    ("stalled", "#d9534f", ("marked",)),
    ("recovered", "#5cb85c", ("recovered",)),
    ("crashed", "#f0ad4e", ("crashed",)),
    ("failed", "#6f42c1", ("failed",)),
)


@dataclass
class Point:
    series: str
    minute: int
    count: int
    x: float
    y: float
    #: the minute's start, Redis ms
    at_ms: int = 0


def points(per_minute: Sequence[tuple[int, dict[str, int]]]) -> list[Point]:
    """Each series' point per minute, in the chart's coordinates."""
    totals = [[sum(counts.get(k, 0) for k in kinds) for _, counts in per_minute] for _, _, kinds in SERIES]
    top = max([1, *(n for series in totals for n in series)])
    span = max(len(per_minute) - 1, 1)
    plot_w, plot_h = WIDTH - MARGIN_LEFT - 4, HEIGHT - MARGIN_BOTTOM - MARGIN_TOP
    out = []
    for (name, _, _), series in zip(SERIES, totals, strict=True):
        for i, count in enumerate(series):
            x = MARGIN_LEFT + plot_w * i / span
            y = MARGIN_TOP + plot_h * (1 - count / top)
            out.append(Point(name, i, count, round(x, 1), round(y, 1), per_minute[i][0]))
    return out


def svg(per_minute: Sequence[tuple[int, dict[str, int]]]) -> Markup:
    """The chart as an ``<svg>`` element (every value in it is a number or a fixed name)."""
    drawn = points(per_minute)
    top = max([1, *(p.count for p in drawn)])
    base = HEIGHT - MARGIN_BOTTOM
    parts = [
        f'<svg class="rq-emq-chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" '
        f'height="{HEIGHT}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>stalls, recoveries, crashes and failures per minute, last {len(per_minute)} minutes</title>",
        f'<line x1="{MARGIN_LEFT}" y1="{base}" x2="{WIDTH - 4}" y2="{base}" stroke="#999"/>',
        f'<line x1="{MARGIN_LEFT}" y1="{MARGIN_TOP}" x2="{MARGIN_LEFT}" y2="{base}" stroke="#999"/>',
        f'<text x="{MARGIN_LEFT - 4}" y="{MARGIN_TOP + 8}" font-size="10" text-anchor="end">{top}</text>',
        f'<text x="{MARGIN_LEFT - 4}" y="{base}" font-size="10" text-anchor="end">0</text>',
        f'<text x="{MARGIN_LEFT}" y="{HEIGHT - 4}" font-size="10">-{len(per_minute)} min</text>',
        f'<text x="{WIDTH - 4}" y="{HEIGHT - 4}" font-size="10" text-anchor="end">now</text>',
    ]
    for index, (name, colour, _) in enumerate(SERIES):
        mine = [p for p in drawn if p.series == name]
        path = " ".join(f"{p.x},{p.y}" for p in mine)
        parts.append(
            f'<polyline class="series-{name}" fill="none" stroke="{colour}" '
            f'stroke-width="1.5" points="{path}"/>'
        )
        for p in mine:
            if p.count:
                parts.append(
                    f'<circle class="point point-{name}" data-minute="{p.minute}" data-count="{p.count}" '
                    f'cx="{p.x}" cy="{p.y}" r="3" fill="{colour}">'
                    f"<title>{p.count} {name} at {_clock(p.at_ms)} UTC</title></circle>"
                )
        parts.append(
            f'<text x="{WIDTH - 8 - 90 * index}" y="12" font-size="11" text-anchor="end" '
            f'fill="{colour}">{escape(name)}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def _clock(at_ms: int) -> str:
    """A minute's start (Redis ms) as ``HH:MM``, UTC (Redis's clock, not the reader's)."""
    return time.strftime("%H:%M", time.gmtime(at_ms / 1000))
