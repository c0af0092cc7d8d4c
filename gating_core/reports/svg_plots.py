"""The report's plots drawn as inline ``<svg>`` elements, so a report needs no plotting library
or static export: a scatter plot with gate outlines and quadrant splits, a histogram with range
bands, in a fixed frame of 360 x 300 px. Every text drawn is HTML-escaped.
"""

from __future__ import annotations

import html

import numpy as np

__all__ = ["svg_scatter", "svg_histogram"]

_W, _H = 360, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 48, 10, 24, 40


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _svg_frame(title, x_label, y_label, pw, ph, clip_id) -> list:
    """The opening of a report plot: the svg element, the plot area, title and axis labels, and
    a group clipped to the plot area (closed by the caller)."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
            f'role="img" aria-label="{_e(title)}">',
            f'<rect x="{_LEFT}" y="{_TOP}" width="{pw}" height="{ph}" fill="#fff" stroke="#888"/>',
            f'<text x="{_W / 2}" y="15" text-anchor="middle" font-size="12">{_e(title)}</text>',
            f'<text x="{_LEFT + pw / 2}" y="{_H - 8}" text-anchor="middle" font-size="11">{_e(x_label)}</text>',
            f'<text x="12" y="{_TOP + ph / 2}" text-anchor="middle" font-size="11" '
            f'transform="rotate(-90 12 {_TOP + ph / 2})">{_e(y_label)}</text>',
            f'<clipPath id="{_e(clip_id)}"><rect x="{_LEFT}" y="{_TOP}" width="{pw}" height="{ph}"/></clipPath>',
            f'<g clip-path="url(#{_e(clip_id)})">']


def _axis_ticks(x_range, y_range, pw, ph, x_ticks, y_ticks) -> list:
    """Tick marks and their labels outside the plot area. ``x_ticks`` / ``y_ticks``: (positions in
    display coordinates, labels), as :func:`gating_core.reports.plotting.raw_ticks` gives them, so a
    transformed axis is read in the channel's own units; None: the axis' two ends, as numbers."""
    parts, marks = [], []
    for ticks, (lo, hi), horizontal in ((x_ticks, x_range, True), (y_ticks, y_range, False)):
        lo, hi = float(lo), float(hi)
        if ticks is None:
            ticks = ([lo, hi], [f"{lo:.3g}", f"{hi:.3g}"])
        for value, text in zip(*ticks):
            if not (hi > lo and lo <= float(value) <= hi):
                continue
            share = (float(value) - lo) / (hi - lo)
            if horizontal:
                at = _LEFT + share * pw
                anchor = "start" if share < 0.02 else "end" if share > 0.98 else "middle"
                marks.append(f"M{at:.1f} {_TOP + ph}v3")
                parts.append(f'<text x="{at:.1f}" y="{_TOP + ph + 12}" text-anchor="{anchor}" font-size="9" '
                             f'fill="#555">{_e(text)}</text>')
            else:
                at = _TOP + ph - share * ph
                marks.append(f"M{_LEFT - 3} {at:.1f}h3")
                parts.append(f'<text x="{_LEFT - 5}" y="{min(max(at + 3, _TOP + 8), _TOP + ph):.1f}" '
                             f'text-anchor="end" font-size="9" fill="#555">{_e(text)}</text>')
    if marks:
        parts.insert(0, f'<path fill="none" stroke="#888" d="{"".join(marks)}"/>')
    return parts


def svg_scatter(x, y, colors, x_range, y_range, *, title: str = "", x_label: str = "", y_label: str = "",
                outlines=(), legend=None, clip_id: str = "clip", splits=(), x_ticks=None, y_ticks=None) -> str:
    """A scatter plot as an inline ``<svg>`` element.

    x, y : arrays (m,) in display coordinates; colors : array (m,) of "#rrggbb" strings;
    x_range, y_range : (lo, hi) of the axes; outlines : list of (name, (k, 2) array, text)
    polygons drawn over the dots with their name and a text (e.g. "12.3% of parent");
    legend : dict name -> color; clip_id : id of the plot area's clip path (unique per page);
    splits : list of ((x, y), {quadrant code: text}) quadrant splits, each drawn as its two
    dividing lines with every quadrant's text in its corner ("++": top right, "-+": top left...);
    x_ticks, y_ticks : (positions, labels) of each axis' ticks (:func:`_axis_ticks`).
    Dots are 1.6 px squares, one path per colour.
    """
    x0, x1 = float(x_range[0]), float(x_range[1])
    y0, y1 = float(y_range[0]), float(y_range[1])
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    sx = pw / (x1 - x0) if x1 > x0 else 1.0
    sy = ph / (y1 - y0) if y1 > y0 else 1.0

    def px(v):
        return _LEFT + (np.asarray(v, dtype=np.float64) - x0) * sx

    def py(v):
        return _TOP + ph - (np.asarray(v, dtype=np.float64) - y0) * sy

    parts = _svg_frame(title, x_label, y_label, pw, ph, clip_id)
    xs, ys = px(x), py(y)
    colors = np.asarray(colors).astype(str)
    ok = np.isfinite(xs) & np.isfinite(ys)
    for color in dict.fromkeys(colors.tolist()):
        pick = ok & (colors == color)
        if not pick.any():
            continue
        path = "".join(f"M{a:.1f} {b:.1f}h1.6v1.6h-1.6z" for a, b in zip(xs[pick], ys[pick]))
        parts.append(f'<path fill="{_e(color)}" fill-opacity="0.7" d="{path}"/>')
    for name, outline, text in outlines:
        outline = np.asarray(outline, dtype=np.float64)
        points = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px(outline[:, 0]), py(outline[:, 1])))
        parts.append(f'<polygon points="{points}" fill="none" stroke="#C00000" stroke-width="1.5"/>')
        cx = float(np.clip(px(outline[:, 0]).mean(), _LEFT + 4, _LEFT + pw - 4))
        cy = float(np.clip(py(outline[:, 1]).min() - 4, _TOP + 10, _TOP + ph - 4))
        parts.append(f'<text x="{cx:.1f}" y="{cy:.1f}" text-anchor="middle" font-size="10" fill="#C00000">'
                     f'{_e(name)} {_e(text)}</text>')
    for (sx_, sy_), texts in splits:
        cx, cy = float(px(sx_)), float(py(sy_))
        parts.append(f'<line x1="{cx:.1f}" y1="{_TOP}" x2="{cx:.1f}" y2="{_TOP + ph}" stroke="#C00000" '
                     f'stroke-width="1.5"/><line x1="{_LEFT}" y1="{cy:.1f}" x2="{_LEFT + pw}" y2="{cy:.1f}" '
                     f'stroke="#C00000" stroke-width="1.5"/>')
        for code, text in texts.items():
            right, top = code[0] == "+", code[1] == "+"
            tx = _LEFT + pw - 4 if right else _LEFT + 4
            ty = _TOP + 12 if top else _TOP + ph - 5
            parts.append(f'<text x="{tx}" y="{ty}" text-anchor="{"end" if right else "start"}" font-size="10" '
                         f'fill="#C00000">{_e(text)}</text>')
    parts.append("</g>")
    parts += _axis_ticks((x0, x1), (y0, y1), pw, ph, x_ticks, y_ticks)
    if legend:
        for k, (name, color) in enumerate(legend.items()):
            parts.append(f'<rect x="{_LEFT + 4}" y="{_TOP + 4 + 11 * k}" width="8" height="8" fill="{_e(color)}"/>'
                         f'<text x="{_LEFT + 15}" y="{_TOP + 11 + 11 * k}" font-size="9">{_e(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def svg_histogram(values, value_range, *, title: str = "", x_label: str = "", bands=(), bins: int = 120,
                  clip_id: str = "clip", x_ticks=None) -> str:
    """A histogram of one channel as an inline ``<svg>`` element, with range gates as bands.

    values : array (n,) in display coordinates; value_range : (lo, hi) of the axis;
    bands : list of (name, low, high, text), each shaded from low to high and named;
    x_ticks : (positions, labels) of the axis' ticks (:func:`_axis_ticks`).
    """
    x0, x1 = float(value_range[0]), float(value_range[1])
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    sx = pw / (x1 - x0) if x1 > x0 else 1.0
    values = np.asarray(values, dtype=np.float64)
    counts, edges = np.histogram(values[np.isfinite(values)], bins=bins, range=(x0, x1))
    top = max(int(counts.max()) if counts.size else 0, 1)

    def px(v):
        return _LEFT + (float(v) - x0) * sx

    parts = _svg_frame(title, x_label, "events", pw, ph, clip_id)
    for k, (name, low, high, text) in enumerate(bands):
        a, b = px(low), px(high)
        parts.append(f'<rect x="{a:.1f}" y="{_TOP}" width="{max(b - a, 0.5):.1f}" height="{ph}" fill="#C00000" '
                     f'fill-opacity="0.12" stroke="#C00000" stroke-width="1.2"/>')
        cx = float(np.clip((a + b) / 2, _LEFT + 4, _LEFT + pw - 4))
        parts.append(f'<text x="{cx:.1f}" y="{_TOP + 12 + 11 * k}" text-anchor="middle" font-size="10" '
                     f'fill="#C00000">{_e(name)} {_e(text)}</text>')
    base = _TOP + ph
    path = [f"M{px(edges[0]):.1f} {base}"]
    for count, left, right in zip(counts, edges[:-1], edges[1:]):
        y = base - ph * count / top
        path.append(f"L{px(left):.1f} {y:.1f}L{px(right):.1f} {y:.1f}")
    path.append(f"L{px(edges[-1]):.1f} {base}Z")
    parts.append(f'<path fill="#3B5B92" fill-opacity="0.5" stroke="#3B5B92" d="{"".join(path)}"/>')
    parts.append("</g>")
    parts += _axis_ticks((x0, x1), (0, 1), pw, ph, x_ticks, ([], []))
    parts.append(f'<text x="{_LEFT - 3}" y="{_TOP + 8}" text-anchor="end" font-size="9" fill="#555">{top:,}</text>')
    parts.append("</svg>")
    return "".join(parts)
