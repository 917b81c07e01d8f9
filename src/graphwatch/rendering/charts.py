"""Small charts without a JavaScript library: unicode sparklines and inline SVG line and bar charts.

Every chart is plain text: the terminal summary prints sparklines, the HTML
report inlines the SVG.  Long series are bucketed (the largest value of each
bucket is kept, so a spike never disappears).  Colours follow the snapshot
palette of DESIGN.md: saved tensors orange, backward nodes grey, findings red.

Example::

    >>> from graphwatch.rendering.charts import sparkline, line_chart
    >>> sparkline([0, 1, 2, 3, 4, 5, 6, 7])
    '▁▂▃▄▅▆▇█'
    >>> svg = line_chart([0, 1, 2], [1.0, 2.0, 4.0], title="live saved tensors", y_label="KiB")
    >>> svg.startswith("<svg") and "live saved tensors" in svg
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from .visible import html_attr

SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_ASCII = "_.-=+*#@"  # the same ramp for consoles that cannot show unicode
SPARK_GAP = " "  # steps whose value was not measured (seen light at the default level): never drawn as 0

SAVED_COLOR = "#e8890c"  # orange: saved tensors
NODES_COLOR = "#7a7a7a"  # grey: backward nodes
TIME_COLOR = "#4f8fb8"  # a deeper lightblue: time spent in backward
MARK_COLOR = "#d62728"  # red: steps with findings

_WIDTH, _HEIGHT = 380, 220
_LEFT, _RIGHT, _TOP, _BOTTOM = 58, 12, 30, 42  # plot margins for tick labels, title and axis label
_MAX_POINTS = 400  # longer series are bucketed to this many points


def bucket_max(values: Sequence[float], n: int) -> list[float]:
    """``values`` shrunk to at most ``n`` items, each the largest value of its bucket.

    >>> bucket_max([1, 5, 2, 2, 9, 0], 3)
    [5, 2, 9]
    """
    if len(values) <= n:
        return list(values)
    size = len(values) / n
    return [max(values[int(i * size) : max(int((i + 1) * size), int(i * size) + 1)]) for i in range(n)]


def _bucket_measured(values: Sequence[float | None], n: int) -> list[float | None]:
    """Like :func:`bucket_max`, None standing for a value not measured: a bucket's largest measured value, None
    when none of its values was measured."""
    if len(values) <= n:
        return list(values)
    size = len(values) / n
    buckets = (values[int(i * size) : max(int((i + 1) * size), int(i * size) + 1)] for i in range(n))
    return [max((v for v in bucket if v is not None), default=None) for bucket in buckets]


def sparkline(values: Sequence[float | None], width: int = 48) -> str:
    """One character per value (bucketed to ``width``), from lowest to highest block; a value not measured
    (None) is a gap, :data:`SPARK_GAP`, never the lowest block.

    The scale starts at zero when every value is positive, so a flat series
    of equal values shows as a flat mid-height line rather than as noise.

    >>> sparkline([3, 3, 3])
    '███'
    >>> sparkline([1, None, None, 4])
    '▃  █'
    >>> sparkline([], width=10)
    ''
    """
    points = _bucket_measured(values, width)
    measured = [v for v in points if v is not None]
    if not measured:
        return SPARK_GAP * len(points)
    low, high = min(min(measured), 0), max(measured)
    span = high - low
    top = len(SPARK_BLOCKS) - 1
    return "".join(
        SPARK_GAP if v is None else SPARK_BLOCKS[min(top, int((v - low) / span * top + 0.5)) if span > 0 else 0]
        for v in points
    )


def range_text(values: Sequence[float | None], trained: Sequence[int], fmt: Callable[[float], str]) -> str:
    """A sparkline's range: its first and last measured values among the steps ``trained`` (the last one's step
    named when a later step was not measured), and the largest measured value with its step.

    >>> range_text([7, 15, None, None], [0, 1, 2, 3], str)
    '7 → 15 at step 1 (max 15, step 1)'
    >>> range_text([None, None], [0, 1], str)
    'not measured'
    """
    known = {i: v for i, v in enumerate(values) if v is not None}
    if not known:
        return "not measured"
    ends = [i for i in known if trained[0] <= i <= trained[-1]] or list(known)
    top = max(known, key=known.__getitem__)
    at = f" at step {ends[-1]}" if ends[-1] != trained[-1] else ""
    return f"{fmt(known[ends[0]])} → {fmt(known[ends[-1]])}{at} (max {fmt(known[top])}, step {top})"


def byte_unit(largest: float) -> tuple[float, str]:
    """The divisor and unit name that make ``largest`` bytes a readable number.

    >>> byte_unit(3 * 1024 * 1024)
    (1048576, 'MiB')
    """
    for power, unit in ((3, "GiB"), (2, "MiB"), (1, "KiB")):
        if largest >= 1024**power:
            return 1024**power, unit
    return 1, "B"


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering ``[low, high]`` (steps of 1, 2 or 5 times a power of ten).

    >>> nice_ticks(0, 97), nice_ticks(0, 0.62)
    ([0, 20, 40, 60, 80, 100], [0.0, 0.2, 0.4, 0.6, 0.8])
    """
    if high <= low:
        high = low + 1
    raw = (high - low) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    ticks = [first]
    while ticks[-1] < high:
        ticks.append(first + len(ticks) * step)
    return [round(t) if step >= 1 else round(t, 10) for t in ticks]


def _tick_label(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:g}"


class _Frame:
    """Axes of one chart: maps data to pixels and draws the title, grid, ticks and labels."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float], pad: float) -> None:
        """``pad``: room left of the first x and right of the last one, in x units."""
        self.x_low, self.x_high = min(xs) - pad, max(xs) + pad
        ticks = nice_ticks(min(xs), max(xs), 6)
        self.x_ticks = [t for t in ticks if self.x_low <= t <= self.x_high and float(t).is_integer()]
        self.y_ticks = nice_ticks(min(0.0, min(ys)), max(ys) if max(ys) > 0 else 1.0, 4)
        self.y_low, self.y_high = self.y_ticks[0], self.y_ticks[-1]
        self.plot_w = _WIDTH - _LEFT - _RIGHT
        self.plot_h = _HEIGHT - _TOP - _BOTTOM

    def x(self, value: float) -> float:
        return _LEFT + (value - self.x_low) / (self.x_high - self.x_low) * self.plot_w

    def y(self, value: float) -> float:
        return _TOP + self.plot_h - (value - self.y_low) / (self.y_high - self.y_low) * self.plot_h

    def axes(self, title: str, y_label: str, x_label: str) -> list[str]:
        bottom = _TOP + self.plot_h
        parts = [
            f'<text class="chart-title" x="{_LEFT}" y="18">{html_attr(title)}</text>',
            f'<text class="axis-label" x="{_LEFT + self.plot_w / 2:.1f}" y="{_HEIGHT - 6}" '
            f'text-anchor="middle">{html_attr(x_label)}</text>',
            f'<text class="axis-label" transform="translate(14 {_TOP + self.plot_h / 2:.1f}) rotate(-90)" '
            f'text-anchor="middle">{html_attr(y_label)}</text>',
        ]
        for tick in self.y_ticks:
            y = self.y(tick)
            parts.append(f'<line class="grid" x1="{_LEFT}" x2="{_LEFT + self.plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>')
            parts.append(
                f'<text class="tick" x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_tick_label(tick)}</text>'
            )
        for tick in self.x_ticks:
            x = self.x(tick)
            parts.append(f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 4}"/>')
            parts.append(
                f'<text class="tick" x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">{_tick_label(tick)}</text>'
            )
        parts.append(f'<line class="axis" x1="{_LEFT}" x2="{_LEFT + self.plot_w}" y1="{bottom}" y2="{bottom}"/>')
        parts.append(f'<line class="axis" x1="{_LEFT}" x2="{_LEFT}" y1="{_TOP}" y2="{bottom}"/>')
        return parts

    def marks(self, marks: dict[int, str]) -> list[str]:
        parts = []
        for step, note in sorted(marks.items()):
            if not self.x_low <= step <= self.x_high:
                continue
            x = self.x(step)
            parts.append(
                f'<g class="mark"><title>{html_attr(f"step {step}: {note}")}</title>'
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_TOP}" y2="{_TOP + self.plot_h}" stroke="{MARK_COLOR}" '
                f'stroke-dasharray="3 3"/><path d="M{x - 4:.1f},{_TOP - 6} h8 l-4,6 z" fill="{MARK_COLOR}"/></g>'
            )
        return parts


def _bucketed(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    if len(xs) <= _MAX_POINTS:
        return list(xs), list(ys)
    size = len(xs) / _MAX_POINTS
    # each bucket sits at its first x, the last one at the last x: the axis spans the whole run
    places = [xs[int(i * size)] for i in range(_MAX_POINTS - 1)] + [xs[-1]]
    return places, bucket_max(ys, _MAX_POINTS)


def _svg(title: str, parts: Iterable[str]) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {_WIDTH} {_HEIGHT}" width="{_WIDTH}" height="{_HEIGHT}" role="img" '
        f'aria-label="{html_attr(title)}">' + "".join(parts) + "</svg>"
    )


def line_chart(
    xs: Sequence[float],
    ys: Sequence[float],
    *,
    title: str,
    y_label: str,
    x_label: str = "step",
    color: str = SAVED_COLOR,
    marks: dict[int, str] | None = None,
) -> str:
    """An SVG line chart (with a light fill under the line) of ``ys`` over ``xs``.

    ``marks`` maps x values (steps) to a note; each is drawn as a red dashed
    line with the note as its tooltip.

    >>> "<polyline" in line_chart([0, 1], [0, 5], title="t", y_label="nodes")
    True
    """
    if not xs:
        raise ValueError("line_chart needs at least one point")
    xs, ys = _bucketed(xs, ys)
    frame = _Frame(xs, ys, pad=0.5 if len(xs) == 1 else 0.0)
    points = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in zip(xs, ys))
    base = frame.y(max(frame.y_low, 0))
    area = f"{frame.x(xs[0]):.1f},{base:.1f} {points} {frame.x(xs[-1]):.1f},{base:.1f}"
    series = [
        f'<polygon points="{area}" fill="{color}" fill-opacity="0.15"/>',
        f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2" stroke-linejoin="round"/>',
    ]
    if len(xs) == 1:
        series.append(f'<circle cx="{frame.x(xs[0]):.1f}" cy="{frame.y(ys[0]):.1f}" r="3.5" fill="{color}"/>')
    return _svg(title, frame.axes(title, y_label, x_label) + series + frame.marks(marks or {}))


def bar_chart(
    xs: Sequence[float],
    ys: Sequence[float],
    *,
    title: str,
    y_label: str,
    x_label: str = "step",
    color: str = TIME_COLOR,
    marks: dict[int, str] | None = None,
) -> str:
    """An SVG bar chart, one bar per x value (bucketed on long runs), each with its value as tooltip.

    >>> bar_chart([0, 1, 2], [1.5, 0.5, 2.0], title="backward time", y_label="ms").count("<rect")
    3
    """
    if not xs:
        raise ValueError("bar_chart needs at least one point")
    xs, ys = _bucketed(xs, ys)
    spacing = (xs[-1] - xs[0]) / (len(xs) - 1) if len(xs) > 1 else 1.0  # x units per bar (a bucket on long runs)
    frame = _Frame(xs, ys, pad=spacing / 2)
    slot = spacing * frame.plot_w / (frame.x_high - frame.x_low)
    width = max(slot * (0.7 if len(xs) < 60 else 1.0), 0.8)
    base = frame.y(max(frame.y_low, 0))
    bars = []
    for x, y in zip(xs, ys):
        top = frame.y(y)
        bars.append(
            f'<rect x="{frame.x(x) - width / 2:.1f}" y="{min(top, base):.1f}" width="{width:.1f}" '
            f'height="{abs(base - top):.1f}" fill="{color}"><title>{html_attr(f"{x_label} {x:g}: {y:g} {y_label}")}'
            "</title></rect>"
        )
    return _svg(title, frame.axes(title, y_label, x_label) + bars + frame.marks(marks or {}))
