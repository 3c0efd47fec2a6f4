"""One cause, said the same everywhere (issue #37): over every committed run (tests/data), the
console's outcome line and table row, the report's row (report.json's ``outcome``, as an xdist
worker ships it, and the HTML page), verify's ``--json`` and the JUnit properties name the same
outcome and cause, each through the code path that produces it, without a launch: the run
judged as ``--nvrx-run-dir`` judges it (judge_existing), verify through its command.

The runs cover every kind of cause but the launch's deadline and the time limits (the runs'
outcomes are recorded by no launch and held to no limit): those two are given here to
committed runs, the deadline as the launch would report it, the limits as options would.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections import Counter
from pathlib import Path

import pytest

from pytest_nvrx.criteria.outcome import Outcome
from pytest_nvrx.evidence.refs import html_text
from pytest_nvrx.report import ScenarioReport, render_html
from pytest_nvrx.session import junit
from pytest_nvrx.session.console import scenario_entry
from pytest_nvrx.session.scenario_run import Limits, ScenarioRun, judge_existing
from pytest_nvrx.session.verdict_table import Row, verdict_table
from pytest_nvrx.settings import NvrxSettings
from pytest_nvrx.verify import verify_main

DATA = Path(__file__).resolve().parents[1] / "data"
#: every committed run directory (its own logs/launcher.log)
RUNS = sorted(p.parent.parent for p in DATA.rglob("logs/launcher.log"))


def _id(run: Path) -> str:
    return str(run.relative_to(DATA))


def said_everywhere(run: ScenarioRun, limits: Limits | None, tmp_path: Path) -> Outcome:
    """Assert every output names the run's outcome and cause; returns the outcome."""
    outcome = run.outcome(limits)
    cause = outcome.reason
    assert (cause is None) is outcome.qualified
    # the console: the outcome line, the cause the session fails on, the table's row
    entry = scenario_entry(run, limits, with_report=True)
    assert entry["outcome"] == f"nvrx {run.key}: {outcome.text}"
    assert entry["cause"] == cause
    row = Row.from_dict(entry["row"])
    assert (row.outcome, row.cause) == (outcome.status, cause)
    # ... whole in the table, at a narrow width too (wrapped, never cut)
    for width in (80, 200):
        shown = " ".join(" ".join(verdict_table([row], width=width)[2:]).split())
        assert " ".join((cause or "").split()) in shown
    # a failed run's log tails travel once, with its entry; a qualified run has none
    assert bool(entry["tails"]) is (outcome.kind not in (None, "limits"))
    # the report, as the worker ships it and the controller writes it
    report = ScenarioReport.from_dict(entry["report"])
    assert report.outcome == outcome.text and report.cause == outcome.cause
    assert report.passed is (outcome.cause is None)
    assert entry["report"]["outcome"] == outcome.text
    if outcome.cause is not None:
        page = render_html([report])
        assert f'<span class="bad">NOT QUALIFIED</span>: {html_text(outcome.cause)}' in page
    # JUnit: the run's first testcase
    props = dict(junit.run_properties(run, limits))
    assert props["nvrx_outcome"] == outcome.text
    assert props.get("nvrx_cause") == cause
    if limits is None and run.error is None:
        # verify, through its command: it knows no launch and no limit
        out = tmp_path / "verify.json"
        verify_main([str(run.layout.run_dir), "--json", str(out)], io.StringIO(), io.StringIO())
        doc = json.loads(out.read_text())
        assert (doc["outcome"], doc["cause"]) == (outcome.text, cause)
        assert doc["summary"] == outcome.summary == report.summary
    return outcome


def _quiet(line: str) -> None:
    """judge_existing's lines (the first cause said as it is judged) are not compared here."""


@pytest.mark.parametrize("run_dir", RUNS, ids=_id)
def test_every_output_names_the_same_cause(run_dir: Path, tmp_path: Path) -> None:
    run = judge_existing(run_dir, NvrxSettings(), _quiet)
    said_everywhere(run, None, tmp_path)


def test_the_committed_runs_cover_every_kind_of_cause_the_run_dir_can_give() -> None:
    """Else the test above would compare little: qualified runs, runs that cannot be judged,
    first causes, failing criteria and planted runs are all among them."""
    kinds: Counter[str | None] = Counter()
    planted = 0
    for run_dir in RUNS:
        outcome = judge_existing(run_dir, NvrxSettings(), _quiet).outcome()
        kinds[outcome.kind] += 1
        planted += outcome.planted is not None
    assert set(kinds) == {None, "cannot-judge", "first-cause", "criterion"}, kinds
    assert planted > 0


def test_the_launch_s_deadline_is_the_cause_where_the_run_dir_names_none(tmp_path: Path) -> None:
    """A qualified run whose launch the deadline stopped: the deadline is its cause everywhere
    (the first cause, a judgement that cannot be judged and a failing criterion come first)."""
    run = judge_existing(DATA / "windows" / "cpu" / "ref-kill-step", NvrxSettings(), _quiet)
    assert run.outcome().qualified
    late = dataclasses.replace(run, error="run timeout 300 s reached; process tree stopped")
    outcome = said_everywhere(late, None, tmp_path)
    assert (outcome.kind, outcome.cause) == ("launch", late.error)
    # where the run dir names a cause, that one leads
    failed = judge_existing(DATA / "setup-failure" / "ref-setup-failure", NvrxSettings(), _quiet)
    first = failed.outcome()
    assert first.kind == "first-cause"
    assert dataclasses.replace(failed, error="run timeout").outcome() == first


def test_a_broken_time_limit_is_the_cause_only_after_every_criterion(tmp_path: Path) -> None:
    kill = judge_existing(DATA / "windows" / "cpu" / "ref-kill-step", NvrxSettings(), _quiet)
    outcome = said_everywhere(kill, Limits(downtime_s=0.5), tmp_path)
    assert outcome.kind == "limits" and outcome.cause is not None
    assert outcome.cause.startswith("downtime ") and "exceeds the limit 0.5 s" in outcome.cause
    # a run that failed a criterion is named by it, whatever the limits
    failing = next(
        run
        for run in (judge_existing(d, NvrxSettings(), _quiet) for d in RUNS)
        if run.outcome().kind == "criterion" and run.judgement.planted is None
    )
    held = said_everywhere(failing, Limits(downtime_s=0.001, shared_gpu=True), tmp_path)
    assert held == failing.outcome()


def test_a_report_document_whose_outcome_contradicts_passed_is_refused() -> None:
    """The document keeps the cause once, in its outcome line; a document (an edited or
    truncated report.json that --nvrx-compare reads) whose ``passed`` says otherwise is no
    report, never read one way or the other."""
    report = ScenarioReport.from_run_dir(DATA / "windows" / "cpu" / "ref-kill-step")
    data = report.as_dict()
    assert ScenarioReport.from_dict(data) == report
    with pytest.raises(
        ValueError, match=r"'passed' is false, yet 'outcome' is .*contradicts itself"
    ):
        ScenarioReport.from_dict({**data, "passed": False})
    with pytest.raises(
        ValueError, match=r"'passed' is true, yet 'outcome' is .*contradicts itself"
    ):
        ScenarioReport.from_dict({**data, "outcome": "NOT QUALIFIED: replaced_cycle: no"})
    with pytest.raises(ValueError, match="not an outcome"):
        ScenarioReport.from_dict({**data, "outcome": "qualified, trust me"})
