"""The drawing vocabulary of the report's charts (report/svg.py): the palette, SVG elements
written by hand (coordinates to one decimal), markers, the page's fill patterns, axis ticks, and
label placement that keeps labels from overlapping each other or crossing a leader line.

Colours are the Okabe-Ito palette, distinguishable with colour-blindness.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from pytest_nvrx.evidence.refs import html_text as escape  # control characters shown too

WIDTH = 1000
FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif"

#: one colour per recovery phase (Okabe-Ito)
PHASE_COLORS: dict[str, str] = {
    "detection": "#E69F00",
    "termination": "#56B4E9",
    "gpu_reclaim": "#999933",
    "rendezvous": "#009E73",
    "worker_start": "#CC79A7",
    "checkpoint_load": "#0072B2",
    "first_step": "#D55E00",
}
#: the hatch pattern's id: defined once in the page (in the one recovery cost chart, the only
#: chart that fills with it), as ids must be unique in an HTML page
HATCH_ID = "nvrx-hatch"
UNATTRIBUTED = f"url(#{HATCH_ID})"
#: a restore the next fault of a schedule cut short: the checkpoint load's colour, striped (a
#: pattern the recovery cost chart defines beside the hatch)
RESTORING_ID = "nvrx-restoring"
RESTORING = f"url(#{RESTORING_ID})"
CYCLE_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00")
FAULT_COLOR = "#C0392B"


def fmt(value: float) -> str:
    """A coordinate: one decimal, no trailing zeros (keeps the file small)."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def svg_el(tag: str, content: str | None = None, /, **attrs: object) -> str:
    """One SVG element; attribute names use ``_`` for ``-`` (``stroke_width``), floats are
    written with one decimal."""
    parts = []
    for key, value in attrs.items():
        if value is None:
            continue
        text = fmt(value) if isinstance(value, float) else str(value)
        parts.append(f'{key.rstrip("_").replace("_", "-")}="{escape(text)}"')
    head = f"<{tag} {' '.join(parts)}"
    return f"{head}/>" if content is None else f"{head}>{content}</{tag}>"


def svg_line(x1: float, y1: float, x2: float, y2: float, color: str, **attrs: object) -> str:
    return svg_el("line", x1=x1, y1=y1, x2=x2, y2=y2, stroke=color, **attrs)


def svg_text(
    x: float,
    y: float,
    text: str,
    *,
    size: int = 12,
    anchor: str = "start",
    fill: str = "#222",
    weight: str | None = None,
) -> str:
    return svg_el(
        "text",
        escape(text),
        x=x,
        y=y,
        font_size=size,
        text_anchor=anchor,
        fill=fill,
        font_weight=weight,
    )


def mark(
    shape: str, x: float, y: float, color: str, size: float = 5.0, title: str | None = None
) -> str:
    """One marker; ``title`` becomes its hover text."""
    r = size
    edge: dict[str, object] = {"stroke": "#fff", "stroke_width": 1}
    if shape == "circle":
        body = svg_el("circle", cx=x, cy=y, r=r, fill=color, **edge)
    elif shape == "square":
        body = svg_el("rect", x=x - r, y=y - r, width=2 * r, height=2 * r, fill=color, **edge)
    elif shape == "diamond":
        d = r + 1
        corners = ((x, y - d), (x + d, y), (x, y + d), (x - d, y))
        pts = " ".join(f"{fmt(cx)},{fmt(cy)}" for cx, cy in corners)
        body = svg_el("polygon", points=pts, fill=color, **edge)
    elif shape in ("triangle", "triangle-open"):
        pts = f"{fmt(x)},{fmt(y - r)} {fmt(x + r)},{fmt(y + r)} {fmt(x - r)},{fmt(y + r)}"
        fill = "#fff" if shape == "triangle-open" else color
        body = svg_el("polygon", points=pts, fill=fill, stroke=color, stroke_width=1.5)
    elif shape in ("x", "cross"):
        w = r + (1 if shape == "cross" else 0)
        path = (
            f"M{fmt(x - w)},{fmt(y - w)}L{fmt(x + w)},{fmt(y + w)}"
            f"M{fmt(x - w)},{fmt(y + w)}L{fmt(x + w)},{fmt(y - w)}"
        )
        width = 3 if shape == "cross" else 2
        body = svg_el("path", d=path, stroke=color, stroke_width=width, fill="none")
    else:  # bar
        body = svg_el("rect", x=x - 1.5, y=y - r - 2, width=3, height=2 * r + 4, fill=color)
    tip = f"<title>{escape(title)}</title>" if title else ""
    return f"<g>{tip}{body}</g>"


def pattern_defs(restoring: bool = False) -> str:
    """The hatch pattern; ``restoring``: the struck restore's stripes too (a schedule's)."""
    stripes = (
        f'<pattern id="{RESTORING_ID}" width="8" height="8" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(-45)"><rect width="8" height="8" fill="#cfe3f1"/>'
        f'<line x1="0" y1="0" x2="0" y2="8" stroke="{PHASE_COLORS["checkpoint_load"]}" '
        'stroke-width="3"/></pattern>'
        if restoring
        else ""
    )
    return (
        f'<defs><pattern id="{HATCH_ID}" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#eee"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#999" stroke-width="2"/></pattern>'
        f"{stripes}</defs>"
    )


def svg_doc(
    height: float, body: Iterable[str], label: str, *, defs: bool = False, restoring: bool = False
) -> str:
    """One chart; ``defs``: it defines the patterns (one chart of the page may)."""
    return (
        f'<svg role="img" aria-label="{escape(label)}" '
        f'viewBox="0 0 {WIDTH} {fmt(height)}" width="100%" style="max-width:{WIDTH}px;{FONT}">'
        + (pattern_defs(restoring) if defs else "")
        + "".join(body)
        + "</svg>"
    )


def nice_ticks(lo: float, hi: float, count: int = 8) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if not math.isfinite(lo) or not math.isfinite(hi) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    return ticks


def tick_text(value: float) -> str:
    return f"{value:g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"


#: the width a character of an 11-12 px label is given (generous: labels must not collide)
CHAR_W = 6.6


def label_width(text: str) -> float:
    return len(text) * CHAR_W


#: a placed label: its level, left and right x, and its leader line's x
_Placed = tuple[int, float, float, float]


def place_labels(items: Sequence[tuple[float, float, float]], levels: int) -> list[int]:
    """A label level per item ``(left x, right x, leader line x)``, in the order given, so
    that no two labels on one level overlap and, where a level allows it, no leader line
    (running from its label down through the levels below it) crosses a label; -1: none free
    (the label is left to the hover text and the events table)."""
    placed: list[_Placed] = []
    out: list[int] = []
    for left, right, leader in items:
        label = (left, right, leader)
        level = next((i for i in range(levels) if _free(placed, (i, *label))), -1)
        if level < 0:  # a crowded corner: a dotted line across a label rather than no label
            level = next((i for i in range(levels) if _free(placed, (i, *label), False)), -1)
        if level >= 0:
            placed.append((level, *label))
        out.append(level)
    return out


def _free(placed: Sequence[_Placed], label: _Placed, uncrossed: bool = True) -> bool:
    level, left, right, leader = label
    for other, a, b, other_leader in placed:
        if other == level and a - 8 < right and left < b + 8:
            return False  # the texts overlap
        if not uncrossed:
            continue
        if other > level and a <= leader <= b:
            return False  # this leader would cross that label
        if other < level and left <= other_leader <= right:
            return False  # that leader would cross this label
    return True
