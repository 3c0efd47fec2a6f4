"""A judgement as ``python -m pytest_nvrx verify`` shows it: the text report (one line per
criterion, the evidence under it, the run's own text with control characters escaped) and the
``--json`` document (versioned: :data:`JSON_SCHEMA_VERSION`; fields in docs/criteria.md), each
with the run's one outcome (:func:`~pytest_nvrx.criteria.outcome.run_outcome`)."""

from __future__ import annotations

import io
from typing import Any, TextIO

from pytest_nvrx.criteria.judgement import Judgement
from pytest_nvrx.criteria.outcome import run_outcome
from pytest_nvrx.evidence.refs import printable
from pytest_nvrx.evidence.segments import FaultRecovery

#: the ``--json`` document's version: raised only when a change breaks existing readers (a field
#: removed, renamed or retyped); new fields do not change it
JSON_SCHEMA_VERSION = 1


def json_report(judgement: Judgement, exit_status: int) -> dict[str, Any]:
    """The ``--json`` document: versioned, with the run's outcome (criteria/outcome.py: the
    one cause the console, the report and JUnit name too) and the exit status the command
    returns."""
    outcome = run_outcome(judgement)
    doc: dict[str, Any] = {"schema_version": JSON_SCHEMA_VERSION}
    for key, value in judgement.as_dict().items():
        if key == "first_cause":
            # after what was expected, before what the run showed (docs/criteria.md's order)
            doc.update(summary=outcome.summary, outcome=outcome.text, cause=outcome.reason)
        doc[key] = value
    doc["exit_status"] = exit_status
    return doc


def report(judgement: Judgement, out: TextIO) -> None:
    """The text report, the run's own text shown with control characters escaped: a log line
    cannot rewrite the terminal (``--json`` keeps the exact text)."""
    text = io.StringIO()
    _report_lines(judgement, text)
    out.write(printable(text.getvalue(), lines=True))


def _report_lines(judgement: Judgement, out: TextIO) -> None:
    planted = judgement.planted_note()
    if planted is not None:
        # a planted self-test run says so before anything else: it can never pass for a
        # qualification run, whatever its verdicts
        out.write(planted + "\n")
    exp = judgement.expected
    window = judgement.window
    where = (
        f" in window {window.window} (from {window.source})"
        if window is not None and window.window is not None
        else ""
    )
    if judgement.schedule:
        # a fault schedule: every fault is judged; the first is the run's fault and window
        out.write(
            f"verify {judgement.run_dir}: expected the fault schedule"
            f" {','.join(judgement.schedule)} (from {exp.source}), one fault per cycle\n"
        )
    else:
        out.write(
            f"verify {judgement.run_dir}: expected fault {exp.kind} (from {exp.source}){where}\n"
        )
    cause = judgement.first_cause
    if cause is not None:
        # the workers died before the fault: the verdicts below follow from this
        out.write(f"first cause: {cause.text}\n")
        out.writelines(f"    {ref.render(200)}\n" for ref in cause.evidence)
    for problem in judgement.problems:
        if problem.severity == "warning":
            out.write(f"note: {problem.message}\n")
    for verdict in judgement.verdicts:
        out.write(verdict.render() + "\n")
    if judgement.timings:
        out.write(f"timings: {_timings_text(judgement.timings)}\n")
    if judgement.schedule:
        # every recovery of the schedule, by its own clock, then the schedule's total
        for recovery in judgement.recoveries:
            out.write(f"{recovery_line(recovery)}\n")
        out.write(f"{total_line(judgement)}\n")
    note = judgement.sharing_note()
    if note is not None:
        out.write(f"note: {note}\n")
    out.write(f"verify: {run_outcome(judgement).summary}\n")


def _timings_text(timings: dict[str, float]) -> str:
    return ", ".join(f"{k[:-2]} {v:.1f}s" for k, v in timings.items())


def recovery_line(recovery: FaultRecovery) -> str:
    """One recovery of a schedule: ``fault 1 of 2, kill@step: downtime 7.7s, struck while
    restoring by fault 2; failure_to_detected 0.1s, ...``."""
    downtime = recovery.downtime_s
    text = f"{recovery.label}: "
    if recovery.due:
        text += f"downtime {downtime:.1f}s" if downtime is not None else "downtime —"
    note = recovery.note()
    if note is not None:
        text += f", {note}" if recovery.due else note
    timings = recovery.timings()
    return text + (f"; {_timings_text(timings)}" if timings else "")


def total_line(judgement: Judgement) -> str:
    """A schedule's total downtime and its number of recoveries."""
    total, n = judgement.total_downtime_s, judgement.recovery_count
    shown = f"{total:.1f}s" if total is not None else "— (a recovery's downtime is not measurable)"
    return f"schedule downtime: {shown} in total, {n} recover{'y' if n == 1 else 'ies'}"
