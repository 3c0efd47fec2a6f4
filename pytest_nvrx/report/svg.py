"""The report's three charts as inline SVG, drawn by hand: timeline, loss curve, recovery cost.

Plain SVG written here rather than matplotlib or plotly: no dependency (matplotlib and plotly
would add 10-50 MB to an install that runs beside a training stack), nothing to fetch (the page
opens from disk, offline), a few kilobytes per chart, and text that stays crisp at any zoom and
can be searched and copied. The charts are simple enough (bars, markers, polylines) that a few
hundred lines draw them; colours are the Okabe-Ito palette, distinguishable with colour-blindness.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from pytest_nvrx.evidence.refs import html_text as escape  # control characters shown too
from pytest_nvrx.report.loss import LossPoint
from pytest_nvrx.report.model import PHASES, ScenarioReport
from pytest_nvrx.report.recovery import Recovery
from pytest_nvrx.report.svg_shapes import (
    CYCLE_COLORS,
    FAULT_COLOR,
    PHASE_COLORS,
    RESTORING,
    UNATTRIBUTED,
    WIDTH,
    fmt,
    label_width,
    mark,
    nice_ticks,
    place_labels,
    svg_doc,
    svg_el,
    svg_line,
    svg_text,
    tick_text,
)
from pytest_nvrx.report.timeline_data import EVENT_KINDS, TimelineEvent

# marker shape and colour per timeline event kind
_MARKS: dict[str, tuple[str, str]] = {
    "fault": ("cross", FAULT_COLOR),
    "failure": ("x", FAULT_COLOR),
    "detected": ("diamond", "#E69F00"),
    "workers_terminated": ("square", "#333333"),
    "rendezvous": ("circle", "#009E73"),
    "workers_started": ("triangle", "#0072B2"),
    "checkpoint_loaded": ("diamond", "#0072B2"),
    "first_step": ("circle", "#D55E00"),
    "save_submitted": ("triangle-open", "#555555"),
    "save_finalized": ("triangle", "#555555"),
    "decision": ("bar", "#7B3294"),
}


# ----------------------------------------------------------------------------------------------
# Timeline

_LABELLED = (
    "fault",
    "detected",
    "workers_terminated",
    "workers_started",
    "checkpoint_loaded",
    "first_step",
)
_LANE_OF = {
    "failure": "launcher",
    "decision": "launcher",
    "detected": "restart",
    "workers_terminated": "restart",
    "rendezvous": "restart",
    "workers_started": "restart",
    "save_submitted": "checkpoints",
    "save_finalized": "checkpoints",
    "checkpoint_loaded": "checkpoints",
    "first_step": "checkpoints",
}
MAX_RANK_ROWS = 8


def timeline_svg(report: ScenarioReport) -> str:
    """Cycles per rank as bars, the fault window shaded, every milestone as a marker."""
    timeline = report.timeline
    end = timeline.end_s or max((e.t_s for e in timeline.events), default=1.0)
    end = max(end, 1.0)
    left, right = 130.0, 20.0
    plot_w = WIDTH - left - right

    def x(t: float) -> float:
        return left + max(0.0, min(t, end)) / end * plot_w

    ranks = sorted({r for c in timeline.cycles for r in c.ranks}) or [0]
    hidden = 0
    if len(ranks) > MAX_RANK_ROWS:
        shown = ranks[: MAX_RANK_ROWS - 1]
        if timeline.fault_rank is not None and timeline.fault_rank not in shown:
            shown[-1] = timeline.fault_rank
        hidden = len(ranks) - len(shown)
        ranks = sorted(shown)
    # labels for the recovery's milestones, above the plot, staggered so that none overlap
    labelled = [e for e in timeline.events if e.kind in _LABELLED]
    seen: set[str] = set()
    unique = []
    for e in labelled:  # the first of each kind after the fault (or the first at all)
        key = e.kind
        if key in seen:
            continue
        if (
            timeline.fault_window is not None
            and e.t_s < timeline.fault_window[0] - 1e-6
            and e.kind != "fault"
        ):
            continue
        seen.add(key)
        unique.append(e)
    texts = [f"{EVENT_KINDS[e.kind]} {e.t_s:.1f}s" for e in unique]
    # a label starts right of its leader line, shifted left where it would run past the
    # chart's right edge (a milestone late in the run: the recovery's last ones)
    starts = [
        min(x(e.t_s) + 3, WIDTH - 4 - label_width(text))
        for e, text in zip(unique, texts, strict=True)
    ]
    levels = place_labels(
        [
            (start, start + label_width(text), x(e.t_s))
            for e, text, start in zip(unique, texts, starts, strict=True)
        ],
        len(_LABELLED),
    )
    # four rows of labels, more where a crowded recovery needs them (rather than leaving a
    # label to the hover text)
    label_levels = max([4, *(level + 1 for level in levels)])
    top = 22.0 + label_levels * 15
    row_h = 26.0
    lanes = ["launcher", "restart", *(f"rank {r}" for r in ranks), "checkpoints"]
    lane_y = {lane: top + i * row_h + row_h / 2 for i, lane in enumerate(lanes)}
    bottom = top + len(lanes) * row_h
    height = bottom + 40 + (14 if hidden else 0)
    out: list[str] = []
    for i, lane in enumerate(lanes):
        y0 = top + i * row_h
        if i % 2 == 0:
            out.append(svg_el("rect", x=left, y=y0, width=plot_w, height=row_h, fill="#f6f6f6"))
        name = lane + (" ✕" if lane == f"rank {timeline.fault_rank}" else "")
        out.append(
            svg_text(
                left - 8,
                y0 + row_h / 2 + 4,
                name,
                anchor="end",
                size=12,
                fill=FAULT_COLOR if "✕" in name else "#222",
            )
        )
    shaded = timeline.fault_windows or (
        (timeline.fault_window,) if timeline.fault_window is not None else ()
    )
    for a, b in shaded:  # a schedule's: one per fault
        out.append(
            svg_el(
                "rect",
                x=x(a),
                y=top - 4,
                width=max(1.0, x(b) - x(a)),
                height=bottom - top + 8,
                fill=FAULT_COLOR,
                fill_opacity=0.1,
                stroke=FAULT_COLOR,
                stroke_opacity=0.35,
            )
        )
    # cycles per rank
    for c in timeline.cycles:
        if c.start_s is None:
            continue
        color = CYCLE_COLORS[c.cycle % len(CYCLE_COLORS)]
        x0 = x(c.start_s)
        x1 = x(c.end_s if c.end_s is not None else end)
        its = (
            f"it {c.first_iteration}-{c.last_iteration}"
            if c.first_iteration is not None
            else "no iteration"
        )
        caption = f"cycle {c.cycle}: {its}"
        for r in c.ranks or ranks:
            if r not in ranks:
                continue
            y = lane_y[f"rank {r}"]
            tip = f"<title>{escape(caption)} (rank {r})</title>"
            out.append(
                svg_el(
                    "rect",
                    tip,
                    x=x0,
                    y=y - 8,
                    width=max(1.0, x1 - x0),
                    height=16,
                    rx=3,
                    fill=color,
                    fill_opacity=0.85,
                )
            )
            if x1 - x0 > len(caption) * 6.6 + 10:
                out.append(svg_text(x0 + 6, y + 4, caption, size=11, fill="#fff", weight="bold"))
    # events
    for e in timeline.events:
        shape, color = _MARKS.get(e.kind, ("circle", "#000"))
        tip = f"{e.t_s:.3f} s: {e.label}" + (f" [{e.ref}]" if e.ref else "")
        if e.kind == "fault":
            out.append(
                svg_line(x(e.t_s), top - 4, x(e.t_s), bottom + 4, FAULT_COLOR, stroke_width=2)
            )
            lane = f"rank {e.rank}" if f"rank {e.rank}" in lane_y else "launcher"
        else:
            lane = _LANE_OF.get(e.kind, "launcher")
        out.append(mark(shape, x(e.t_s), lane_y[lane], color, 5.5, tip))
    # the milestones' labels, placed above
    for e, text, start, level in zip(unique, texts, starts, levels, strict=True):
        if level < 0:
            continue
        px = x(e.t_s)
        y = 16 + level * 15
        color = _MARKS.get(e.kind, ("", "#222"))[1]
        out.append(svg_line(px, y + 3, px, top - 4, color, stroke_dasharray="2,2"))
        out.append(
            svg_text(
                start,
                y,
                text,
                size=11,
                fill=color if color != "#E69F00" else "#9a6700",
                weight="bold",
            )
        )
    # axis
    out.append(svg_line(left, bottom, left + plot_w, bottom, "#444"))
    for t in nice_ticks(0.0, end, 10):
        out.append(svg_line(x(t), bottom, x(t), bottom + 4, "#444"))
        out.append(svg_text(x(t), bottom + 16, tick_text(t), size=11, anchor="middle"))
    out.append(
        svg_text(
            left + plot_w,
            bottom + 32,
            "seconds since launcher start",
            size=11,
            anchor="end",
            fill="#555",
        )
    )
    if hidden:
        out.append(
            svg_text(
                left,
                bottom + 46,
                f"{hidden} more ranks not drawn (same cycles)",
                size=11,
                fill="#555",
            )
        )
    return svg_doc(height, out, f"timeline of {report.name}")


def timeline_legend_svg(kinds: Iterable[str], window: bool = True) -> str:
    """The markers used, with their names, in one row (wrapping)."""
    out: list[str] = []
    px, py = 10.0, 16.0
    for kind in kinds:
        shape, color = _MARKS[kind]
        label = EVENT_KINDS[kind]
        w = 26 + len(label) * 6.6
        if px + w > WIDTH:
            px, py = 10.0, py + 20
        out.append(mark(shape, px + 6, py - 4, color, 5))
        out.append(svg_text(px + 16, py, label, size=12))
        px += w + 10
    if window:
        window_label = "fault window (fault → first committed step)"
        if px + 40 + len(window_label) * 6.6 > WIDTH:
            px, py = 10.0, py + 20
        out.append(
            svg_el(
                "rect",
                x=px,
                y=py - 12,
                width=22,
                height=12,
                fill=FAULT_COLOR,
                fill_opacity=0.12,
                stroke=FAULT_COLOR,
                stroke_opacity=0.4,
            )
        )
        out.append(svg_text(px + 28, py, window_label, size=12))
    return svg_doc(py + 8, out, "timeline legend")


# ----------------------------------------------------------------------------------------------
# Loss curve


def loss_svg(report: ScenarioReport, baseline: ScenarioReport | None) -> str | None:
    """The run's loss per iteration over the baseline's; replayed iterations circled."""
    points = report.loss.points
    base = baseline.loss.points if baseline is not None else ()
    if not points:
        return None
    every = [*points, *base]
    lo_i = min(p.iteration for p in every)
    hi_i = max(p.iteration for p in every)
    lo_v = min(p.loss for p in every)
    hi_v = max(p.loss for p in every)
    if hi_i == lo_i:
        hi_i = lo_i + 1
    pad = (hi_v - lo_v) * 0.08 or 0.5
    lo_v, hi_v = lo_v - pad, hi_v + pad
    left, right, top, height = 70.0, 20.0, 34.0, 300.0
    bottom = height - 44
    plot_w = WIDTH - left - right

    def x(i: float) -> float:
        return left + (i - lo_i) / (hi_i - lo_i) * plot_w

    def y(v: float) -> float:
        return bottom - (v - lo_v) / (hi_v - lo_v) * (bottom - top)

    out: list[str] = []
    for v in nice_ticks(lo_v, hi_v, 5):
        out.append(svg_line(left, y(v), left + plot_w, y(v), "#e4e4e4"))
        out.append(svg_text(left - 6, y(v) + 4, tick_text(v), size=11, anchor="end"))
    for i in nice_ticks(lo_i, hi_i, 10):
        if abs(i - round(i)) > 1e-9:
            continue
        out.append(svg_line(x(i), bottom, x(i), bottom + 4, "#444"))
        out.append(svg_text(x(i), bottom + 16, f"{int(i)}", size=11, anchor="middle"))
    out.append(svg_line(left, bottom, left + plot_w, bottom, "#444"))
    out.append(
        svg_text(left + plot_w, bottom + 32, "iteration", size=11, anchor="end", fill="#555")
    )
    out.append(svg_text(14, top - 14, "loss", size=11, fill="#555"))
    restored = {
        rec.lost_work.restored_iteration
        for rec in report.fault_recoveries
        if rec.lost_work.restored_iteration is not None
    }  # a schedule's every restore (one line where several restored one checkpoint)
    for r in sorted(restored):
        if lo_i <= r <= hi_i:
            out.append(svg_line(x(r), top, x(r), bottom, FAULT_COLOR, stroke_dasharray="4,3"))
            text = f"restored {r}"
            inside = x(r) + 4 + label_width(text) <= WIDTH
            out.append(
                svg_text(
                    x(r) + 4 if inside else x(r) - 4,
                    top + 10,
                    text,
                    size=11,
                    anchor="start" if inside else "end",
                    fill=FAULT_COLOR,
                )
            )
    # a line that printed a mean over earlier iterations too (#6237) is no point of the curve:
    # drawn apart, hollow, so that a replay the criteria found equal does not seem to depart
    if base:
        out += _curve(base, x, y, "#888", 5.0, 0.55)
    cycles = sorted({p.cycle for p in points})
    for cycle in cycles:
        mine = [p for p in points if p.cycle == cycle]
        out += _curve(mine, x, y, CYCLE_COLORS[cycle % len(CYCLE_COLORS)], 1.8)
    means = [(p, "#888") for p in base if p.mean_from is not None] + [
        (p, CYCLE_COLORS[p.cycle % len(CYCLE_COLORS)]) for p in points if p.mean_from is not None
    ]
    for p, color in means:
        whose = "baseline" if color == "#888" else f"cycle {p.cycle}"
        tip = (
            f"{whose}, iteration {p.iteration}: printed {p.loss:g}, the mean of iterations "
            f"{p.mean_from}-{p.iteration} (Megatron-LM #6237), not this iteration's loss"
        )
        out.append(_mean_mark(x(p.iteration), y(p.loss), color, tip))
    replayed = [p for p in points if p.replayed]
    small = len(points) > 400
    for p in replayed:
        tip = f"<title>replayed iteration {p.iteration} (cycle {p.cycle}): loss {p.loss:g}</title>"
        radius = 2.5 if small else 4.0
        out.append(
            svg_el(
                "circle",
                tip,
                cx=x(p.iteration),
                cy=y(p.loss),
                r=radius,
                fill="none",
                stroke="#111",
                stroke_width=1.2,
            )
        )
    # legend, top right
    entries: list[tuple[str, str]] = []
    if base and baseline is not None:
        entries.append((f"baseline ({baseline.name})", "#888"))
    entries += [(f"cycle {c}", CYCLE_COLORS[c % len(CYCLE_COLORS)]) for c in cycles]
    px = left + 8
    for label, color in entries:
        width = 5.0 if color == "#888" else 2.5
        out.append(svg_line(px, top - 18, px + 22, top - 18, color, stroke_width=width))
        out.append(svg_text(px + 28, top - 14, label, size=12))
        px += 40 + len(label) * 6.6
    if replayed:
        out.append(
            svg_el(
                "circle", cx=px + 6, cy=top - 18, r=4, fill="none", stroke="#111", stroke_width=1.2
            )
        )
        out.append(svg_text(px + 16, top - 14, f"replayed iterations ({len(replayed)})", size=12))
    if means:  # under the axis, left, where a long legend row cannot push it off the chart
        out.append(_mean_mark(left + 6, bottom + 28, "#555"))
        label = "#6237 mean, not this iteration's loss (a process's second line)"
        out.append(svg_text(left + 16, bottom + 32, label, size=12))
    return svg_doc(height, out, f"loss curve of {report.name}")


def _mean_mark(cx: float, cy: float, color: str, title: str | None = None) -> str:
    """A hollow square: a printed value that is a window's mean, not the iteration's own."""
    tip = f"<title>{escape(title)}</title>" if title else None
    return svg_el(
        "rect",
        tip,
        x=cx - 4.0,
        y=cy - 4.0,
        width=8,
        height=8,
        fill="#fff",
        stroke=color,
        stroke_width=1.8,
    )


def _curve(
    points: Sequence[LossPoint],
    x: Callable[[float], float],
    y: Callable[[float], float],
    color: str,
    width: float,
    opacity: float = 1.0,
) -> list[str]:
    """A series' line, broken at each #6237 mean rather than bridged over it: a segment from
    the iteration before to the one after would lie off the other cycle's line where the
    criteria found the replay equal. A point left alone between two breaks is a dot."""
    runs: list[list[LossPoint]] = [[]]
    for p in points:
        if p.mean_from is not None:
            runs.append([])
        else:
            runs[-1].append(p)
    out = []
    for run in runs:
        if len(run) == 1:
            only = run[0]
            dot = svg_el(
                "circle",
                cx=x(only.iteration),
                cy=y(only.loss),
                r=width / 2 + 0.5,
                fill=color,
                fill_opacity=opacity,
            )
            out.append(dot)
        elif run:
            line = svg_el(
                "polyline",
                points=" ".join(f"{fmt(x(p.iteration))},{fmt(y(p.loss))}" for p in run),
                fill="none",
                stroke=color,
                stroke_width=width,
                stroke_opacity=opacity,
                stroke_linejoin="round",
                stroke_linecap="round",
            )
            out.append(line)
    return out


# ----------------------------------------------------------------------------------------------
# Recovery cost


def breakdown_svg(reports: Sequence[ScenarioReport]) -> str | None:
    """One stacked bar per recovery (a scenario's one, a schedule's one per fault under its
    name and total): the downtime split into its phases, on one scale."""
    # (the bar's label, its recovery); a schedule's heading: (its name and total, None)
    rows: list[tuple[str, Recovery | None]] = []
    for report in reports:
        drawn = [r for r in report.fault_recoveries if r.milestones[0].t_s is not None]
        if not drawn:
            continue
        if not report.schedule:
            rows.append((report.name, drawn[0]))
            continue
        total = report.total_downtime_s
        n = report.recovery_count
        down = f"{total:.1f} s down in total" if total is not None else "total downtime —"
        rows.append((f"{report.name}: {down}, {n} recover{'y' if n == 1 else 'ies'}", None))
        rows += [(f"fault {r.position} {r.fault}", r) for r in drawn]
    if not rows:
        return None
    longest = max(_drawn_seconds(r) for _, r in rows if r is not None) or 1.0
    longest_name = max(len(label) for label, r in rows if r is not None)
    left, right = min(330.0, max(120.0, longest_name * 7.4 + 16)), 190.0
    plot_w = WIDTH - left - right
    bar_h, gap, top, heading_h = 26.0, 16.0, 16.0, 22.0
    out: list[str] = []

    def w(seconds: float) -> float:
        return max(0.0, seconds) / longest * plot_w

    y0 = top - bar_h - gap
    for label, recovery in rows:
        if recovery is None:  # a schedule's name and total, its faults' bars below
            y0 += bar_h + gap
            out.append(svg_text(10, y0 + heading_h - 6, label, size=12, weight="bold"))
            y0 += heading_h - bar_h - gap + 4
            continue
        y0 += bar_h + gap
        weight = None if recovery.scheduled else "bold"
        out.append(
            svg_text(left - 8, y0 + bar_h / 2 + 4, label, anchor="end", size=12, weight=weight)
        )
        px = left
        segments: list[tuple[str, float, str, str]] = []
        for phase in recovery.phases:
            if phase.seconds is not None:
                segments.append((phase.id, phase.seconds, PHASE_COLORS[phase.id], phase.label))
        if recovery.restoring_s:
            # the restore the next fault cut short: the load it never finished
            why = f"restoring until fault {recovery.struck_by} struck"
            segments.append(("restoring", recovery.restoring_s, RESTORING, why))
        if recovery.unattributed_s:
            # where the missing milestones were: after the known phases before them
            why = "not attributed (milestones missing)"
            segments.append(("unattributed", recovery.unattributed_s, UNATTRIBUTED, why))
        for pid, seconds, color, label in segments:
            width = w(seconds)
            tip = f"<title>{escape(label)}: {seconds:.3f} s</title>"
            out.append(
                svg_el(
                    "rect",
                    tip,
                    x=px,
                    y=y0,
                    width=max(width, 0.5),
                    height=bar_h,
                    fill=color,
                    stroke="#fff",
                    stroke_width=0.5,
                )
            )
            text = f"{seconds:.1f}s"
            if width > len(text) * 7 + 6:
                dark = pid in ("termination", "unattributed", "restoring")
                out.append(
                    svg_text(
                        px + width / 2,
                        y0 + bar_h / 2 + 4,
                        text,
                        size=12,
                        anchor="middle",
                        fill="#111" if dark else "#fff",
                        weight="bold",
                    )
                )
            px += width
        lost = recovery.lost_work
        if recovery.outcome == "stopped":
            # no recovery was due: how the schedule had to end, not a failure to recover
            note = recovery.note() or ""
            out.append(svg_text(px + 8, y0 + bar_h / 2 + 4, note, size=12, fill="#555"))
            continue
        if recovery.downtime_s is None:
            why = "not recovered: no step committed after the restore"
            out.append(svg_text(px + 8, y0 + bar_h / 2 + 4, why, size=12, fill=FAULT_COLOR))
            continue
        tail = f"{recovery.downtime_s:.1f} s down"
        if recovery.outcome == "struck":
            tail += f": struck while restoring by fault {recovery.struck_by}"
        elif lost.iterations is not None:
            tail += f", {lost.iterations} it lost"
        out.append(svg_text(px + 8, y0 + bar_h / 2 + 4, tail, size=12))
    y_axis = y0 + bar_h + 6
    out.append(svg_line(left, y_axis, left + plot_w, y_axis, "#444"))
    for t in nice_ticks(0.0, longest, 8):
        out.append(svg_line(left + w(t), y_axis, left + w(t), y_axis + 4, "#444"))
        out.append(svg_text(left + w(t), y_axis + 16, tick_text(t), size=11, anchor="middle"))
    out.append(
        svg_text(
            left + plot_w, y_axis + 30, "seconds from the fault", size=11, anchor="end", fill="#555"
        )
    )
    # legend
    py = y_axis + 52
    px = 10.0
    for spec in PHASES:
        label = spec.label
        if px + 22 + len(label) * 6.6 > WIDTH:
            px, py = 10.0, py + 20
        out.append(svg_el("rect", x=px, y=py - 11, width=14, height=14, fill=PHASE_COLORS[spec.id]))
        out.append(svg_text(px + 19, py, label, size=12))
        px += 34 + len(label) * 6.6
    restoring = any(r is not None and r.restoring_s for _, r in rows)
    if restoring:
        label = "restoring, until the next fault struck"
        if px + 22 + len(label) * 6.6 > WIDTH:
            px, py = 10.0, py + 20
        out.append(svg_el("rect", x=px, y=py - 11, width=14, height=14, fill=RESTORING))
        out.append(svg_text(px + 19, py, label, size=12))
        px += 34 + len(label) * 6.6
    if any(r is not None and r.unattributed_s for _, r in rows):
        if px + 200 > WIDTH:
            px, py = 10.0, py + 20
        out.append(
            svg_el("rect", x=px, y=py - 11, width=14, height=14, fill=UNATTRIBUTED, stroke="#999")
        )
        out.append(svg_text(px + 19, py, "not attributed (a milestone is missing)", size=12))
    return svg_doc(py + 12, out, "recovery cost breakdown", defs=True, restoring=restoring)


def _drawn_seconds(recovery: Recovery) -> float:
    """The length of a recovery's bar: its downtime, else the phases it did show."""
    if recovery.downtime_s is not None:
        return recovery.downtime_s
    return sum(p.seconds for p in recovery.phases if p.seconds is not None and p.seconds > 0)


def used_kinds(events: Iterable[TimelineEvent]) -> list[str]:
    present = {e.kind for e in events}
    return [k for k in EVENT_KINDS if k in present]
