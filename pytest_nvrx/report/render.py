"""The report of several scenarios: ``report.json`` (:func:`report_json`) and one self-contained
offline HTML page (:func:`render_html`): inline CSS and SVG, no script, nothing fetched."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_nvrx import __version__
from pytest_nvrx.criteria.selftest_outcome import GOOD
from pytest_nvrx.criteria.verdict import CRITERIA_IDS
from pytest_nvrx.evidence.refs import html_text as escape  # control characters shown too
from pytest_nvrx.report.model import PHASES, SCHEMA_VERSION, ScenarioReport
from pytest_nvrx.report.recovery import Recovery
from pytest_nvrx.report.svg import (
    breakdown_svg,
    loss_svg,
    timeline_legend_svg,
    timeline_svg,
    used_kinds,
)
from pytest_nvrx.settings.plants import PLANTS


def pair_baselines(reports: Sequence[ScenarioReport]) -> dict[str, ScenarioReport]:
    """For each faulted scenario, a baseline among ``reports`` of the same workload and length
    (scenario name -> baseline report); the first such baseline wins."""
    baselines = [r for r in reports if r.baseline and r.loss.points]
    out: dict[str, ScenarioReport] = {}
    for report in reports:
        if report.baseline:
            continue
        for base in baselines:
            if base.workload == report.workload and (
                base.train_iters is None
                or report.train_iters is None
                or base.train_iters == report.train_iters
            ):
                out[report.name] = base
                break
    return out


def report_json(
    reports: Sequence[ScenarioReport], stack: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``report.json`` document (schema in docs/report.md)."""
    pairs = pair_baselines(reports)
    scenarios = []
    for report in reports:
        data = report.as_dict()
        base = pairs.get(report.name)
        data["baseline"] = base.name if base is not None else None
        scenarios.append(data)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "pytest-nvrx", "version": __version__},
        "stack": dict(stack) if stack is not None else _common_stack(reports),
        "passed": bool(reports) and all(r.passed for r in reports),
        "scenarios": scenarios,
    }
    section = selftest_section(reports)
    if section is not None:  # only where a self-test run was judged
        doc["selftest"] = section
    return doc


def selftest_section(reports: Sequence[ScenarioReport]) -> dict[str, Any] | None:
    """The self-test's sensitivity: one row per self-test run (the control first, then the
    plants in catalogue order) with its plant, the criterion that must catch it, its status
    (caught, missed, ...), the criteria that failed, the first cause and its run, and the
    continuity tolerance the runs were judged at (None when they were judged at several: each
    row has its own). None when no run is a self-test run."""
    order = {plant.name: n for n, plant in enumerate(PLANTS)}
    rows = [
        {"scenario": r.name, **r.selftest}
        for r in sorted(
            (r for r in reports if r.selftest is not None),
            key=lambda r: -1 if r.planted is None else order.get(r.planted, len(order)),
        )
        if r.selftest is not None
    ]
    if not rows:
        return None
    rtols = {row["continuity_rtol"] for row in rows}
    return {"continuity_rtol": rtols.pop() if len(rtols) == 1 else None, "rows": rows}


#: the fields that identify a stack. Two runs that agree on them ran on the same software and
#: hardware, whatever per-run detail their records add (a scenario's ``notes``, its recipe's
#: ``profile``, the interpreter's path): such detail is no difference of stack.
STACK_IDENTITY = (
    "python",
    "torch",
    "cuda",
    "cudnn",
    "nccl",
    "gpu",
    "driver",
    "transformer_engine",
    "apex",
    "megatron",
    "megatron_rev",
    "nvrx",
)
_UNRECORDED = "not recorded"


def _identity(stack: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(repr(stack.get(key, _UNRECORDED)) for key in STACK_IDENTITY)


def _shared(stacks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What every one of ``stacks`` records alike (per-run detail that differs is left out)."""
    first = stacks[0]
    return {k: v for k, v in first.items() if all(k in s and s[k] == v for s in stacks[1:])}


def _common_stack(reports: Sequence[ScenarioReport]) -> dict[str, Any] | None:
    """The stack every scenario that recorded one ran on (the fields they record alike); None
    when a field of :data:`STACK_IDENTITY` differs."""
    stacks = [r.stack for r in reports if r.stack]
    if stacks and all(_identity(s) == _identity(stacks[0]) for s in stacks):
        return _shared(stacks)
    return None


def _stack_differences(reports: Sequence[ScenarioReport]) -> list[str]:
    """Each identifying field the scenarios' stacks disagree on, with the scenarios of each
    value: ``torch 2.15.0 (a, b) vs 2.14.0 (c)``."""
    recorded = [r for r in reports if r.stack]
    out = []
    for key in STACK_IDENTITY:
        if not any(key in r.stack for r in recorded):
            continue
        by_value: dict[str, list[str]] = {}
        for r in recorded:
            value = r.stack.get(key, _UNRECORDED)
            shown = "not installed" if value is None else str(value)
            by_value.setdefault(shown, []).append(r.name)
        if len(by_value) > 1:
            values = " vs ".join(f"{v} ({', '.join(names)})" for v, names in by_value.items())
            out.append(f"{key} {values}")
    return out


PAGE_CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#1d1d1d;
 margin:24px auto;max-width:1060px;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;margin:6px 0}
.wide{overflow-x:auto;max-width:100%}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3;font-weight:600}
.PASS{background:#dff3e4;color:#11632b;font-weight:600}
.FAIL{background:#fbe0de;color:#9b1c14;font-weight:600}
.NA{background:#eeeeee;color:#555}
.ok{color:#11632b;font-weight:700}.bad{color:#9b1c14;font-weight:700}
.matrix td a{color:inherit;text-decoration:none;display:block}
.num{text-align:right;font-variant-numeric:tabular-nums}
.missing{color:#9b1c14;font-style:italic}
code,.ev{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.ev{white-space:pre-wrap;word-break:break-all;background:#fafafa;border-left:3px solid #ccc;
 padding:2px 6px;margin:2px 0 2px 12px}
.cause{background:#fff4e5;border:1px solid #f0c27b;padding:6px 10px;margin:8px 0}
.stack td:first-child{color:#555}
details summary{cursor:pointer}
.chart{margin:6px 0 10px}
.small{color:#555;font-size:12px}
.regression{background:#fbe0de}.improvement{background:#dff3e4}
.st{font-weight:700;text-transform:uppercase;font-size:12px}
"""

_STACK_KEYS = (
    ("python", "Python"),
    ("torch", "torch"),
    ("cuda", "CUDA"),
    ("cudnn", "cuDNN"),
    ("nccl", "NCCL"),
    ("gpu", "GPU"),
    ("driver", "driver"),
    ("transformer_engine", "Transformer Engine"),
    ("apex", "Apex"),
    ("megatron", "Megatron"),
    ("megatron_describe", "Megatron tag"),
    ("nvrx", "NVRx"),
    ("profile", "profile"),
)


def _status_class(status: str) -> str:
    return "NA" if status == "N/A" else status


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _stack_table(stack: Mapping[str, Any]) -> str:
    if not stack:
        return "<p class=small>no stack recorded</p>"
    rows = []
    for key, label in _STACK_KEYS:
        if key not in stack:
            continue
        value = stack[key]
        shown = "not installed" if value is None else str(value)
        rows.append(f"<tr><td>{escape(label)}</td><td>{escape(shown)}</td></tr>")
    if stack.get("source"):
        rows.append(f"<tr><td>source</td><td>{escape(str(stack['source']))}</td></tr>")
    return f"<table class=stack>{''.join(rows)}</table>"


def _stack_line(stack: Mapping[str, Any] | None, differences: Sequence[str] = ()) -> str:
    """The stack in one line under the title (the whole table is at the end of the page); where
    the scenarios ran on different stacks, the fields that differ and where."""
    if differences:
        text = "; ".join(differences)
        return (
            f"<p class=small>Stacks differ between scenarios in {escape(text)}: see "
            '<a href="#stack">Stack</a>.</p>'
        )
    if not stack:
        return '<p class=small>No stack recorded: see <a href="#stack">Stack</a>.</p>'
    shown = []
    for key, label in _STACK_KEYS:
        if key in stack and key not in ("megatron_describe", "driver", "cudnn", "profile"):
            value = stack[key]
            if key == "megatron" and stack.get("megatron_describe"):
                value = f"{value} ({stack['megatron_describe']})"
            shown.append(f"{label} {'not installed' if value is None else value}")
    text = " · ".join(shown) or "not recorded"
    return f'<p class=small><b>Stack:</b> {escape(text)} (<a href="#stack">details</a>)</p>'


def _anchor(report: ScenarioReport) -> str:
    return _anchor_of(report.name)


def _anchor_of(name: str) -> str:
    return "s-" + "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name)


def _time_limits(report: ScenarioReport) -> tuple[str, str] | None:
    """The verdict of the time limits a scenario was held to (``--nvrx-max-downtime``,
    ``--nvrx-max-phase``) as a status and its reason; None when it was held to none. The gate
    judges apart from the criteria: a run can pass every criterion and break a limit."""
    if report.gate:
        return "FAIL", report.gate
    limits = []
    if report.max_downtime_s is not None:
        limits.append(f"downtime ≤ {report.max_downtime_s:g} s")
    limits += [f"{pid} ≤ {limit:g} s" for pid, limit in (report.max_phases or {}).items()]
    if not limits:
        return None
    if report.baseline:
        return "N/A", "baseline: no fault, no downtime to hold to " + ", ".join(limits)
    return "PASS", "within the limits: " + ", ".join(limits)


def _matrix(reports: Sequence[ScenarioReport]) -> str:
    head = "".join(f"<th>{escape(c.replace('_', ' '))}</th>" for c in CRITERIA_IDS)
    gated = any(_time_limits(r) is not None for r in reports)
    if gated:
        head += "<th>time limits</th>"
    rows = []
    for r in reports:
        outcome = "QUALIFIED" if r.passed else "NOT QUALIFIED"
        cls = "ok" if r.passed else "bad"
        cells = []
        by_id = {c.id: c for c in r.criteria}
        for cid in CRITERIA_IDS:
            c = by_id.get(cid)
            if c is None:
                cells.append("<td>—</td>")
                continue
            where = f" [{c.evidence[0].split(': ', 1)[0]}]" if c.evidence else ""
            cells.append(
                f'<td class="{_status_class(c.status)}" title="{escape(c.reason + where)}">'
                f'<a href="#{_anchor(r)}-{cid}">{c.status}</a></td>'
            )
        limits = _time_limits(r) if gated else None
        if limits is not None:
            status, why = limits
            cells.append(
                f'<td class="{_status_class(status)}" title="{escape(why)}">'
                f'<a href="#{_anchor(r)}-time-limits">{status}</a></td>'
            )
        elif gated:
            cells.append('<td title="not held to a time limit">—</td>')
        # a planted run is labelled before its name: it is never a qualification run
        planted = f"<b>planted: {escape(r.planted)}</b> " if r.planted is not None else ""
        downtime = _seconds(r.downtime_s)
        if r.schedule:  # its total, over its recoveries
            n = r.recovery_count
            downtime += f"<br><span class=small>total, {n} recover{'y' if n == 1 else 'ies'}</span>"
        rows.append(
            f'<tr><th>{planted}<a href="#{_anchor(r)}">{escape(r.name)}</a></th>'
            f"<td>{escape(r.fault_text)}</td>"
            f'<td class="{cls}">{outcome}</td><td class=num>{downtime}</td>'
            + "".join(cells)
            + "</tr>"
        )
    return (
        '<div class="wide"><table class=matrix><tr><th>scenario</th><th>fault</th>'
        f"<th>outcome</th><th>downtime (s)</th>{head}</tr>{''.join(rows)}</table></div>"
    )


def _shared_gpu_note(reports: Sequence[ScenarioReport]) -> str:
    """Which scenarios' timings were measured on a GPU other runs held (result.json's record):
    NVRx waits for the whole GPU's memory (the gpu_reclaim phase) and the runs load each other."""
    shared = [r for r in reports if r.gpu_shared_with]
    if not shared:
        return ""
    items = "".join(
        f"<li><b>{escape(r.name)}</b> shared its GPU with "
        f"{escape(', '.join(r.gpu_shared_with or ()))}</li>"
        for r in shared
    )
    return (
        '<div class="shared-gpu"><p><b>Timings measured on a shared GPU</b>: not this stack\'s'
        " alone. After stopping the workers NVRx waits until the whole GPU's memory is reclaimed,"
        " the other runs' included (the <i>gpu_reclaim</i> phase), and the runs load each other."
        f" Run them on GPUs of their own (--nvrx-gpu-share 1) to measure the stack.</p><ul>{items}"
        "</ul></div>"
    )


def _cost_table(reports: Sequence[ScenarioReport]) -> str:
    """Phases as rows, recoveries as columns (a schedule's one per fault): a handful fits the
    page, more (a 17-scenario matrix) scroll sideways in the table's own box rather than past
    the page's edge."""
    columns = [(r, rec) for r in reports for rec in r.fault_recoveries]
    if not columns:
        return ""
    recoveries = [rec for _, rec in columns]
    head = "".join(
        f"<th class=num>{escape(r.name)}"
        + (f"<br>fault {rec.position} {escape(rec.fault or '')}" if rec.scheduled else "")
        + "</th>"
        for r, rec in columns
    )
    rows: list[str] = []
    for n, spec in enumerate(PHASES):
        cells = []
        for rec in recoveries:
            phase = rec.phases[n]
            if phase.seconds is None and phase.id in rec.unreached:
                # a restore the next fault struck: never reached, not missing
                why = escape(phase.missing or "")
                cells.append(f'<td class="num NA" title="{why}">not reached</td>')
            elif phase.seconds is None:
                why = escape(phase.missing or "")
                cells.append(f'<td class="num missing" title="{why}">missing</td>')
            else:
                cells.append(f"<td class=num>{phase.seconds:.3f}</td>")
        rows.append(f"<tr><td>{escape(spec.label)}</td>{''.join(cells)}</tr>")

    def row(label: str, values: list[str], bold: bool = False) -> str:
        tag = ("<b>", "</b>") if bold else ("", "")
        cells = "".join(f"<td class=num>{tag[0]}{v}{tag[1]}</td>" for v in values)
        return f"<tr><td>{tag[0]}{escape(label)}{tag[1]}</td>{cells}</tr>"

    if any(rec.outcome == "struck" for rec in recoveries):
        rows.append(
            row(
                "restoring, until the next fault struck",
                [_seconds(r.restoring_s) if r.outcome == "struck" else "—" for r in recoveries],
            )
        )
    rows.append(row("not attributed", [_seconds(r.unattributed_s) for r in recoveries]))
    rows.append(row("downtime", [_downtime_cell(r) for r in recoveries], bold=True))
    schedules = [r for r in reports if r.schedule and r.recoveries]
    if schedules:
        # a schedule's total, under its recoveries' columns
        total = "".join(
            f"<td class=num colspan={len(r.fault_recoveries)}><b>{_seconds(r.downtime_s)}</b></td>"
            if r.schedule and r.recoveries
            else "<td class=num>—</td>" * len(r.fault_recoveries)
            for r in reports
            if r.fault_recoveries
        )
        rows.append(f"<tr><td><b>schedule downtime (total)</b></td>{total}</tr>")
    rows.append(
        row("iterations lost (restored → last before failure)", [_lost(r) for r in recoveries])
    )
    rows.append(row("work discarded (s)", [_seconds(r.lost_work.discarded_s) for r in recoveries]))
    rows.append(row("recomputed (s)", [_seconds(r.lost_work.recomputed_s) for r in recoveries]))
    table = f"<table class=cost><tr><th>seconds</th>{head}</tr>{''.join(rows)}</table>"
    return f'<div class="wide">{table}</div>'


def _downtime_cell(recovery: Recovery) -> str:
    """A recovery's downtime; how a schedule's ended where it did not recover."""
    note = recovery.note()
    if note is None:
        return _seconds(recovery.downtime_s)
    text = f"{_seconds(recovery.downtime_s)}<br>" if recovery.downtime_s is not None else ""
    return f"{text}<span class=small>{escape(note)}</span>"


def _lost(recovery: Recovery) -> str:
    """The iterations a fault threw away, readable where the evidence does not say: a run whose
    workers died before the fault (no fault instant) lost nothing to a fault."""
    lost = recovery.lost_work
    if recovery.milestones[0].t_s is None:
        return "— (no fault landed)"

    def shown(value: int | None) -> str:
        return "—" if value is None else str(value)

    text = shown(lost.iterations)
    if lost.restored_iteration is not None or lost.last_iteration_before_failure is not None:
        text += f" ({shown(lost.restored_iteration)} → {shown(lost.last_iteration_before_failure)})"
    return text


def _planted_note(report: ScenarioReport) -> str:
    title = (report.selftest or {}).get("title")
    named = f"{report.planted} ({title})" if title else str(report.planted)
    return (
        f"planted: {named}: a self-test run with a known recovery bug planted on purpose,"
        " never a qualification"
    )


def _selftest_html(reports: Sequence[ScenarioReport]) -> str:
    """The self-test's sensitivity table (:func:`selftest_section`); empty without one."""
    section = selftest_section(reports)
    if section is None:
        return ""
    rtol = section["continuity_rtol"]
    tolerance = (
        f"training_continuity's tolerance in force: rtol {rtol:g}"
        + (" (exact)" if rtol == 0 else "")
        if rtol is not None
        else "the runs were judged at different tolerances: see each row"
    )
    rows = []
    for row in section["rows"]:
        cls = "ok" if row["status"] in GOOD else "bad"
        anchor = _anchor_of(row["scenario"])
        run_dir = row["run_dir"] or ""
        rows.append(
            f"<tr><th>{escape(row['plant'])}</th><td>{escape(row['title'])}</td>"
            f"<td>{escape(row['expected_criterion'] or '—')}</td>"
            f'<td class="{cls}" title="{escape(row["reason"])}">{escape(row["status"])}</td>'
            f"<td>{escape(', '.join(row['caught_by']) or '—')}</td>"
            f"<td>{escape(row['first_cause'] or '—')}</td>"
            f'<td><a href="#{anchor}">{escape(row["scenario"])}</a><br>'
            f"<span class=small><code>{escape(run_dir)}</code></span></td>"
            + (f"<td class=num>{row['continuity_rtol']:g}</td>" if rtol is None else "")
            + "</tr>"
        )
    head = (
        "<tr><th>plant</th><th>models</th><th>must be caught by</th><th>status</th>"
        "<th>caught by (failing criteria)</th><th>first cause</th><th>run</th>"
        + ("<th>rtol</th>" if rtol is None else "")
        + "</tr>"
    )
    return (
        '<h2 id="selftest">Self-test</h2>'
        "<p class=small>Known recovery bugs planted into real runs on purpose: each must be "
        "<i>caught</i> by the criterion named for it, and the unplanted control must qualify. "
        "A plant <i>missed</i> is one the criteria would have passed at this tolerance. "
        f"{escape(tolerance)}.</p>"
        f'<div class="wide"><table class=selftest>{head}{"".join(rows)}</table></div>'
    )


def _scenario(report: ScenarioReport, baseline: ScenarioReport | None) -> str:
    anchor = _anchor(report)
    if report.passed:
        outcome = '<span class="ok">QUALIFIED</span>'
    else:
        outcome = f'<span class="bad">NOT QUALIFIED</span>: {escape(report.cause or "")}'
    window = f" in window <b>{escape(report.window)}</b>" if report.window else ""
    fault = f"fault <b>{escape(report.fault)}</b>{window}"
    if report.schedule:
        fault = f"fault schedule <b>{escape(', '.join(report.schedule))}</b>"
    workload = f" · workload {escape(report.workload)}" if report.workload else ""
    parts = [f'<h2 id="{anchor}">{escape(report.name)}</h2>']
    if report.planted is not None:
        # before anything else: the verdicts below are a self-test's, never a qualification
        parts.append(f'<p class="cause"><b>{escape(_planted_note(report))}</b></p>')
    parts += [
        f"<p>{outcome} · {fault} · {escape(report.summary)}<br>"
        f"<span class=small>run dir <code>{escape(report.run_dir)}</code>{workload}</span></p>",
    ]
    if report.first_cause:
        parts.append(f'<div class="cause"><b>first cause:</b> {escape(report.first_cause)}</div>')
    parts += [f'<p class="cause">{escape(p)}</p>' for p in report.problems if p.startswith("fatal")]
    parts.append("<h3>Timeline</h3>")
    kinds = used_kinds(report.timeline.events)
    parts.append(f'<div class="chart">{timeline_svg(report)}</div>')
    legend = timeline_legend_svg(kinds, window=report.timeline.fault_window is not None)
    parts.append(f'<div class="chart">{legend}</div>')
    loss = loss_svg(report, baseline)
    if loss is not None:
        against = (
            f' over the baseline <a href="#{_anchor(baseline)}">{escape(baseline.name)}</a>'
            if baseline
            else ""
        )
        parts.append(f'<h3>Loss{against}</h3><div class="chart">{loss}</div>')
    parts.append("<h3>Criteria</h3>")
    for c in report.criteria:
        evidence = "".join(f'<div class="ev">{escape(line)}</div>' for line in c.evidence)
        open_attr = " open" if c.status == "FAIL" else ""
        status = f'<span class="{_status_class(c.status)}"> {c.status} </span>'
        parts.append(
            f'<details id="{anchor}-{c.id}"{open_attr}><summary>{status} <b>{escape(c.id)}</b>: '
            f"{escape(c.reason)}</summary>{evidence}</details>"
        )
    limits = _time_limits(report)
    if limits is not None:
        status, why = limits
        parts.append(
            f'<details id="{anchor}-time-limits"{" open" if status == "FAIL" else ""}><summary>'
            f'<span class="{_status_class(status)}"> {status} </span> <b>time limits</b>: '
            f"{escape(why)}</summary></details>"
        )
    events = report.timeline.events
    if events:
        rows = "".join(
            f"<tr><td class=num>{e.t_s:.3f}</td><td>{escape(e.label)}</td>"
            f"<td><code>{escape(e.ref or '')}</code></td></tr>"
            for e in events
        )
        parts.append(
            f"<details><summary>All {len(events)} timeline events, with the line that shows each"
            f"</summary><table><tr><th>s</th><th>event</th><th>evidence</th></tr>{rows}</table>"
            "</details>"
        )
    notes = [p for p in report.problems if not p.startswith("fatal")]
    if notes:
        parts.append("<p class=small>" + "<br>".join(escape(n) for n in notes) + "</p>")
    return "\n".join(parts)


def render_html(
    reports: Sequence[ScenarioReport],
    stack: Mapping[str, Any] | None = None,
    *,
    title: str = "Recovery report",
    sections: Sequence[tuple[str, str]] = (),
) -> str:
    """One self-contained page: the matrix, the recovery cost, then each scenario in detail.
    ``sections``: (title, HTML already escaped) shown after the matrix (the comparison with an
    earlier qualification, --nvrx-compare)."""
    pairs = pair_baselines(reports)
    passed = sum(r.passed for r in reports)
    verdict = (
        '<span class="ok">all scenarios qualified</span>'
        if passed == len(reports)
        else f'<span class="bad">{len(reports) - passed} of {len(reports)} not qualified</span>'
    )
    breakdown = breakdown_svg(reports)
    body = [
        f"<h1>{escape(title)}</h1>",
        f"<p>{verdict} · {len(reports)} scenario{'s' if len(reports) != 1 else ''} · "
        f"pytest-nvrx {escape(__version__)}</p>",
        _stack_line(stack)
        if stack is not None
        else _stack_line(_common_stack(reports), _stack_differences(reports)),
        "<h2>Matrix</h2>",
        _matrix(reports),
        "<p class=small>Each cell links to the verdict and the log lines that prove it; hover "
        "for the reason.</p>",
    ]
    for heading, section in sections:
        body += [f"<h2>{escape(heading)}</h2>", section]
    selftest = _selftest_html(reports)
    if selftest:
        body.append(selftest)
    if breakdown is not None:
        body += [
            "<h2>Recovery cost</h2>",
            "<p class=small>Downtime: from the fault to the first step the replacement "
            "committed after restoring its checkpoint. A phase whose milestone the logs do not "
            "show is <i>missing</i>, never 0; its time is drawn hatched as not attributed."
            + (
                " A fault schedule has one bar per fault: a recovery whose restore the next"
                " fault struck is down until that fault (its load and first step <i>not"
                " reached</i>), and the schedule's downtime is the total of its recoveries'."
                if any(r.schedule for r in reports)
                else ""
            )
            + "</p>",
            f'<div class="chart">{breakdown}</div>',
            _cost_table(reports),
            _shared_gpu_note(reports),
        ]
    body += [_scenario(r, pairs.get(r.name)) for r in reports]
    body.append('<h2 id="stack">Stack</h2>')
    if stack is not None:
        body.append(_stack_table(stack))
    else:
        # one table per distinct stack (by its identifying fields), named by the scenarios
        # that ran on it
        groups: dict[tuple[str, ...], list[ScenarioReport]] = {}
        for r in reports:
            groups.setdefault(_identity(r.stack) if r.stack else (), []).append(r)
        for members in groups.values():
            if len(groups) > 1:
                body.append(f"<h3>{escape(', '.join(r.name for r in members))}</h3>")
            stacks = [r.stack for r in members if r.stack]
            body.append(_stack_table(_shared(stacks) if stacks else {}))
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width,initial-scale=1'>"
        f"<title>{escape(title)}</title>"
        f"<style>{PAGE_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
