"""A run our run timeout ended is diagnosed as such (issue #35, item 3).

tests/data/cpu-timeout holds three real reference runs through the real ft_launcher whose run
timeout ended them (README there): a hang in a step whose 300 s step deadline outlasts the 60 s
run timeout, the schedule ``kill@step,hang@restore`` whose second fault hangs the replacement
while it loads (only the 300 s setup deadline would see it), and a kill run stopped at 6 s,
before its fault. Their first cause (verify's text and JSON, the report, the scenario's outcome,
JUnit's criterion reasons) names the run timeout and the fault it cut short; a doctored copy
whose result.json does not say the run timed out claims nothing of the kind; none passes.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from pytest_nvrx.criteria import Judgement, judge_run_dir
from pytest_nvrx.criteria.first_cause import RUN_TIMEOUT
from pytest_nvrx.criteria.outcome import run_outcome
from pytest_nvrx.report import ScenarioReport
from pytest_nvrx.session import junit
from pytest_nvrx.session.scenario_run import judge_existing
from pytest_nvrx.settings import ConfigError, NvrxSettings, check_run_timeout
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import LAUNCHER, copy_run
from tests.helpers.recorded_runs import assert_led_by_cause, recorded_config

DATA = Path(__file__).parents[1] / "data" / "cpu-timeout"
HANG_STEP = DATA / "ref-timeout-hang-step"
HANG_RESTORE = DATA / "ref-timeout-kill-step_hang-restore"
BEFORE_FAULT = DATA / "ref-timeout-before-fault"
RESULT = "result.json"

#: What each run's first cause must say after the lead, as a pattern.
SAYS = {
    HANG_STEP: r"the hang@step struck at 23:58:59\.740 \(fault_injected\.json:\d+\) and was still"
    r" undetected 51\.8 s later \(its rank stopped in the open step section, whose deadline had"
    r" not come\); the launch lasted 65\.2 s",
    HANG_RESTORE: r"fault 2 of 2 \(hang@restore in cycle 1\) struck at 00:00:12\.337"
    r" \(fault_injected_2\.json:\d+\) and was still undetected 49\.0 s later \(its rank stopped in"
    r" the open setup section, whose deadline had not come\); the launch lasted 65\.2 s",
    BEFORE_FAULT: r"before the kill@step was injected \(no iteration was logged\); the launch"
    r" lasted 11\.2 s",
}


def judged(run_dir: Path) -> Judgement:
    return judge_run_dir(run_dir, None)


@pytest.mark.parametrize("run_dir", list(SAYS), ids=lambda p: p.name)
def test_the_first_cause_names_the_run_timeout_and_the_fault_it_cut_short(run_dir: Path) -> None:
    judgement = judged(run_dir)
    cause = judgement.first_cause
    assert cause is not None and cause.run_timeout
    assert re.fullmatch(rf"{RUN_TIMEOUT}: {SAYS[run_dir]} \[result\.json:\d+\]", cause.text), (
        cause.text
    )
    assert cause.ref.text.strip() == '"timed_out": true,'
    assert not judgement.passed
    assert_led_by_cause(judgement)
    assert run_outcome(judgement).summary.startswith(f"FAILED: {cause.text}; ")


def test_verify_says_it_in_text_and_json(tmp_path: Path) -> None:
    out = io.StringIO()
    status = verify_main([str(HANG_RESTORE), "--json", str(tmp_path / "v.json")], stdout=out)
    assert status == 1
    text = out.getvalue()
    assert f"first cause: {RUN_TIMEOUT}: fault 2 of 2 (hang@restore in cycle 1) struck" in text
    doc = json.loads((tmp_path / "v.json").read_text())
    first = doc["first_cause"]
    assert first["run_timeout"] is True and first["location"].startswith("result.json:")
    assert "still undetected 49.0 s later" in first["text"]
    assert any(e.startswith("fault_injected_2.json:") for e in first["evidence"])
    assert doc["passed"] is False


def test_the_report_the_outcome_and_junit_say_it() -> None:
    cause = judged(HANG_STEP).first_cause
    assert cause is not None
    assert ScenarioReport.from_run_dir(HANG_STEP).first_cause == cause.text
    run = judge_existing(HANG_STEP, NvrxSettings(), lambda line: None)
    assert run.outcome().text == f"NOT QUALIFIED: {cause.text}"
    reason = dict(junit.criterion_properties(run, "replaced_cycle"))["nvrx_reason"]
    assert reason.startswith(f"{cause.text}; ")


@pytest.mark.parametrize("run_dir", list(SAYS), ids=lambda p: p.name)
def test_a_copy_whose_result_does_not_say_timed_out_claims_no_run_timeout(
    run_dir: Path, tmp_path: Path
) -> None:
    doctor = copy_run(run_dir, tmp_path / run_dir.name)
    doctor.set_json(RESULT, timed_out=False)
    judgement = judged(doctor.root)
    cause = judgement.first_cause
    assert cause is None or not cause.run_timeout
    assert RUN_TIMEOUT not in run_outcome(judgement).summary
    assert not judgement.passed  # the launcher still ended on a signal, never a finish


def test_a_fault_detected_before_the_stop_and_not_recovered_says_so(tmp_path: Path) -> None:
    """The hang's section deadline passes before the run timeout (a doctored line): detected,
    and still no step after a restore when the run timeout ended the run."""
    doctor = copy_run(HANG_STEP, tmp_path / "detected")
    doctor.insert_before(
        LAUNCHER,
        "Received 15 death signal",
        "2026-12-04 23:59:45,100 [WARNING] [vm] [workload:?(1) infra:?(?)] rank_monitor_server.py"
        ":522 [Cycle 0] Section 'step' has been open for 45.36 seconds. Timeout is 45.00 seconds.",
    )
    cause = judged(doctor.root).first_cause
    assert cause is not None and cause.run_timeout
    assert (
        "the hang@step struck at 23:58:59.740 (fault_injected.json:24) and was detected at"
        " 23:59:45.100 (logs/launcher.log:46) but not recovered: no step was committed after its"
        " restore 51.8 s later"
    ) in cause.text, cause.text


def test_the_stops_own_records_are_no_worker_failure() -> None:
    """Stopped before its fault, the workers the launcher ended exit -15: the first cause is the
    run timeout, never "the workers failed before the fault" (what it said before)."""
    cause = judged(BEFORE_FAULT).first_cause
    assert cause is not None and cause.run_timeout and not cause.never
    assert "failed (exitcode: -15)" not in cause.text


@pytest.mark.parametrize(
    ("run_dir", "refused"),
    [(HANG_STEP, "~305 s"), (HANG_RESTORE, "~306 s"), (BEFORE_FAULT, None)],
    ids=lambda v: v.name if isinstance(v, Path) else str(v),
)
def test_todays_cli_refuses_the_hang_runs_before_launch(run_dir: Path, refused: str | None) -> None:
    """The two hang runs were made before the feasibility check, which refuses them now (their
    60 s run timeout cannot fit a 300 s deadline); the one stopped before its fault fits 6 s."""
    config = recorded_config(run_dir)
    timeout = 6.0 if run_dir == BEFORE_FAULT else 60.0
    if refused is None:
        check_run_timeout(config, timeout)
        return
    with pytest.raises(ConfigError, match=f"raise --timeout above {refused}"):
        check_run_timeout(config, timeout)
