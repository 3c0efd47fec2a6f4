"""Broken runs for real (#21 items 10 and 5): the reference workload's restore and save knobs
under the real ft_launcher and injector, each judged as it is (no log is edited).

* ``--break-restore iteration``: the replacement restores 4 but its counter says 8, so it
  trains 9..12 and iterations 5..8 are never trained: the iteration sequence breaks
  (``progress_past_restore``: the first iteration after a restore is restored + 1);
* ``--break-restore previous``: cycle 0 resumes checkpoint 4 (copied from the run above), so
  the fault comes after checkpoint 8 completed; the replacement's rank 0 restores 8, its rank 1
  the previous checkpoint 4: ``optimizer_state_load`` fails quoting both load lines;
* ``--break-save tracker-at-submit`` with a ``finalize``-window kill: the tracker names every save
  when it is submitted, the window never opens, the injector exits 3: the first cause is that
  the requested fault never happened because the tracker advanced at submit, never "the workers
  failed";
* ``--break-save tracker-at-submit`` with a ``step``-window kill: the fault lands after the
  tracker named 4, whose save was never finalized: the tracker named a checkpoint before its
  finalization line.

One run per scenario, shared by its tests (module-scoped fixtures), one after the other; runs are
kept short (12 or 16 iterations, a save every 4, 0.05 s steps).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_nvrx.criteria import Judgement, judge_run_dir
from pytest_nvrx.criteria.first_cause import BEFORE_FAULT, NEVER_HAPPENED, WITHOUT_FAULT
from pytest_nvrx.evidence import load_run
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.workload import LoadCompleted
from pytest_nvrx.layout import TRACKER_NAME
from tests.test_broken_resumes import RUN_TIMEOUT_S, SAVE_INTERVAL, TRAIN_ITERS, launch_reference

FAST = ("--step-time=0.05",)

pytestmark = pytest.mark.timeout(RUN_TIMEOUT_S + 120)


@dataclass(frozen=True)
class BrokenRun:
    run_dir: Path
    exit_code: int | None
    wall_s: float
    judgement: Judgement
    run: RunEvidence

    def verdicts(self) -> str:
        cause = self.judgement.first_cause
        head = f"first cause: {cause.text}\n" if cause is not None else ""
        return head + "\n".join(v.render() for v in self.judgement.verdicts)

    def loads(self, cycle: int) -> tuple[LoadCompleted, ...]:
        log = self.run.cycle_log(cycle)
        assert log is not None, f"{self.run_dir}: no log of cycle {cycle}"
        return log.of_type(LoadCompleted)


def _run(
    work: Path,
    run_id: str,
    extra: tuple[str, ...],
    *,
    seed: Callable[[Path], None] | None = None,
    **overrides: object,
) -> BrokenRun:
    run_dir, exit_code, wall_s = launch_reference(
        work, run_id, (*FAST, *extra), seed=seed, **overrides
    )
    print(f"\n{run_id}: launcher exit {exit_code} after {wall_s:.1f}s")  # -s shows it
    return BrokenRun(run_dir, exit_code, wall_s, judge_run_dir(run_dir), load_run(run_dir))


@pytest.fixture(scope="module")
def jump(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokenRun]:
    yield _run(
        tmp_path_factory.mktemp("jump"), "broken-iteration", ("--break-restore", "iteration")
    )


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory, jump: BrokenRun) -> Iterator[BrokenRun]:
    """Cycle 0 resumes checkpoint 4 of the run above (cycle 0 of that run is unbroken; the
    configuration that must match, world size, seed, model, data, is the same), so two
    checkpoints are complete when the fault comes: the first restore of a run always restores
    its first checkpoint, which has no previous one."""
    donor = jump.run_dir / "checkpoints" / "iter_0000004"

    def seed(checkpoints: Path) -> None:
        shutil.copytree(donor, checkpoints / donor.name)
        (checkpoints / TRACKER_NAME).write_text("4")

    yield _run(
        tmp_path_factory.mktemp("previous"),
        "broken-previous",
        ("--break-restore", "previous"),
        seed=seed,
        train_iters=16,
    )


@pytest.fixture(scope="module")
def at_submit_finalize(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokenRun]:
    yield _run(
        tmp_path_factory.mktemp("at-submit-finalize"),
        "broken-at-submit-finalize",
        ("--break-save", "tracker-at-submit"),
        window="finalize",
        max_restarts=0,
    )


@pytest.fixture(scope="module")
def at_submit_step(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokenRun]:
    yield _run(
        tmp_path_factory.mktemp("at-submit-step"),
        "broken-at-submit-step",
        ("--break-save", "tracker-at-submit"),
        window="step",
    )


# ----------------------------------------------------------------------------------------------
# (b) the restored iteration counter jumps


def test_a_jumped_iteration_counter_breaks_the_sequence(jump: BrokenRun) -> None:
    assert jump.exit_code == 0, jump.verdicts()  # the launcher recovered: the break is silent
    loads = jump.loads(1)
    assert {e.iteration for e in loads} == {SAVE_INTERVAL}, loads
    replacement = jump.run.cycle_log(1)
    assert replacement is not None
    first = replacement.iterations[0]
    assert first.iteration == 2 * SAVE_INTERVAL + 1  # restored 4, resumed at 9: 5..8 untrained
    assert max(e.iteration for e in replacement.iterations) == TRAIN_ITERS
    verdict = jump.judgement.verdict("progress_past_restore")
    assert verdict.status == "FAIL", jump.verdicts()
    assert verdict.reason.startswith("the iteration sequence is broken: "), verdict.render()
    assert first.ref in verdict.evidence, verdict.render()
    assert loads[0].ref in verdict.evidence or loads[-1].ref in verdict.evidence
    assert jump.judgement.first_cause is None  # a fault run whose fault landed
    assert not jump.judgement.passed


# ----------------------------------------------------------------------------------------------
# (a) one rank restores the previous checkpoint


def test_ranks_restoring_different_checkpoints_fail_optimizer_state_load(
    previous: BrokenRun,
) -> None:
    assert previous.exit_code == 0, previous.verdicts()
    cycle0 = previous.loads(0)
    assert {e.iteration for e in cycle0} == {4}, cycle0  # resumed the seeded checkpoint
    loads = previous.loads(1)
    by_rank = {e.ref.text.split(" rank ")[1].split()[0]: e for e in loads}
    assert {r: e.iteration for r, e in by_rank.items()} == {"0": 8, "1": 4}, loads
    verdict = previous.judgement.verdict("optimizer_state_load")
    assert verdict.status == "FAIL", previous.verdicts()
    assert verdict.reason.startswith(
        "the ranks of cycle 1 restored different checkpoints (rank 1 iteration 4, rank 0"
        " iteration 8)"
    ), verdict.render()
    assert by_rank["0"].ref in verdict.evidence and by_rank["1"].ref in verdict.evidence
    assert previous.judgement.verdict("prior_checkpoint").passed, previous.verdicts()
    assert previous.judgement.first_cause is None


# ----------------------------------------------------------------------------------------------
# (c) rank 0 writes the tracker at submit


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
    assert run.judgement.summary().startswith(f"FAILED: {NEVER_HAPPENED}: ")


def test_a_step_fault_after_a_tracker_written_at_submit_lands_before_finalization(
    at_submit_step: BrokenRun,
) -> None:
    """The fault lands (the tracker moved), but the checkpoint the tracker named was never
    finalized before it: prior_checkpoint fails on the scheduled-only save."""
    run = at_submit_step
    marker = run.run.marker
    assert marker is not None and marker.ok
    assert marker.tracker_iteration == SAVE_INTERVAL
    verdict = run.judgement.verdict("prior_checkpoint")
    assert verdict.status == "FAIL", run.verdicts()
    assert f"{SAVE_INTERVAL}" in verdict.reason
    assert any(
        f"save scheduled iteration {SAVE_INTERVAL} " in ref.text for ref in verdict.evidence
    ), verdict.render()
    assert not run.judgement.passed


def test_the_tracker_named_a_checkpoint_before_its_finalization_line(
    at_submit_step: BrokenRun,
) -> None:
    """Item 4's check, on the real run: a failing verdict says the durability order is broken,
    the tracker naming checkpoint 4 before any line finalized it, quoting the tracker reading."""
    run = at_submit_step
    said = [
        v
        for v in run.judgement.verdicts
        if not v.passed
        and "durability order broken" in v.reason
        and f"naming {SAVE_INTERVAL} " in v.reason
        and any("tracker" in ref.text for ref in v.evidence)
    ]
    assert said, run.verdicts()
