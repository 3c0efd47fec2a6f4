"""Clocks agree (#21 item 3): doctored copies of real passing runs whose times contradict each
other are "cannot judge" (exit 2), never a pass, and the downtime gate refuses them."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pytest_nvrx.criteria import Judgement, judge_run_dir
from pytest_nvrx.criteria.outcome import run_outcome
from pytest_nvrx.layout import RunLayout
from pytest_nvrx.session.scenario_run import Limits, ScenarioRun
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import CYCLE0, CYCLE1, MARKER, Doctor, copy_run

DATA = Path(__file__).parents[1] / "data"
G2_KILL = DATA / "gpu-continuity" / "g2-kill-30"
REF_KILL = DATA / "windows" / "cpu" / "ref-kill-save"


def _cannot_judge(run: Doctor) -> tuple[Judgement, str]:
    judgement = judge_run_dir(run.root)
    assert not judgement.judgeable and not judgement.passed
    assert run_outcome(judgement).summary == "CANNOT JUDGE (see errors)"
    assert all(not v.passed or v.not_applicable for v in judgement.verdicts)
    err = io.StringIO()
    assert verify_main([str(run.root)], io.StringIO(), err) == 2
    return judgement, err.getvalue()


def test_the_unchanged_runs_are_judged(g2: Doctor, ref: Doctor) -> None:
    for run in (g2, ref):
        assert judge_run_dir(run.root).passed


def test_a_cycle_stamped_an_hour_early_cannot_be_judged_nor_gated(g2: Doctor) -> None:
    g2.replace(CYCLE1, "[2026-11-30 13:4", "[2026-11-30 12:4")
    judgement, err = _cannot_judge(g2)
    assert "before the launcher started cycle 1 at 13:43:30.970" in err
    assert "impossible timing: failure to first iteration after restore is -35" in err
    run = ScenarioRun("g2", None, RunLayout.for_run(g2.root), judgement)
    failures = run.gate_failures(Limits(downtime_s=1.0))
    assert failures and failures[0].startswith("cannot hold the run to --nvrx-max-downtime")


def test_a_line_that_goes_back_in_time_cannot_be_judged(ref: Doctor) -> None:
    """Iteration 6 stamped before its own rank's load line of the same cycle."""
    ref.replace(
        CYCLE1,
        "2026-11-30T16:22:18.385+00:00 rank 0 iteration 6/20",
        "2026-11-30T16:22:18.000+00:00 rank 0 iteration 6/20",
    )
    _, err = _cannot_judge(ref)
    assert "rank 0 went back in time: logs/train_cycle1.log:7 is stamped 16:22:18.000 after" in err
    assert "logs/train_cycle1.log:5 at 16:22:18.170" in err


def test_a_killed_rank_that_prints_after_its_death_cannot_be_judged(g2: Doctor) -> None:
    line = g2.lines(CYCLE0)[g2.line_no(CYCLE0, "iteration        9/") - 1]
    late = line.replace("13:43:26.354178", "13:43:26.900000").replace(
        "iteration        9/", "iteration       10/"
    )
    g2.insert_after(CYCLE0, "iteration        9/", late)
    _, err = _cannot_judge(g2)
    assert "rank 1 was sent SIGKILL at 13:43:26.382" in err
    assert "is stamped 13:43:26.900: a killed rank printed after its death" in err


def test_a_marker_stamped_before_its_cycle_began_cannot_be_judged(g2: Doctor) -> None:
    g2.replace(MARKER, "2026-11-30T13:43:26.382070+00:00", "2026-11-30T13:30:00.000000+00:00")
    _, err = _cannot_judge(g2)
    assert "the marker's time 13:30:00.000 lies outside the launcher's record of the faulted" in err


def test_a_stopped_rank_that_trains_on_cannot_be_judged(tmp_path: Path) -> None:
    """The hung rank commits iteration 11 (cycle 1's own line, restamped) while its SIGSTOP
    held: the launcher timed its checkpointing section out only 33 s later."""
    hang = copy_run(DATA / "windows" / "gpu" / "g2-hang-finalize", tmp_path / "hang")
    line = hang.lines(CYCLE1)[hang.line_no(CYCLE1, "iteration       11/") - 1]
    hang.insert_after(
        CYCLE0, "resumed after SIGSTOP", line.replace("16:26:49.645031", "16:25:45.000000")
    )
    _, err = _cannot_judge(hang)
    assert "rank 1 was sent SIGSTOP at 16:25:30.177" in err
    assert "is stamped 16:25:45.000: a stopped rank trained on after its SIGSTOP" in err


@pytest.mark.parametrize(
    "stamp", ["9999-12-31T23:59:59.000+00:00", "2026-13-45T16:22:18.385+00:00"]
)
def test_an_iteration_stamped_with_no_usable_time_cannot_be_judged(ref: Doctor, stamp: str) -> None:
    ref.replace(
        CYCLE1,
        "2026-11-30T16:22:18.385+00:00 rank 0 iteration 6/20",
        f"{stamp} rank 0 iteration 6/20",
    )
    _, err = _cannot_judge(ref)
    assert "logs/train_cycle1.log:7 is stamped with no usable time" in err


# -- the records bracket each other (#22 item 5: a zone rewritten on one record) -------------

RECORD0 = "cycle_infos/cycle_info..0.0"
RECORD1 = "cycle_infos/cycle_info..0.1"


@pytest.mark.parametrize(
    ("rel", "old", "new", "said"),
    [
        (
            "run.json",
            "2026-11-30T16:22:02.881+00:00",
            "2026-11-30T16:22:02.881+23:59",
            "result.json:6 says the launch began at 2026-11-30 16:22:02.886 but run.json:76,"
            " written as it began, says 2026-11-29 16:23:02.881",
        ),
        (
            "result.json",
            "2026-11-30T16:22:02.886+00:00",
            "2026-11-30T16:22:02.886+23:59",
            "says the launch began at 2026-11-29 16:23:02.886",
        ),
        (
            "result.json",
            "2026-11-30T16:22:28.906+00:00",
            "2026-11-30T16:22:28.906-00:10",
            "result.json:6..result.json:7 span 626.020 s but the harness timed the launch at"
            " 26.020 s (result.json:3)",
        ),
        ("result.json", '"wall_s": 26.02,', '"wall_s": 86426.02,', "the harness timed"),
        (
            RECORD0,
            "2026-11-30T16:22:04.914203Z",
            "2026-11-30T16:22:04.914203+23:59",
            f"{RECORD0}:2: cycle 0 started at 2026-11-29 16:23:04.914, before the launcher's"
            " first line logs/launcher.log:1 at 2026-11-30 16:22:04.824",
        ),
        (
            RECORD0,
            "2026-11-30T16:22:11.250413Z",
            "2026-11-30T16:22:11.250413-23:59",
            f"{RECORD0}:3 (cycle 0's record end) is stamped 2026-12-01 16:21:11.250, outside"
            " the launch 2026-11-30 16:22:02.886..2026-11-30 16:22:28.906",
        ),
        (
            RECORD1,
            "2026-11-30T16:22:13.631624Z",
            "2026-11-30T16:22:09.631624Z",
            f"{RECORD1}:3: cycle 1 started at 2026-11-30 16:22:09.631, before the previous"
            f" cycle ended at 2026-11-30 16:22:11.250 ({RECORD0}:3)",
        ),
        (
            RECORD1,
            "2026-11-30T16:22:23.960596Z",
            "2026-11-30T16:22:12.960596Z",
            f"{RECORD1}: cycle 1 ends before it starts",
        ),
    ],
    ids=[
        "run-json-zone",
        "result-start-zone",
        "result-end-zone",
        "wall-s",
        "cycle-0-start-a-day-early",
        "cycle-0-end-a-day-late",
        "cycle-1-before-cycle-0-ended",
        "cycle-1-ends-before-it-starts",
    ],
)
def test_records_that_do_not_bracket_each_other_cannot_be_judged(
    ref: Doctor, rel: str, old: str, new: str, said: str
) -> None:
    """The harness's records, the launcher's lines and the cycle records tell one story
    (clocks._records_out_of_order); each edit passed 6/6 before (one more: the adversarial
    sweep of #22 found the first and the fifth)."""
    ref.replace(rel, old, new, 1)
    _, err = _cannot_judge(ref)
    assert said in err, err


def test_the_harness_times_moved_together_leave_the_launcher_outside_the_launch(
    ref: Doctor,
) -> None:
    ref.replace("run.json", "16:22:02.881+00:00", "16:22:02.881+23:59", 1)
    ref.replace("result.json", "16:22:02.886+00:00", "16:22:02.886+23:59", 1)
    ref.replace("result.json", "16:22:28.906+00:00", "16:22:28.906+23:59", 1)
    _, err = _cannot_judge(ref)
    assert "logs/launcher.log:1 (the launcher's first line) is stamped 2026-11-30" in err, err
