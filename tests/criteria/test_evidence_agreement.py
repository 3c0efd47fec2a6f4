"""All the evidence must agree (issue #21): doctored copies of real passing runs, each with one
thing edited that a first-match judgement would have passed.

The runs: ``ref-kill-save`` (the CPU reference workload, 2 ranks, each printing its own lines)
and ``g2-kill-30`` (Megatron on 2 x H200, rank 0 printing the load lines).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.criteria.outcome import run_outcome
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import CYCLE1, Doctor

DATA = Path(__file__).parents[1] / "data"
REF_KILL = DATA / "windows" / "cpu" / "ref-kill-save"
G2_KILL = DATA / "gpu-continuity" / "g2-kill-30"


def test_the_unchanged_runs_pass(ref: Doctor, g2: Doctor) -> None:
    for run in (ref, g2):
        judgement = judge_run_dir(run.root)
        assert judgement.passed, run_outcome(judgement).summary


# --- every rank restores the same checkpoint ---------------------------------------------------


def test_ranks_that_restore_different_iterations_fail(ref: Doctor) -> None:
    ref.replace(CYCLE1, "rank 1 load checkpoint iteration 5", "rank 1 load checkpoint iteration 10")
    verdict = judge_run_dir(ref.root).verdict("optimizer_state_load")
    assert not verdict.passed
    assert verdict.reason.startswith(
        "the ranks of cycle 1 restored different checkpoints (rank 0 iteration 5, rank 1"
        " iteration 10)"
    )
    assert [e.location for e in verdict.evidence] == [f"{CYCLE1}:5", f"{CYCLE1}:6"]


def test_a_rank_without_a_load_line_fails(ref: Doctor) -> None:
    ref.delete(CYCLE1, "rank 1 load checkpoint iteration 5")
    verdict = judge_run_dir(ref.root).verdict("optimizer_state_load")
    assert not verdict.passed
    assert verdict.reason.startswith(
        "cycle 1 rank 1 shows no checkpoint load while rank(s) 0 loaded iteration 5"
    )
    assert verdict.evidence[0].location == f"{CYCLE1}:5"
    assert verdict.evidence[1].text.startswith("1: ")


def test_megatron_loading_one_iteration_and_loaded_another_fails(g2: Doctor) -> None:
    g2.replace(
        CYCLE1,
        "loading distributed checkpoint from /tmp/w/runs/g2-kill-30/checkpoints at iteration 5",
        "loading distributed checkpoint from /tmp/w/runs/g2-kill-30/checkpoints at iteration 10",
    )
    verdict = judge_run_dir(g2.root).verdict("optimizer_state_load")
    assert not verdict.passed
    assert verdict.reason == (
        "cycle 1 rank 0 began loading iteration 10 but reports iteration 5 loaded"
    )
    assert [e.location for e in verdict.evidence] == [f"{CYCLE1}:957", f"{CYCLE1}:976"]


# --- the iteration sequence is an invariant ----------------------------------------------------


def _sequence_failure(run: Doctor) -> str:
    verdict = judge_run_dir(run.root).verdict("progress_past_restore")
    assert not verdict.passed, verdict.render()
    return verdict.reason


def test_a_replacement_that_resumes_past_the_restored_iteration_fails(ref: Doctor) -> None:
    """Restored 5, resumed at 11: iterations 6..10 never trained (a counter restored too high)."""
    for it in range(6, 11):
        ref.delete(CYCLE1, f"rank 0 iteration {it}/20 ")
    assert _sequence_failure(ref) == (
        "the iteration sequence is broken: cycle 1 rank 0 resumed at iteration 11 after restored"
        " iteration 5: the first iteration after it is 6; iterations 6..10 were never trained"
    )


def test_a_missing_iteration_in_the_middle_fails(ref: Doctor) -> None:
    ref.delete(CYCLE1, "rank 0 iteration 12/20 ")
    assert _sequence_failure(ref).endswith(
        "cycle 1 rank 0 printed iteration 13 after 11: the next line is 12 (a line at every"
        " iteration); iterations 12..12 are missing"
    )


def test_a_missing_replayed_iteration_fails(ref: Doctor) -> None:
    ref.delete(CYCLE1, "rank 0 iteration 7/20 ")
    assert "printed iteration 8 after 6" in _sequence_failure(ref)


def test_an_iteration_printed_twice_with_two_losses_fails(ref: Doctor) -> None:
    line = ref.lines(CYCLE1)[ref.line_no(CYCLE1, "rank 0 iteration 13/20 ") - 1]
    twice = line.replace("loss 4.987517356872559", "loss 4.987517356872550")
    ref.insert_after(CYCLE1, "rank 0 iteration 13/20 ", twice)
    reason = _sequence_failure(ref)
    assert reason.endswith(
        "cycle 1 rank 0 printed iteration 13 twice with different values (loss"
        " 4.987517356872559 vs 4.987517356872550): two trainings of one iteration"
    )


def test_iterations_printed_again_after_later_ones_fail(ref: Doctor) -> None:
    """A rewind: 11..13 printed again after 15."""
    again = [
        ref.lines(CYCLE1)[ref.line_no(CYCLE1, f"rank 0 iteration {it}/20 ") - 1]
        for it in (11, 12, 13)
    ]
    ref.insert_after(CYCLE1, "rank 0 iteration 15/20 ", *again)
    assert "cycle 1 rank 0 printed iteration 11 twice (the same values" in _sequence_failure(ref)


def test_a_fresh_start_that_does_not_begin_at_iteration_1_fails(ref: Doctor) -> None:
    ref.delete("logs/train_cycle0.log", "rank 0 iteration 1/20 ")
    assert "cycle 0 rank 0 resumed at iteration 2 after a fresh start" in _sequence_failure(ref)


def test_megatron_log_interval_and_iterations_to_skip_are_honoured(g2: Doctor) -> None:
    """What Megatron legitimately prints (evidence/sequence.py): with --log-interval 5 only
    the first iteration of a process and the multiples of 5; --iterations-to-skip leaves no
    line for the skipped ones. Either rule given, the thinned logs pass; without it they fail."""
    for rel in ("logs/train_cycle0.log", CYCLE1):
        for line in g2.lines(rel):
            if " iteration " in line and "/      30 |" in line:
                it = int(line.split(" iteration ")[1].split("/")[0])
                if it in (7, 8):
                    g2.delete(rel, f" iteration        {it}/")
    assert "iterations 7..8 are missing" in _sequence_failure(g2)
    g2.replace(
        "logs/train_cycle0.log",
        "iterations_to_skip .............................. []",
        "iterations_to_skip .............................. [7, 8]",
    )
    g2.replace(
        CYCLE1,
        "iterations_to_skip .............................. []",
        "iterations_to_skip .............................. [7, 8]",
    )
    assert judge_run_dir(g2.root).verdict("progress_past_restore").passed


# --- a replayed line without its values cannot be judged ---------------------------------------


def test_replayed_lines_stripped_of_their_values_cannot_be_judged(g2: Doctor) -> None:
    """Megatron's replayed lines 6..9 keep their iteration and lose every value: continuity
    was "not applicable" (nothing compared); now the run cannot be judged."""
    for it in range(6, 10):
        line = g2.lines(CYCLE1)[g2.line_no(CYCLE1, f"iteration        {it}/") - 1]
        head = line.split(" | consumed samples:")[0]
        g2.replace(CYCLE1, line.rstrip("\n"), head + " |")
    judgement = judge_run_dir(g2.root)
    verdict = judgement.verdict("training_continuity")
    assert verdict.cannot_judge and not verdict.passed
    assert verdict.reason.startswith(
        "cannot judge: replayed iteration 6 of cycle 1 prints no value that can be compared"
    )
    assert verdict.evidence[0].location == f"{CYCLE1}:1014"
    assert not judgement.judgeable and not judgement.passed
    assert run_outcome(judgement).summary == "CANNOT JUDGE (see errors)"
    assert verify_main([str(g2.root)], io.StringIO(), io.StringIO()) == 2


# --- what each line counts: iterations of the run, consumed samples ---------------------------


def test_a_line_whose_consumed_samples_are_not_its_iterations_fails(ref: Doctor) -> None:
    """Iteration 12 claims the samples of iteration 13 (4 per iteration in this run)."""
    ref.replace(
        CYCLE1,
        "rank 0 iteration 12/20 consumed_samples 48",
        "rank 0 iteration 12/20 consumed_samples 52",
    )
    assert _sequence_failure(ref).endswith(
        "cycle 1 rank 0 printed 52 consumed samples at iteration 12; with 4 samples an iteration"
        " (the run's first iteration line, logs/train_cycle0.log:7) it has consumed 48: the data"
        " position is not the iteration's"
    )


def test_megatron_consumed_samples_follow_the_global_batch(g2: Doctor) -> None:
    at = "iteration       20/      30 | consumed samples:           "
    g2.replace(CYCLE1, f"{at}40", f"{at}41")
    assert (
        "41 consumed samples at iteration 20; with 2 samples an iteration (global_batch_size"
        in (_sequence_failure(g2))
    )


@pytest.mark.parametrize("which", ["ref", "g2"])
def test_a_line_counting_another_number_of_iterations_fails(
    ref: Doctor, g2: Doctor, which: str
) -> None:
    if which == "ref":
        run = ref
        run.replace(CYCLE1, "rank 0 iteration 20/20 ", "rank 0 iteration 20/25 ")
        said = "cycle 1 rank 0 printed iteration 20/25, but the run trains 20 iterations (run.json)"
    else:
        run = g2
        run.replace(CYCLE1, "iteration       30/      30 |", "iteration       30/      40 |")
        said = "cycle 1 rank 1 printed iteration 30/40, but the run trains 30 iterations (run.json)"
    assert _sequence_failure(run).endswith(said)


def test_a_replacement_started_for_another_number_of_iterations_fails(g2: Doctor) -> None:
    g2.replace(
        CYCLE1,
        "train_iters ..................................... 30",
        "train_iters ..................................... 40",
    )
    assert _sequence_failure(g2) == (
        "cycle 1 was started to train 40 iterations, but the run trains 30 (run.json)"
    )


@pytest.mark.parametrize(
    ("setting", "before", "after"),
    [
        ("seed", "1234", "4321"),
        ("global_batch_size", "2", "4"),
    ],
)
def test_a_replacement_started_with_another_seed_or_batch_fails(
    g2: Doctor, setting: str, before: str, after: str
) -> None:
    """The failed cycle and its replacement must train the same thing: another seed (the
    replay of 6..9 would still agree, from the checkpoint's RNG state) or batch fails
    optimizer_state_load from the argument dumps, without a baseline."""
    line = next(
        text for text in g2.lines(CYCLE1) if text.startswith(f"0:   {setting} ") and " .." in text
    )
    g2.replace(CYCLE1, line, line.replace(f" {before}\n", f" {after}\n"))
    verdict = judge_run_dir(g2.root).verdict("optimizer_state_load")
    assert not verdict.passed
    assert verdict.reason == (
        f"{setting} changed across the replacement: {before} in cycle 0, {after} in cycle 1"
    )
