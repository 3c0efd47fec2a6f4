"""The checkpoint directory, its tracker and the save lines against each other, over every
committed real run of each kind (#36 review classes B, C, K, L, N): each doctored copy (under
tmp_path, the originals never touched) must not pass, and the real runs still judge as
committed (tests/report/test_report.py and the tests/test_*_runs.py files re-judge them all).

Where a class has a harmless twin, the test says so: a run whose checkpoint directory holds no
``iter_N/`` at all (the older committed runs trimmed to the tracker) is judged from its logs.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Callable, Iterator
from functools import cache, lru_cache
from pathlib import Path

import pytest

from pytest_nvrx.evidence.rundir import RunEvidence, load_run
from pytest_nvrx.evidence.workload import LoadCompleted, SaveCompleted, SaveScheduled
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import Doctor, copy_run
from tests.helpers.parse_once import parsing_once

DATA = Path(__file__).parents[1] / "data"
TRACKER = "checkpoints/latest_checkpointed_iteration.txt"
BUDGET = DATA / "cpu-schedules" / "ref-budget-kill-step+kill-restore+kill-restore"

Edit = Callable[[Doctor], object]


@pytest.fixture(autouse=True, scope="module")
def _parse_once() -> Iterator[None]:
    """Each copy's unchanged files are parsed once (tests/helpers/parse_once.py)."""
    with parsing_once():
        yield


def _verify(run_dir: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = verify_main([str(run_dir)], out, err)
    return code, out.getvalue() + err.getvalue()


@lru_cache(maxsize=1)
def _passing_runs() -> tuple[Path, ...]:
    """Every committed run that passes verify as committed (the others prove nothing here)."""
    runs = sorted(Path(root) for root, _dirs, files in os.walk(DATA) if "run.json" in files)
    passing = tuple(r for r in runs if _verify(r)[0] == 0)
    assert len(passing) >= 80, f"only {len(passing)} committed runs pass"
    return passing


def _still_passing(tmp_path: Path, cases: list[tuple[Path, str, Edit]]) -> list[str]:
    """The ``what`` of every doctored copy that still exits 0."""
    passed: list[str] = []
    for i, (src, what, edit) in enumerate(cases):
        doc = copy_run(src, tmp_path / f"{i}-{src.name}")
        edit(doc)
        code, _ = _verify(doc.root)
        if code == 0:
            passed.append(f"{src.relative_to(DATA)}: {what}")
        shutil.rmtree(doc.root)
    return passed


@cache
def _evidence(src: Path) -> RunEvidence:
    """A committed run's evidence (read once: the originals never change)."""
    return load_run(src)


def _write(rel: str, text: str) -> Edit:
    def edit(doc: Doctor) -> None:
        doc.path(rel).write_text(text, encoding="utf-8")

    return edit


def _remove_tracker(doc: Doctor) -> None:
    doc.remove(TRACKER)


def test_every_finished_run_without_its_tracker_is_no_pass(tmp_path: Path) -> None:
    """B: absent, empty or 'release' at the end of every passing run that finalized a save."""
    cases: list[tuple[Path, str, Edit]] = []
    for src in _passing_runs():
        run = _evidence(src)
        if not any(log.of_type(SaveCompleted) for log in run.cycle_logs):
            continue
        cases.append((src, "tracker deleted", _remove_tracker))
        cases.append((src, "tracker emptied", _write(TRACKER, "")))
        cases.append((src, "tracker says release", _write(TRACKER, "release\n")))
    assert len(cases) >= 3 * 80
    assert _still_passing(tmp_path, cases) == []


def _restore_points(run: RunEvidence) -> list[int]:
    return sorted({e.iteration for log in run.cycle_logs for e in log.of_type(LoadCompleted)} - {0})


def _on_disk(src: Path, iteration: int) -> Path:
    return src / "checkpoints" / f"iter_{iteration:07d}"


def test_every_restore_point_gone_beside_other_checkpoints_is_no_pass(tmp_path: Path) -> None:
    """C: the checkpoint a cycle loaded, its .metadata deleted, its directory emptied or
    removed, in every passing run whose checkpoint directory still holds checkpoints."""
    cases: list[tuple[Path, str, Edit]] = []
    for src in _passing_runs():
        for n in _restore_points(_evidence(src)):
            at = _on_disk(src, n)
            if not (at / ".metadata").is_file():
                continue
            rel = f"checkpoints/{at.name}"

            def drop_metadata(doc: Doctor, rel: str = rel) -> None:
                doc.remove(f"{rel}/.metadata")

            def empty(doc: Doctor, rel: str = rel) -> None:
                for f in doc.path(rel).iterdir():
                    f.unlink()

            def remove(doc: Doctor, rel: str = rel) -> None:
                doc.remove(rel)

            cases += [
                (src, f"{rel}/.metadata deleted", drop_metadata),
                (src, f"{rel}/ emptied", empty),
                (src, f"{rel}/ removed", remove),
            ]
    assert len(cases) >= 3 * 70
    assert _still_passing(tmp_path, cases) == []


def test_a_run_pruned_of_every_checkpoint_directory_is_judged_from_its_logs(
    tmp_path: Path,
) -> None:
    """C's harmless twin: with no iter_N/ left at all (how tests/data/cpu and gpu-recipe/cli-*
    were trimmed, a real run whose user removed its checkpoints) nothing on disk contradicts
    the logs: the load is judged from them, and the verdict says so."""
    for src in (
        DATA / "windows" / "cpu" / "ref-kill-save",
        DATA / "windows" / "gpu" / "g2-kill-save",
    ):
        doc = copy_run(src, tmp_path / src.name)
        for d in doc.path("checkpoints").iterdir():
            if d.is_dir():
                shutil.rmtree(d)
        code, text = _verify(doc.root)
        assert code == 0, text
        # Megatron prints no positive optimizer line: the logs alone, said; the reference
        # workload lists what each rank restored
        said = "no checkpoint directory is left on disk", "reports optimizer state restored"
        assert any(s in text for s in said), text


def test_every_checkpoint_dir_no_save_wrote_is_no_pass(tmp_path: Path) -> None:
    """K: an iter_N/ past every save (a copy of the last one as iter_<last+1000>), and one
    between two saves that no line names, in every passing run with checkpoint directories."""
    cases: list[tuple[Path, str, Edit]] = []
    for src in _passing_runs():
        dirs = sorted(p.name for p in (src / "checkpoints").glob("iter_*") if p.is_dir())
        if not dirs:
            continue
        last = dirs[-1]

        def past(doc: Doctor, last: str = last) -> None:
            shutil.copytree(
                doc.path(f"checkpoints/{last}"),
                doc.path(f"checkpoints/iter_{int(last[5:]) + 1000:07d}"),
            )

        def between(doc: Doctor, last: str = last) -> None:
            shutil.copytree(
                doc.path(f"checkpoints/{last}"),
                doc.path(f"checkpoints/iter_{int(last[5:]) - 1:07d}"),
            )

        cases.append((src, f"{last} copied as iter_<+1000>", past))
        cases.append((src, f"{last} copied as iter_<-1>", between))
    assert len(cases) >= 2 * 75
    assert _still_passing(tmp_path, cases) == []


def _stopped_schedules() -> list[Path]:
    return [
        src
        for src in _passing_runs()
        if "budget" in src.name or "no-progress" in src.name or "restarts1" in src.name
    ]


def test_every_stopped_schedule_missing_evidence_is_no_pass(tmp_path: Path) -> None:
    """L: in every committed schedule the launcher stopped, cycle 0's iteration lines deleted,
    and the tracker naming a checkpoint no line finalized (no directory)."""
    stopped = _stopped_schedules()
    assert len(stopped) >= 4, stopped
    cases: list[tuple[Path, str, Edit]] = []
    for src in stopped:
        run = _evidence(src)
        log = run.cycle_logs[0]
        lines = {e.ref.line for e in log.iterations}
        rel = f"logs/{Path(log.file).name}"

        def no_iterations(doc: Doctor, rel: str = rel, lines: set[int | None] = lines) -> None:
            kept = [t for i, t in enumerate(doc.lines(rel), 1) if i not in lines]
            assert len(kept) < len(doc.lines(rel))
            doc.write_lines(rel, kept)

        cases.append((src, "every iteration line of cycle 0 deleted", no_iterations))
        cases.append((src, "tracker names 99", _write(TRACKER, "99")))
    assert _still_passing(tmp_path, cases) == []


def test_every_scheduled_save_never_finalized_is_no_pass(tmp_path: Path) -> None:
    """N: in every passing run, the finalization line of each save a cycle scheduled, deleted
    where that cycle finalized a later save."""
    cases: list[tuple[Path, str, Edit]] = []
    for src in _passing_runs():
        run = _evidence(src)
        for log in run.cycle_logs:
            done = log.of_type(SaveCompleted)
            scheduled = {e.iteration for e in log.of_type(SaveScheduled)}
            if not done or log.saves_not_kept:
                continue
            top = max(e.iteration for e in done)
            rel = f"logs/{Path(log.file).name}"
            for n in sorted({e.iteration for e in done if e.iteration < top} & scheduled):
                lines = {e.ref.line for e in done if e.iteration == n}

                def drop(doc: Doctor, rel: str = rel, lines: set[int | None] = lines) -> None:
                    kept = [t for i, t in enumerate(doc.lines(rel), 1) if i not in lines]
                    doc.write_lines(rel, kept)

                cases.append((src, f"cycle {log.cycle}'s finalization of {n} deleted", drop))
    assert len(cases) >= 250, len(cases)
    assert _still_passing(tmp_path, cases) == []


def test_the_budget_schedule_judged_as_committed_names_no_stray_checkpoint() -> None:
    """The checks hold the real stopped schedule as committed: its iter_0000005/ is the save
    cycle 0 finalized, its tracker names it (the whole run's verdict quotes no durability
    break)."""
    code, text = _verify(BUDGET)
    assert code == 0, text
    assert "durability at the stop" not in text
