"""All the evidence must agree (issue #21): doctored copies of real passing runs, each with one
thing edited that a first-match judgement would have passed.

The runs: ``ref-kill-save`` (the CPU reference workload, 2 ranks, each printing its own lines)
and ``g2-kill-30`` (Megatron on 2 x H200, rank 0 printing the load lines).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from tests.doctor import CYCLE1, Doctor, copy_run

DATA = Path(__file__).parent / "data"
REF_KILL = DATA / "windows" / "cpu" / "ref-kill-save"
G2_KILL = DATA / "gpu-continuity" / "g2-kill-30"


@pytest.fixture
def ref(tmp_path: Path) -> Doctor:
    return copy_run(REF_KILL, tmp_path / "ref-kill-save")


@pytest.fixture
def g2(tmp_path: Path) -> Doctor:
    return copy_run(G2_KILL, tmp_path / "g2-kill-30")


def test_the_unchanged_runs_pass(ref: Doctor, g2: Doctor) -> None:
    for run in (ref, g2):
        judgement = judge_run_dir(run.root)
        assert judgement.passed, judgement.summary()


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
