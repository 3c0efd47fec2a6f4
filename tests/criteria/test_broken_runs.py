"""A broken save for real (#21 item 5): ``--break-save tracker-at-submit`` under the real
ft_launcher and injector, with a kill in the ``finalize`` window, judged as it is (no log is
edited). The tracker names every save when it is submitted, the window never opens, the injector
exits 3: the first cause is that the requested fault never happened because the tracker advanced
at submit, never "the workers failed".

The other broken runs of #21 (a jumped iteration counter, one rank restoring the previous
checkpoint, a tracker written at submit with a ``step``-window kill) are the self-test's planted
runs, judged in test_selftest.py; the self-test never runs the ``finalize`` window.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_nvrx.criteria import Judgement, judge_run_dir
from pytest_nvrx.criteria.first_cause import BEFORE_FAULT, NEVER_HAPPENED, WITHOUT_FAULT
from pytest_nvrx.criteria.outcome import run_outcome
from pytest_nvrx.evidence import load_run
from pytest_nvrx.evidence.rundir import RunEvidence
from tests.helpers.reference_runs import RUN_TIMEOUT_S, launch_reference

FAST = ("--step-time=0.05",)

pytestmark = [pytest.mark.real_run, pytest.mark.timeout(RUN_TIMEOUT_S + 120)]


@dataclass(frozen=True)
class BrokenRun:
    run_dir: Path
    exit_code: int | None
    judgement: Judgement
    run: RunEvidence

    def verdicts(self) -> str:
        cause = self.judgement.first_cause
        head = f"first cause: {cause.text}\n" if cause is not None else ""
        return head + "\n".join(v.render() for v in self.judgement.verdicts)


@pytest.fixture(scope="module")
def at_submit_finalize(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokenRun]:
    run_id = "broken-at-submit-finalize"
    run_dir, exit_code, wall_s = launch_reference(
        tmp_path_factory.mktemp("at-submit-finalize"),
        run_id,
        (*FAST, "--break-save", "tracker-at-submit"),
        window="finalize",
        max_restarts=0,
    )
    print(f"\n{run_id}: launcher exit {exit_code} after {wall_s:.1f}s")  # -s shows it
    yield BrokenRun(run_dir, exit_code, judge_run_dir(run_dir), load_run(run_dir))


# ----------------------------------------------------------------------------------------------
# rank 0 writes the tracker at submit


def test_a_finalize_fault_that_never_lands_says_the_tracker_advanced_at_submit(
    at_submit_finalize: BrokenRun,
) -> None:
    """#21 item 5 on the real case: the injector exits 3; the first cause says the fault never
    happened, in which window and why, quoting the injector's line and rank 0's save lines."""
    run = at_submit_finalize
    assert run.exit_code != 0
    assert run.run.marker is None
    cause = run.judgement.first_cause
    assert cause is not None, run.verdicts()
    assert cause.never
    assert cause.text.startswith(
        f"{NEVER_HAPPENED}: kill on rank 1 in window finalize never fired in cycle 0 (the"
        " injector exited 3): the window never opened because the tracker advanced at submit:"
        " it already named each save in flight when its finalization began (4, 8"
    ), cause.text
    assert "the save of 4 was scheduled at " in cause.text
    assert "injector" in cause.ref.text and "never happened" in cause.ref.text
    quoted = [ref.text for ref in cause.evidence]
    assert any("save scheduled iteration 4 " in t for t in quoted), quoted
    assert any(t.endswith("save completed iteration 4") for t in quoted), quoted
    assert any("failed (exitcode: 3)" in t for t in quoted), quoted
    for verdict in run.judgement.verdicts:
        assert BEFORE_FAULT not in verdict.reason and not verdict.reason.startswith(
            WITHOUT_FAULT
        ), verdict.render()
        if not verdict.passed:
            assert verdict.reason.startswith(cause.text + "; "), verdict.render()
    assert run_outcome(run.judgement).summary.startswith(f"FAILED: {NEVER_HAPPENED}: ")


# ----------------------------------------------------------------------------------------------
# a checkpoint dir that held a finished run's checkpoints (issue #36 item 16)


@pytest.fixture(scope="module")
def resumed_finished_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokenRun]:
    """Run A trains 8 iterations (saves 4 and 8) and ends; run B, asked for 12 with a kill in a
    step, starts on A's checkpoints: it resumes 8 and trains 9..12, and the fault never fires.
    The harness now refuses such a checkpoint dir (run_dir.py); here B's is filled after its
    checks (``seed``), as a reused ``--checkpoint-dir`` was before."""
    finished, code, _ = launch_reference(
        tmp_path_factory.mktemp("finished"), "finished", FAST, fault="none", train_iters=8
    )
    assert code == 0

    def seed(checkpoint_dir: Path) -> None:
        for entry in (finished / "checkpoints").iterdir():
            if entry.is_dir():
                shutil.copytree(entry, checkpoint_dir / entry.name)
            elif entry.name == "latest_checkpointed_iteration.txt":
                shutil.copy(entry, checkpoint_dir / entry.name)

    run_id = "resumed-finished"
    run_dir, exit_code, wall_s = launch_reference(
        tmp_path_factory.mktemp("resumed"), run_id, FAST, seed=seed, train_iters=12, window="step"
    )
    print(f"\n{run_id}: launcher exit {exit_code} after {wall_s:.1f}s")  # -s shows it
    yield BrokenRun(run_dir, exit_code, judge_run_dir(run_dir), load_run(run_dir))


def test_a_resumed_cycle_that_trained_is_never_said_to_have_trained_nothing(
    resumed_finished_run: BrokenRun,
) -> None:
    """Before, the first cause said "the cycle resumed checkpoint 8 and trained no iteration"
    of a cycle that trained 9..12 (it looked for iterations among the log's events, where no
    iteration line is kept); now it says what the lines show."""
    run = resumed_finished_run
    log = run.run.cycle_log(0)
    assert log is not None
    assert [e.iteration for e in log.iterations if e.ref.text.startswith("0: ")] == [9, 10, 11, 12]
    cause = run.judgement.first_cause
    assert cause is not None and cause.never, run.verdicts()
    assert "trained no iteration" not in cause.text, cause.text
    assert "baseline 8" in cause.text, cause.text
    assert not run.judgement.passed
