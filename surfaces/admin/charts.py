"""Server-drawn SVG charts for the admin (no script, no CDN, no inline style: colours are SVG
presentation attributes, which the strict CSP allows). Each chart is drawn next to a table of the same
numbers in the template."""

from __future__ import annotations

from collections.abc import Sequence

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT, PAD_LEFT, PAD_BOTTOM, PAD_TOP = 640, 180, 64, 28, 10


def stacked_bars(
    labels: Sequence[str], series: Sequence[tuple[str, Sequence[float], str]], *, title: str, unit: str = ""
) -> SafeString:
    """Vertical bars per label, stacked by series (name, values, fill colour), with a y-axis maximum and
    a legend; `title` is the SVG's accessible name."""
    n = max(1, len(labels))
    totals = [sum(float(s[1][i] or 0) for s in series) for i in range(len(labels))]
    top = max(totals, default=0) or 1
    plot_w, plot_h = WIDTH - PAD_LEFT - 8, HEIGHT - PAD_BOTTOM - PAD_TOP
    slot = plot_w / n
    bar_w = max(2.0, slot * 0.7)
    rects = []
    for i, label in enumerate(labels):
        y = PAD_TOP + plot_h
        x = PAD_LEFT + i * slot + (slot - bar_w) / 2
        for name, values, colour in series:
            v = float(values[i] or 0)
            if v <= 0:
                continue
            h = v / top * plot_h
            y -= h
            rects.append(
                (
                    f"{x:.1f}",
                    f"{y:.1f}",
                    f"{bar_w:.1f}",
                    f"{h:.1f}",
                    colour,
                    f"{label} {name}: {_amount(v, unit)}",
                )
            )
    bars = format_html_join(
        "",
        '<rect x="{}" y="{}" width="{}" height="{}" fill="{}"><title>{}</title></rect>',
        rects,
    )
    every = max(1, len(labels) // 10)
    ticks = format_html_join(
        "",
        '<text x="{}" y="{}" font-size="10" text-anchor="middle" fill="#555">{}</text>',
        (
            (f"{PAD_LEFT + i * slot + slot / 2:.1f}", HEIGHT - 10, _tick(label))
            for i, label in enumerate(labels)
            if i % every == 0
        ),
    )
    legend = _legend(series)
    return format_html(
        '<svg class="dc-chart" role="img" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
        'xmlns="http://www.w3.org/2000/svg"><title>{title}</title>'
        '<line x1="{pl}" y1="{base}" x2="{w}" y2="{base}" stroke="#999"/>'
        '<text x="{tx}" y="{ty}" font-size="10" text-anchor="end" fill="#555">{top}{unit}</text>'
        '<text x="{tx}" y="{base}" font-size="10" text-anchor="end" fill="#555">0</text>'
        '{bars}{ticks}<g transform="translate(0,{lg})">{legend}</g></svg>',
        w=WIDTH,
        h=HEIGHT + 14,
        title=title,
        pl=PAD_LEFT,
        base=PAD_TOP + plot_h,
        tx=PAD_LEFT - 4,
        ty=PAD_TOP + 8,
        top=_amount(top, unit),
        unit="",
        bars=bars,
        ticks=ticks,
        legend=legend,
        lg=HEIGHT + 2,
    )


def _legend(series):
    """The chart's legend: a swatch and the name of each series, one after another."""
    return format_html_join(
        "",
        '<rect x="{}" y="0" width="10" height="10" fill="{}"/>'
        '<text x="{}" y="9" font-size="10" fill="#333">{}</text>',
        ((x, colour, x + 14, name) for x, (name, _v, colour) in zip(_legend_x(series), series, strict=True)),
    )


def _legend_x(series) -> list[int]:
    """Each legend entry's x: after the previous one's text (about 6 px a character at 10 px)."""
    xs, x = [], PAD_LEFT
    for name, _v, _c in series:
        xs.append(x)
        x += 24 + 6 * len(name)
    return xs


def _amount(value: float, unit: str) -> str:
    if unit == "$":
        return f"${value:.4g}"
    return f"{value:,.0f}{unit}" if value >= 10 else f"{value:.3g}{unit}"


def _tick(label: str) -> str:
    """A day as MM-DD; any other label as it is (shortened)."""
    if len(label) == 10 and label[4] == "-" and label[7] == "-":
        return label[5:]
    return label if len(label) <= 18 else label[:17] + "…"


def empty_chart(text: str) -> SafeString:
    return mark_safe(format_html('<p class="dc-quiet">{}</p>', text))  # noqa: S308 (escaped by format_html)


def lines(
    labels: Sequence[str],
    series: Sequence[tuple[str, Sequence[float | None], str]],
    *,
    title: str,
    top: float = 1.0,
) -> SafeString:
    """One polyline per series (name, values with None for no value, colour) over 0 … `top`, a dot per
    value with its number as a tooltip, and a legend; `title` is the SVG's accessible name."""
    n = max(1, len(labels))
    plot_w, plot_h = WIDTH - PAD_LEFT - 8, HEIGHT - PAD_BOTTOM - PAD_TOP
    slot = plot_w / n
    base = PAD_TOP + plot_h

    def xy(i: int, v: float) -> tuple[str, str]:
        return f"{PAD_LEFT + i * slot + slot / 2:.1f}", f"{base - min(max(v, 0.0), top) / top * plot_h:.1f}"

    shapes = []
    for name, values, colour in series:
        points = [(i, float(v)) for i, v in enumerate(values) if v is not None]
        if len(points) > 1:
            path = " ".join(",".join(xy(i, v)) for i, v in points)
            shapes.append(
                format_html('<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>', path, colour)
            )
        for i, v in points:
            x, y = xy(i, v)
            shapes.append(
                format_html(
                    '<circle cx="{}" cy="{}" r="3" fill="{}"><title>{} {}: {}</title></circle>',
                    x,
                    y,
                    colour,
                    labels[i],
                    name,
                    f"{v:.2f}",
                )
            )
    every = max(1, len(labels) // 10)
    ticks = format_html_join(
        "",
        '<text x="{}" y="{}" font-size="10" text-anchor="middle" fill="#555">{}</text>',
        ((xy(i, 0)[0], HEIGHT - 10, _tick(label)) for i, label in enumerate(labels) if i % every == 0),
    )
    legend = _legend(series)
    return format_html(
        '<svg class="dc-chart" role="img" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
        'xmlns="http://www.w3.org/2000/svg"><title>{title}</title>'
        '<line x1="{pl}" y1="{base}" x2="{w}" y2="{base}" stroke="#999"/>'
        '<text x="{tx}" y="{ty}" font-size="10" text-anchor="end" fill="#555">{top}</text>'
        '<text x="{tx}" y="{base}" font-size="10" text-anchor="end" fill="#555">0</text>'
        '{shapes}{ticks}<g transform="translate(0,{lg})">{legend}</g></svg>',
        w=WIDTH,
        h=HEIGHT + 14,
        title=title,
        pl=PAD_LEFT,
        base=base,
        tx=PAD_LEFT - 4,
        ty=PAD_TOP + 8,
        top=f"{top:g}",
        shapes=format_html_join("", "{}", ((shape,) for shape in shapes)),
        ticks=ticks,
        legend=legend,
        lg=HEIGHT + 2,
    )
