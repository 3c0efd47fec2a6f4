"""What the console says of one judged scenario, as plain data (no pytest here).

The plugin builds a scenario's entry where it was judged (an xdist worker, or the controller) and
ships it on the scenario's first test report; the controller prints it: the outcome line, the
verdicts, the logs' last lines of a run that failed (once, after its verdicts), the verdict
table's row and, with a report asked for, the recovery report's data. Every outcome and cause
in it is the run's one outcome (criteria/outcome.py), or a self-test run's (criteria/
selftest_outcome.py).
"""

from __future__ import annotations

from typing import Any

from pytest_nvrx.criteria.selftest_outcome import PlantOutcome
from pytest_nvrx.session.scenario_run import Limits, ScenarioRun
from pytest_nvrx.session.verdict_table import Row


def selftest_label(outcome: PlantOutcome) -> str:
    """A self-test run's outcome in one line: ``planted: rng: caught by training_continuity:
    ...``, ``control: qualified: ...``; never ``QUALIFIED`` (a planted run is no qualification)."""
    head = "control" if outcome.plant is None else f"planted: {outcome.plant.name}"
    said = outcome.reason.startswith(outcome.status.replace("-", " "))
    return f"{head}: {outcome.reason if said else f'{outcome.status}: {outcome.reason}'}"


def scenario_entry(
    run: ScenarioRun,
    limits: Limits | None,
    selftest: PlantOutcome | None = None,
    *,
    with_report: bool = False,
) -> dict[str, Any]:
    """A judged scenario as plain data: its outcome line, why it did not qualify (``cause``;
    None: it did), its verdict lines, the logs' last lines of a run that failed (``tails``:
    [title, text] pairs; none for a run that only broke a time limit, whose evidence is the
    timings its cause gives), its table row, and ``with_report`` its recovery report
    (ScenarioReport.as_dict, or ``report_error``). ``limits``: the time limits the run is held
    to; ``selftest``: a self-test run's outcome, which judges it instead (a planted run is never
    qualified: caught is the pass), held to no limit."""
    if selftest is None:
        outcome = run.outcome(limits)
        line, cause, row = f"nvrx {run.key}: {outcome.text}", outcome.reason, run.table_row(limits)
        failed = outcome.kind not in (None, "limits")
    else:
        limits = None
        label = selftest_label(selftest)
        line, cause = f"nvrx {run.key}: {label}", None if selftest.good else label
        row = Row(
            scenario=run.key,
            outcome=selftest.status.upper(),
            timings=dict(run.judgement.timings),
            cause=None if selftest.good else selftest.reason,
            shared_gpu=run.judgement.gpu_shared,
        )
        failed = not selftest.good
    entry: dict[str, Any] = {
        "key": run.key,
        "outcome": line,
        # the session fails on it whatever tests were selected
        "cause": cause,
        "lines": run.summary_lines(),
        "tails": [[title, text] for title, text in run.log_tails()] if failed else [],
        "row": row.as_dict(),
        "report": None,
        "report_error": None,
    }
    if with_report:
        try:
            entry["report"] = run.report(limits).as_dict()
        except Exception as exc:  # a report bug must not cost the qualification: say it instead
            entry["report_error"] = f"{type(exc).__name__}: {exc}"
    return entry
