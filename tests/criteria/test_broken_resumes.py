"""A broken resume, for real, that says so: ``--break-restore optimizer`` under the real
ft_launcher and injector.

One real kill run (2 ranks, 12 iterations, a save every 4) launched through the pipeline of
``python -m pytest_nvrx run --workload reference``, with ``--break-restore optimizer`` passed to
the workload the way a user passes it (after ``--``): the replacement leaves the optimizer state
out of its restore and its load line says so. The run is judged as it is: no log is edited. The
launcher recovered, ``optimizer_state_load`` fails (the load line lacks the optimizer), and the loss
of the second replayed iteration differs (the first one's loss depends only on the restored
weights), so ``training_continuity`` fails too.

The silent bugs of the same kind (the rng, data and scheduler left out, the optimizer reset after
a complete load) and the unbroken replay are the self-test's runs, judged in test_selftest.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.helpers.reference_runs import (
    RUN_TIMEOUT_S,
    SAVE_INTERVAL,
    TRAIN_ITERS,
    Resume,
    launch_reference,
    read_resume,
)

pytestmark = [pytest.mark.real_run, pytest.mark.timeout(RUN_TIMEOUT_S + 120)]


@pytest.fixture(scope="module")
def resume(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Resume]:
    work = tmp_path_factory.mktemp("broken-optimizer")
    run_dir, exit_code, wall_s = launch_reference(
        work, "broken-optimizer", ("--break-restore", "optimizer")
    )
    print(f"\noptimizer: launcher exit {exit_code} after {wall_s:.1f}s")  # -s shows it
    yield read_resume(run_dir)


def test_the_launcher_recovered(resume: Resume) -> None:
    resume.assert_launcher_recovered(TRAIN_ITERS)


def test_the_failed_cycle_ran_past_the_restored_checkpoint(resume: Resume) -> None:
    """At least two replayed iterations: the first replayed loss depends only on the restored
    weights, so a reset optimizer shows from the second on. The tracker moves to N only when
    the save of N is finalized, at iteration N + save interval: by construction the failed
    cycle printed a whole interval past whatever the replacement restores."""
    assert resume.restored >= SAVE_INTERVAL
    assert resume.replayed == list(range(resume.restored + 1, max(resume.cycles[0]) + 1))
    assert len(resume.replayed) >= 2, (resume.restored, sorted(resume.cycles[0]))


def test_optimizer_state_load(resume: Resume) -> None:
    verdict = resume.judgement.verdict("optimizer_state_load")
    assert verdict.status == "FAIL", verdict.render()
    assert f"restored iteration {resume.restored} without optimizer state" in verdict.reason


def test_the_load_lines_say_what_was_restored(resume: Resume) -> None:
    """Every rank lists what it restored; the deliberately skipped part is named once per rank,
    and only in the replacement (cycle 0 got the same flag)."""
    ranks = [re.search(r" rank (\d+) load checkpoint ", e.ref.text) for e in resume.loads]
    assert sorted(m[1] for m in ranks if m is not None) == ["0", "1"]
    assert {e.parts for e in resume.loads} == {("model", "scheduler", "rng", "data")}
    logs = resume.run_dir / "logs"
    cycle0 = (logs / "train_cycle0.log").read_text()
    cycle1 = (logs / "train_cycle1.log").read_text()
    assert "restore skipped" not in cycle0
    assert "started pid" in cycle1 and " restart_count 1" in cycle1
    skipped = [line for line in cycle1.splitlines() if "restore skipped" in line]
    assert len(skipped) == 2, skipped
    assert all(
        f"restore skipped optimizer of iteration {resume.restored} on purpose"
        " (--break-restore, restart_count 1)" in line
        for line in skipped
    )


def test_the_replayed_iterations_show_the_break(resume: Resume) -> None:
    first = resume.first_difference()
    assert first is not None, f"replay {resume.replayed} printed identically"
    iteration, name, before, after = first
    assert (iteration, name) == (resume.restored + 2, "loss"), first
    print(f"\noptimizer: iteration {iteration} {name} {before} -> {after}")


def test_training_continuity_verdict(resume: Resume) -> None:
    """Issue #8's criterion: it fails the broken replay on the line of the first replayed
    iteration that printed something else."""
    verdict = resume.judgement.verdict("training_continuity")
    first = resume.first_difference()
    assert verdict.status == "FAIL", verdict.render()
    assert first is not None
    quoted = verdict.evidence[0]
    assert quoted.file == "logs/train_cycle1.log", verdict.render()
    assert f" iteration {first[0]}/{TRAIN_ITERS} " in quoted.text, verdict.render()
