"""A real schedule run whose first cycle died before its fault fired (tests/data/gpu-port-race):
the rendezvous port was taken before the worker bound it. The same fault is armed again by the
next cycle; the run is NOT QUALIFIED because of the failure no fault explains, and says so
first, never "cannot judge" and never a pass."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.criteria.outcome import run_outcome
from tests.helpers.adversarial import committed_schedule_runs
from tests.helpers.doctor import copy_run

RUN = (
    Path(__file__).parents[1]
    / "data"
    / "gpu-port-race"
    / "megatron-schedule-kill-step_kill-restore"
)


def test_the_failure_before_the_fault_is_the_first_cause_and_fails_the_run() -> None:
    judgement = judge_run_dir(RUN)
    assert judgement.judgeable, judgement.unjudgeable_reasons
    assert not judgement.passed
    assert judgement.first_cause is not None
    assert "DistNetworkError" in judgement.first_cause.text
    assert "logs/train_cycle0.log:896" in judgement.first_cause.text
    assert "EADDRINUSE" in judgement.first_cause.ref.text
    failed = [v for v in judgement.verdicts if not v.passed]
    assert [v.id for v in failed] == ["no_repeat_injection"]
    assert "a failure no scheduled fault explains" in failed[0].reason
    assert "logs/launcher.log:40" in [r.location for r in failed[0].evidence if r is not None]
    outcome = run_outcome(judgement)
    assert outcome.kind == "first-cause" and "DistNetworkError" in (outcome.cause or "")
    # the faults themselves: fault 1 in cycle 1, struck while restoring; fault 2 recovered
    first, second = judgement.recoveries
    assert (first.fault, second.fault) == ("kill@step", "kill@restore")
    assert second.outcome == "recovered"


def test_without_its_traceback_the_early_failure_still_fails_the_run(tmp_path: Path) -> None:
    """Absence is not evidence: cycle 0's log cut before the traceback still exited 1."""
    doc = copy_run(RUN, tmp_path / "run")
    doc.truncate_after("logs/train_cycle0.log", "> initializing torch distributed ...")
    judgement = judge_run_dir(doc.root)
    assert not judgement.passed
    assert any(
        "a failure no scheduled fault explains" in v.reason
        for v in judgement.verdicts
        if not v.passed
    )


def test_a_cycle_arming_a_fault_after_it_fired_cannot_be_judged(tmp_path: Path) -> None:
    """Arming again before the fault fired is what a failed cycle leads to; arming it again after
    it fired (its marker was there) is a contradiction."""
    doc = copy_run(RUN, tmp_path / "run")
    doc.replace(
        "logs/train_cycle2.log",
        "arming fault 2 of 2 (kill@restore)",
        "arming fault 1 of 2 (kill@step)",
    )
    judgement = judge_run_dir(doc.root)
    assert not judgement.judgeable
    assert any("but fault 1 fired in cycle 1" in r for r in judgement.unjudgeable_reasons)


SCHEDULE_RUNS = committed_schedule_runs()
ARMING = re.compile(r"arming fault (\d+) of (\d+) \((\S+)\), marker (\S+)")


def test_every_committed_schedule_of_two_faults_or_more_is_here() -> None:
    assert len(SCHEDULE_RUNS) >= 18, SCHEDULE_RUNS


@pytest.mark.parametrize("run", SCHEDULE_RUNS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_cycle_arming_a_fault_before_the_previous_one_fired_cannot_be_judged(
    run: Path, tmp_path: Path
) -> None:
    """The injector arms the first fault without a marker: fault k+1 only after fault k fired.
    The cycle where fault 1 fired, said to have armed fault 2 (its arming line relabelled), is a
    contradiction however the rest reads; before, that passed for every run that passes."""
    doc = copy_run(run, tmp_path / "run")
    fired = judge_run_dir(run).recoveries[0].marker.restart_count
    rel = f"logs/train_cycle{fired}.log"
    schedule = json.loads(doc.path("run.json").read_text(encoding="utf-8"))["config"]["schedule"]
    lines = doc.lines(rel)
    at = next(i for i, text in enumerate(lines) if "arming fault 1 of" in text)
    match = ARMING.search(lines[at])
    assert match is not None, lines[at]
    second = match[4].replace("fault_injected.json", "fault_injected_2.json")
    lines[at] = (
        lines[at][: match.start()]
        + f"arming fault 2 of {match[2]} ({schedule[1]}), marker {second}"
        + lines[at][match.end() :]
    )
    doc.write_lines(rel, lines)
    judgement = judge_run_dir(doc.root)
    assert not judgement.judgeable, run_outcome(judgement).summary
    assert any(f"but fault 1 fired in cycle {fired}" in r for r in judgement.unjudgeable_reasons), (
        judgement.unjudgeable_reasons
    )
