"""What a failing scenario says on the console (issue #38), through the real plugin over a
committed run whose workers died before the fault (every criterion fails): its log tails once,
after its verdicts (they were printed once per failed criterion, ~60 lines each); its cause on
the ``-ra`` lines and JUnit's failure messages, and whole in the verdict table's row."""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from itertools import takewhile
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.criteria.outcome import run_outcome
from pytest_nvrx.evidence.refs import printable
from tests.helpers.sessions import SUITE_ARGS

pytest_plugins = ["pytester"]

SETUP_FAILURE = Path(__file__).resolve().parents[1] / "data" / "setup-failure" / "ref-setup-failure"
TAILS = ("nvrx: tail of logs/train_cycle", "nvrx: tail of logs/launcher.log")


@pytest.fixture
def failed_session(
    pytester: pytest.Pytester, clean_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[pytest.RunResult, Path, Path]:
    """The suite over a copy of the committed run, with ``-ra`` on a terminal wide enough for
    pytest to show each failure's message beside its test id."""
    run = tmp_path / "run"
    shutil.copytree(SETUP_FAILURE, run)
    junit = tmp_path / "junit.xml"
    monkeypatch.setenv("COLUMNS", "1000")
    result = pytester.runpytest(
        *SUITE_ARGS, "--nvrx-run-dir", str(run), "-ra", f"--junitxml={junit}"
    )
    return result, run, junit


def test_a_failed_scenario_prints_its_log_tails_once_after_its_verdicts(
    failed_session: tuple[pytest.RunResult, Path, Path],
) -> None:
    result, _, _ = failed_session
    assert result.parseoutcomes()["failed"] >= 4  # the run's own test and the criteria's
    lines = result.outlines
    for title in TAILS:
        assert sum(title in line for line in lines) == 1, title
    verdicts = next(i for i, x in enumerate(lines) if re.search(r"=+ nvrx verdicts =+", x))
    last_verdict = max(i for i, x in enumerate(lines) if x.startswith("  FAIL "))
    tails = [i for i, x in enumerate(lines) if any(t in x for t in TAILS)]
    table = next(i for i, x in enumerate(lines) if re.search(r"=+ nvrx verdict table =+", x))
    assert verdicts < last_verdict < min(tails) and max(tails) < table
    # none in the failures' own sections: the failures say why, the tails say how it ended
    failures = next(i for i, x in enumerate(lines) if re.search(r"=+ FAILURES =+", x))
    assert failures < verdicts


def test_the_ra_lines_and_junit_carry_the_cause(
    failed_session: tuple[pytest.RunResult, Path, Path],
) -> None:
    result, run, junit = failed_session
    judgement = judge_run_dir(run)
    cause = judgement.first_cause
    assert cause is not None and run_outcome(judgement).cause == cause.text
    said = printable(cause.text)
    summary = result.outlines[
        next(i for i, x in enumerate(result.outlines) if "short test summary info" in x) :
    ]
    failed = [x for x in summary if x.startswith("FAILED ")]
    assert len(failed) == result.parseoutcomes()["failed"]
    (finished,) = [x for x in failed if "::test_run_finished[existing-run]" in x]
    assert finished.endswith(f"[existing-run] - Failed: {said}"), finished
    criteria = [x for x in failed if "::test_recovery_criterion[" in x]
    assert criteria and all(f"] - Failed: {said}; " in x for x in criteria), criteria
    # JUnit's failure messages: the same lines
    messages = [f.get("message") or "" for f in ET.parse(junit).getroot().iter("failure")]
    assert len(messages) == len(failed)
    assert all(m.startswith(f"Failed: {said}") for m in messages), messages
    # the verdict table's row: the whole cause, beside the row
    lines = result.outlines
    table = next(i for i, x in enumerate(lines) if re.search(r"=+ nvrx verdict table =+", x))
    column = lines[table + 1].index("cause")
    rows = lines[table + 3 :]
    row = next(i for i, x in enumerate(rows) if x.startswith("existing-run"))
    more = takewhile(lambda x: x.strip() and not x[:column].strip(), rows[row + 1 :])
    shown = " ".join(x[column:] for x in [rows[row], *more])
    assert " ".join(shown.split()) == " ".join(said.split())
