"""One H200, one rank (tests/data/gpu-one): the faulted rank 0 is also the finalizer and the
tracker writer, so what a fault the rank outlives leaves behind shows here and not on 2 ranks.

The real ``megatron-ckpt-worker-finalize`` run: the checkpoint worker was SIGKILLed with save 15
in flight (tracker 5); the write of save 10 was already done and rank 0, still alive, finalized
it 13 ms after the kill, then blocked at save 20 until its checkpointing timeout, 31 s later.
The replacement restored 10 (the newest checkpoint completed before the rank's death) and
replayed 11..20 bitwise equal. It was judged NOT QUALIFIED before #21 item 6 ("loaded iteration
10, a save only scheduled before the failure").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.criteria.outcome import run_outcome
from pytest_nvrx.evidence.durability import tracker_readings
from pytest_nvrx.evidence.rundir import load_run
from tests.helpers.doctor import CYCLE0, CYCLE1, Doctor, copy_run

DATA = Path(__file__).parents[1] / "data" / "gpu-one"
BASELINE = DATA / "baseline"
CKPT_WORKER = DATA / "ckpt-worker-finalize"
EXCEPTION = DATA / "exception-step"
RUN_DIR = "/tmp/nvrx-work/runs/megatron-ckpt-worker-finalize-20261201T211147-00457/checkpoints"


@pytest.mark.parametrize("run", [CKPT_WORKER, EXCEPTION], ids=lambda p: p.name)
def test_the_real_one_gpu_runs_qualify_against_their_baseline(run: Path) -> None:
    judgement = judge_run_dir(run, baseline=BASELINE)
    assert judgement.passed, run_outcome(judgement).summary
    assert judge_run_dir(BASELINE).passed


def test_a_checkpoint_the_rank_finalized_after_the_fault_is_the_restore_point() -> None:
    judgement = judge_run_dir(CKPT_WORKER)
    c1 = judgement.verdict("prior_checkpoint")
    assert "restore point 10, never the in-flight 15" in c1.reason
    assert (
        "checkpoint 10 was finalized at 21:12:25.384, after the ckpt-worker and before the"
        " failure was detected (rank 0, the faulted rank, ran on after its fault)"
    ) in c1.reason
    assert f"{CYCLE0}:1072" in [ref.location for ref in c1.evidence]
    c3 = judgement.verdict("optimizer_state_load")
    assert c3.reason.startswith(
        "cycle 1 loaded checkpoint iteration 10, the newest completed before the failure"
    )


@pytest.fixture
def ckpt(tmp_path: Path) -> Doctor:
    return copy_run(CKPT_WORKER, tmp_path / "ckpt-worker-finalize")


def _load(run: Doctor, iteration: int) -> None:
    for old in (f"{RUN_DIR} at iteration 10", "[ t 1/1, gtp_remat 1/1, p 1/1 ] at iteration 10"):
        run.replace(CYCLE1, old, old.replace("iteration 10", f"iteration {iteration}"))


def test_restoring_the_checkpoint_before_it_fails(ckpt: Doctor) -> None:
    _load(ckpt, 5)
    c3 = judge_run_dir(ckpt.root).verdict("optimizer_state_load")
    assert not c3.passed
    assert c3.reason.startswith(
        "cycle 1 loaded iteration 5, older than the newest checkpoint completed before the"
        " failure (10)"
    )


def test_restoring_the_save_in_flight_fails(ckpt: Doctor) -> None:
    _load(ckpt, 15)
    c3 = judge_run_dir(ckpt.root).verdict("optimizer_state_load")
    assert not c3.passed
    assert c3.reason.startswith("cycle 1 loaded iteration 15, the save in flight at the fault")


def test_a_restore_of_a_checkpoint_never_finalized_fails(ckpt: Doctor) -> None:
    """Without rank 0's finalization line of 10 the load of 10 is of a save only scheduled."""
    ckpt.delete(CYCLE0, "successfully saved checkpoint from iteration      10 ")
    c3 = judge_run_dir(ckpt.root).verdict("optimizer_state_load")
    assert not c3.passed
    assert c3.reason.startswith(
        "cycle 1 loaded iteration 10, a save only scheduled before the failure, never finalized"
    )


# --- the default Megatron matrix on one H200, with rank 0's tracker readings -----------------

MATRIX = Path(__file__).parents[1] / "data" / "gpu-one-matrix"
MATRIX_FAULTS = (
    "kill-save",
    "hang-finalize",
    "term-finalize",
    "segv-step",
    "exception-step",
    "ckpt-worker-finalize",
)


@pytest.mark.parametrize("name", MATRIX_FAULTS)
def test_the_one_gpu_default_matrix_qualifies_by_every_invariant(name: str) -> None:
    """Judged by the criteria and invariants of #21 (clocks, sequence, durability from rank
    0's tracker readings, ranks, marker agreement) the real runs pass, against their baseline."""
    run = load_run(MATRIX / name)
    readings = tracker_readings(run)
    assert len(readings) >= 20, "rank 0 read the tracker at every finalization"
    judgement = judge_run_dir(MATRIX / name, baseline=MATRIX / "baseline")
    assert judgement.passed, run_outcome(judgement).summary
    assert judgement.baseline_dir == MATRIX / "baseline"


def test_a_megatron_tracker_read_before_its_finalization_line_fails(tmp_path: Path) -> None:
    run = copy_run(MATRIX / "kill-save", tmp_path / "kill-save")
    reading = "0: [pytest-nvrx injector] rank 0 pid 2315: checkpoint tracker reads 10 at"
    run.insert_after(
        CYCLE1,
        "scheduled an async checkpoint save at iteration      10 ",
        f"{reading} 2026-12-01T22:44:03.700000+00:00 (submit(10) returned)",
    )
    verdict = judge_run_dir(run.root).verdict("progress_past_restore")
    assert not verdict.passed
    assert "naming 10 at 22:44:03.700 (submit(10) returned) in cycle 1, but its finalization" in (
        verdict.reason
    )
