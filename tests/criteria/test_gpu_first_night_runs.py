"""The shipped GPU matrix on a freshly extracted Megatron checkout (tests/data/gpu-first-night):
ten scenarios and a CLI run started together on one H200, one build of the dataset helpers
between two sessions, every scenario QUALIFIED; re-judged here on every commit."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.criteria.outcome import run_outcome

DATA = Path(__file__).parents[1] / "data" / "gpu-first-night"
BASELINE = DATA / "megatron-baseline"
RUNS = sorted(p.parent for p in DATA.glob("*/run.json"))
SCENARIOS = [r for r in RUNS if r.name.startswith("megatron-")]
SETUP150 = DATA / "cli-kill-step_hang-restore-setup150"


def test_the_matrix_is_all_here() -> None:
    assert len(SCENARIOS) == 10 and SETUP150 in RUNS


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_every_run_qualifies_and_no_worker_failed_first(run: Path) -> None:
    judgement = judge_run_dir(run, baseline=None if run == BASELINE else BASELINE)
    assert judgement.passed, run_outcome(judgement).summary
    assert judgement.first_cause is None


def test_one_build_for_both_sessions() -> None:
    """The CLI session built the helpers, once; the pytest session waited for that build."""
    session = (DATA / "pytest.log").read_text(encoding="utf-8")
    cli = (DATA / "cli-runs.log").read_text(encoding="utf-8")
    built = re.findall(r"megatron build: .*", cli)
    waited = re.findall(r"megatron build: .*", session)
    assert len(built) == 1 and "built in" in built[0] and "once, before launch" in built[0]
    assert len(waited) == 1
    assert "built by pid" in waited[0] and "(run g1-kill-step_hang-restore-setup150)" in waited[0]
    assert "waited" in waited[0]
    assert len(re.findall(r"^megatron-\S+ .*QUALIFIED", session, re.M)) == 10
    assert "NOT QUALIFIED" not in session


def test_the_setup150_schedule_recovered_from_the_hang_in_restore() -> None:
    judgement = judge_run_dir(SETUP150)
    (first, second) = judgement.recoveries
    assert (first.fault, second.fault) == ("kill@step", "hang@restore")
    assert second.outcome == "recovered"
    # found by the setup section's 150 s deadline (the section opened ~6 s before the hang
    # struck: launcher.log:61 "Section 'setup' has been open for 154.80 seconds"), nothing sooner
    assert 140 <= second.timings()["failure_to_detected_s"] < 155
    log = (SETUP150 / "logs" / "launcher.log").read_text(encoding="utf-8")
    assert "Section 'setup' has been open for" in log and "Timeout is 150.00 seconds" in log


def test_junit_carries_both_recoveries_of_the_two_kill_schedule() -> None:
    root = ET.parse(DATA / "junit.xml").getroot()
    props = {
        p.attrib["name"]: p.attrib["value"]
        for case in root.iter("testcase")
        if case.attrib["name"] == "test_run_finished[megatron-schedule-kill-step_kill-restore]"
        for p in case.iter("property")
    }
    assert props["nvrx_recoveries"] == "2"
    assert props["nvrx_fault1"] == "kill@step" and props["nvrx_fault2"] == "kill@restore"
    assert props["nvrx_fault1_outcome"] == "struck" and props["nvrx_fault2_outcome"] == "recovered"
    assert float(props["nvrx_fault2_downtime_s"]) > 0
    judged = judge_run_dir(DATA / "megatron-schedule-kill-step_kill-restore")
    assert props["nvrx_schedule_downtime_s"] == f"{judged.total_downtime_s:.3f}".rstrip("0")
