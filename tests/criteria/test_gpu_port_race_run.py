"""A real schedule run whose first cycle died before its fault fired (tests/data/gpu-port-race):
the rendezvous port was taken before the worker bound it. The same fault is armed again by the
next cycle; the run is NOT QUALIFIED because of the failure no fault explains, and says so
first, never "cannot judge" and never a pass."""

from __future__ import annotations

from pathlib import Path

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.criteria.outcome import run_outcome
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
