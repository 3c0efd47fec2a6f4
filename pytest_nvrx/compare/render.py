"""A comparison shown: console text, the ``--json`` document and one offline HTML page in the
report's style (a table per scenario, bars old vs new per phase; inline CSS and SVG, no script,
nothing fetched). Every string that came from a side is escaped (a report is untrusted)."""

from __future__ import annotations

import json
from typing import Any

from pytest_nvrx import __version__
from pytest_nvrx.compare.diff import Comparison, ScenarioDiff, TimingDiff
from pytest_nvrx.evidence.refs import html_text as escape
from pytest_nvrx.evidence.refs import printable
from pytest_nvrx.report.render import PAGE_CSS as REPORT_CSS

#: the ``--json`` document's version: raised only when a change breaks its readers
COMPARE_SCHEMA = 1


def seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f} s"


def change_text(t: TimingDiff) -> str:
    if t.incomparable:
        return "not compared"
    if t.old is None and t.new is None:
        return "not measured"
    if t.old is None:
        return "new on NEW"
    if t.new is None:
        return "not measured on NEW"
    delta = t.delta or 0.0
    pct = f" ({t.percent:+.1f}%)" if t.percent is not None else ""
    return f"{delta:+.3f} s{pct}"


def _sides_line(c: Comparison) -> list[str]:
    return [
        f"OLD {c.old.source} ({c.old.kind}, schema {c.old.schema_version}, "
        f"{len(c.old.scenarios)} scenario(s))",
        f"NEW {c.new.source} ({c.new.kind}, schema {c.new.schema_version}, "
        f"{len(c.new.scenarios)} scenario(s))",
    ]


def text(c: Comparison) -> str:
    """The console's text: stacks, one block per scenario (a verdict change leads), the
    scenarios of one side, the gate's failures and the closing line."""
    lines = ["compare: " + s for s in _sides_line(c)]
    lines += [f"note: {n}" for n in c.notes]
    if c.stack_changes:
        lines.append("stack: " + "; ".join(str(s) for s in c.stack_changes))
    else:
        lines.append("stack: the same on both sides (every identifying field)")
    order = {"regression": 0, "improvement": 1}
    for d in sorted(c.scenarios, key=lambda d: (order.get(d.status, 2), d.key)):
        lines += _scenario_text(d)
    for key in c.only_old:
        lines.append(f"only in OLD: {key}")
    for key in c.only_new:
        lines.append(f"only in NEW: {key}")
    for failure in c.failures:
        lines.append(f"gate fails: {failure}")
    lines.append(f"compare: {c.closing_line()}")
    return "\n".join(printable(line) for line in lines) + "\n"


def _scenario_text(d: ScenarioDiff) -> list[str]:
    samples = f" [{len(d.old)} vs {len(d.new)} samples]" if len(d.old) + len(d.new) > 2 else ""
    head = f"{d.status.upper()}: {d.key}{samples}"
    out = [head]
    if d.verdict_change is not None:
        out.append(f"  verdict: {d.old_outcome} → {d.new_outcome}")
    else:
        out.append(f"  verdict: {d.new_outcome} (both)")
    for t in d.timings:
        if t.old is None and t.new is None:
            continue
        out.append(f"  {t.label}: {seconds(t.old)} → {seconds(t.new)}  {change_text(t)}")
    out += [f"  {r}" for r in d.recovery_changes]
    out += [f"  noise: {n}" for n in d.noise]
    out += [f"  not gated: {h}" for h in d.not_gated]
    return out


# ----------------------------------------------------------------------------------------------
# --json


def _timing_json(t: TimingDiff) -> dict[str, Any]:
    return {
        "what": t.what,
        "recovery": t.recovery,
        "old_s": t.old,
        "new_s": t.new,
        "delta_s": t.delta,
        "percent": round(t.percent, 2) if t.percent is not None else None,
        "incomparable": t.incomparable,
    }


def document(c: Comparison) -> dict[str, Any]:
    """The ``--json`` document (docs/compare.md)."""
    return {
        "compare_schema": COMPARE_SCHEMA,
        "tool": {"name": "pytest-nvrx", "version": __version__},
        "old": {"source": c.old.source, "kind": c.old.kind, "schema": c.old.schema_version},
        "new": {"source": c.new.source, "kind": c.new.kind, "schema": c.new.schema_version},
        "notes": list(c.notes),
        "stack_changes": [{"field": s.field, "old": s.old, "new": s.new} for s in c.stack_changes],
        "scenarios": [
            {
                "key": str(d.key),
                "workload": d.key.workload,
                "fault": d.key.fault,
                "train_iters": d.key.train_iters,
                "ranks": d.key.ranks,
                "status": d.status,
                "old": {"outcome": d.old_outcome, "samples": [r.name for r in d.old]},
                "new": {"outcome": d.new_outcome, "samples": [r.name for r in d.new]},
                "verdict_change": d.verdict_change,
                "timings": [_timing_json(t) for t in d.timings],
                "noise": list(d.noise),
                "gate_failures": [{"rule": f.rule, "text": f.text} for f in d.failures],
                "not_gated": list(d.not_gated),
                "recovery_changes": list(d.recovery_changes),
            }
            for d in c.scenarios
        ],
        "only_old": [str(k) for k in c.only_old],
        "only_new": [str(k) for k in c.only_new],
        "gate": {
            "rules": [str(r) for r in c.rules],
            "min_samples": c.min_samples,
            "gate_noise": c.gate_noise,
            "failed": c.gate_failed,
            "missing": [{"key": str(f.scenario), "text": f.text} for f in c.missing],
        },
        "counts": {
            s: c.count(s)
            for s in ("regression", "improvement", "slower", "faster", "changed", "unchanged")
        },
        "changes": c.changes,
        "summary": c.closing_line(),
    }


def document_json(c: Comparison) -> str:
    """The ``--json`` document as text: strict JSON (a value that is no JSON number raises;
    side.MAX_SECONDS bounds every timing, so that none does)."""
    return json.dumps(document(c), indent=1, allow_nan=False) + "\n"


# ----------------------------------------------------------------------------------------------
# HTML

_BAR_W = 260
_OLD_COLOUR = "#999999"
_NEW_COLOUR = "#0072B2"  # Okabe-Ito blue, as the report's charts
_WORSE = "#D55E00"

PAGE_CSS = REPORT_CSS  # the report's, its status classes included


def _bars(t: TimingDiff, scale: float) -> str:
    """Two bars, old (grey) above new (blue; orange where it grew), on one scale."""
    rows = []
    for n, (value, colour) in enumerate(((t.old, _OLD_COLOUR), (t.new, _NEW_COLOUR))):
        if value is None:
            continue
        if n == 1 and t.delta is not None and t.delta > 0:
            colour = _WORSE
        width = 0.0 if scale <= 0 else max(1.0, value / scale * _BAR_W)
        rows.append(
            f'<rect x="0" y="{n * 9}" width="{width:.1f}" height="7" fill="{colour}">'
            f"<title>{'NEW' if n else 'OLD'} {value:.3f} s</title></rect>"
        )
    return (
        f'<svg width="{_BAR_W}" height="17" role="img" aria-label="old and new">'
        + "".join(rows)
        + "</svg>"
    )


def _scenario_html(d: ScenarioDiff) -> str:
    shown = [t for t in d.timings if t.old is not None or t.new is not None]
    scale = max((v for t in shown for v in (t.old, t.new) if v is not None), default=0.0)
    rows = "".join(
        f"<tr><td>{escape(t.label)}</td><td class=num>{escape(seconds(t.old))}</td>"
        f"<td class=num>{escape(seconds(t.new))}</td><td class=num>{escape(change_text(t))}</td>"
        f"<td>{_bars(t, scale)}</td></tr>"
        for t in shown
    )
    verdict = (
        f"{escape(d.old_outcome)} → {escape(d.new_outcome)}"
        if d.verdict_change is not None
        else f"{escape(d.new_outcome)} (both)"
    )
    extra = "".join(f"<div>{escape(r)}</div>" for r in d.recovery_changes)
    extra += "".join(f"<div class=small>noise: {escape(n)}</div>" for n in d.noise)
    extra += "".join(f"<div class=small>not gated: {escape(h)}</div>" for h in d.not_gated)
    extra += "".join(f"<div class=cause>gate fails: {escape(f.text)}</div>" for f in d.failures)
    return (
        f'<h3 class="{escape(d.status)}"><span class=st>{escape(d.status)}</span> '
        f"{escape(str(d.key))}</h3><div>verdict: {verdict}</div>{extra}"
        "<div class=wide><table><tr><th>timing</th><th>OLD</th><th>NEW</th><th>change</th>"
        f"<th>old (grey) vs new</th></tr>{rows}</table></div>"
    )


def section_html(c: Comparison) -> str:
    """The comparison as a section of a page (the compare page's body, the report's section)."""
    stack = (
        "<table class=stack><tr><th>field</th><th>OLD</th><th>NEW</th></tr>"
        + "".join(
            f"<tr><td>{escape(s.field)}</td><td>{escape(s.old)}</td><td>{escape(s.new)}</td></tr>"
            for s in c.stack_changes
        )
        + "</table>"
        if c.stack_changes
        else "<p>The same stack on both sides (every identifying field).</p>"
    )
    only = "".join(f"<li>only in OLD: {escape(str(k))}</li>" for k in c.only_old)
    only += "".join(f"<li>only in NEW: {escape(str(k))}</li>" for k in c.only_new)
    notes = "".join(f"<p class=small>note: {escape(n)}</p>" for n in c.notes)
    sides = "".join(f"<div class=small>{escape(s)}</div>" for s in _sides_line(c))
    return (
        f"{sides}{notes}<p><b>{escape(c.closing_line())}</b></p><h2>Stack changes</h2>{stack}"
        "<h2>Scenarios</h2>"
        + "".join(_scenario_html(d) for d in c.scenarios)
        + (f"<ul>{only}</ul>" if only else "")
    )


def html(c: Comparison) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        "<title>pytest-nvrx comparison</title>"
        f"<style>{PAGE_CSS}</style></head><body><h1>Recovery compared: OLD → NEW</h1>"
        f"{section_html(c)}<p class=small>pytest-nvrx {escape(__version__)}</p></body></html>\n"
    )
