"""Durability order (#21 item 4): the tracker names a checkpoint only once it is finalized.

``tests/data/durability/ref-kill-save`` is a real reference kill-save run whose rank 0 logged
every tracker value it read (the injector's tracker observer, every run). Each test edits one
thing in a copy and the run must fail progress_past_restore with the reason quoted.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.evidence.durability import tracker_readings
from pytest_nvrx.evidence.injector_log import parse_injector_line
from pytest_nvrx.evidence.refs import LineCursor
from pytest_nvrx.evidence.rundir import load_run
from tests.helpers.doctor import CYCLE1, Doctor, copy_run

RUN = Path(__file__).parents[1] / "data" / "durability" / "ref-kill-save"
TRACKER = "checkpoints/latest_checkpointed_iteration.txt"
READ = "0: [pytest-nvrx injector] rank 0 pid 11706: checkpoint tracker reads {n} at {t} ({where})"


@pytest.fixture
def run(tmp_path: Path) -> Doctor:
    return copy_run(RUN, tmp_path / "ref-kill-save")


def _reason(run: Doctor) -> str:
    verdict = judge_run_dir(run.root).verdict("progress_past_restore")
    assert not verdict.passed, verdict.render()
    return verdict.reason


def test_the_real_run_passes_with_every_reading_parsed() -> None:
    assert judge_run_dir(RUN).passed
    readings = [
        (cycle, line.tracker_iteration, line.trigger)
        for cycle, line in tracker_readings(load_run(RUN))
    ]
    assert readings == [
        (0, 5, "end_section(checkpointing)"),
        (1, 5, "start"),
        (1, 10, "end_section(checkpointing)"),
        (1, 15, "end_section(checkpointing)"),
        (1, 20, "end_section(checkpointing)"),
    ]


def test_a_tracker_published_at_submit_fails(run: Doctor) -> None:
    """Read naming 10 right after 10 was submitted, a second before its finalization line."""
    at = run.insert_after(
        CYCLE1,
        "save scheduled iteration 10",
        READ.format(n=10, t="2026-12-01T21:19:04.861000+00:00", where="submit(10) returned"),
    )
    reason = _reason(run)
    assert reason == (
        "durability order broken: rank 0 read the tracker naming 10 at 21:19:04.861 (submit(10)"
        " returned) in cycle 1, but its finalization line came only at 21:19:05.981: the tracker"
        " named a checkpoint before it was durable"
    )
    verdict = judge_run_dir(run.root).verdict("progress_past_restore")
    assert [e.location for e in verdict.evidence] == [f"{CYCLE1}:{at}", f"{CYCLE1}:{at + 6}"]


def test_a_reading_of_a_checkpoint_never_finalized_fails(run: Doctor) -> None:
    run.replace(CYCLE1, "checkpoint tracker reads 20 at", "checkpoint tracker reads 25 at")
    assert "naming 25 at 21:19:07.309 (end_section(checkpointing)) in cycle 1, but no line of" in (
        _reason(run)
    )


def test_a_start_value_no_earlier_cycle_finalized_fails(run: Doctor) -> None:
    run.replace(CYCLE1, "checkpoint tracker reads 5 at", "checkpoint tracker reads 15 at")
    assert _reason(run).startswith(
        "durability order broken: at the start of cycle 1 the tracker named 15, which no earlier"
        " cycle finalized and this cycle did not load"
    )


def test_a_final_tracker_naming_a_checkpoint_that_never_existed_fails(run: Doctor) -> None:
    run.path(TRACKER).write_text("25\n")
    assert "latest_checkpointed_iteration.txt names iteration 25 at the end, but no line" in (
        _reason(run)
    )


def test_a_final_tracker_naming_a_checkpoint_not_on_disk_fails(run: Doctor) -> None:
    shutil.rmtree(run.path("checkpoints/iter_0000020"))
    assert _reason(run).endswith(
        "names iteration 20 at the end, but checkpoints/iter_0000020/ is not on disk while other"
        " checkpoints are"
    )


@pytest.mark.parametrize(
    "message",
    [
        "checkpoint tracker reads 5 at 2026-12-01T21:18:52.870831 (start)",  # no zone
        "checkpoint tracker reads 5 at 0001-13-01T00:00:00+00:00 (start)",  # impossible date
        "checkpoint tracker reads five at 2026-12-01T21:18:52+00:00 (start)",
    ],
)
def test_a_reading_without_a_usable_time_or_value_is_no_reading(message: str) -> None:
    line = f"[pytest-nvrx injector] rank 0 pid 1: {message}"
    assert parse_injector_line(line, LineCursor("x.log")) is None


def test_tracker_readings_that_go_back_fail(run: Doctor) -> None:
    run.replace(CYCLE1, "checkpoint tracker reads 20 at", "checkpoint tracker reads 10 at")
    assert _reason(run).endswith(
        "rank 0 read the tracker naming 10 at 21:19:07.309 in cycle 1, after reading 15 at"
        " 21:19:07.119: the tracker went backwards"
    )


def test_a_save_finalized_before_it_was_scheduled_fails(run: Doctor) -> None:
    done = run.delete(CYCLE1, "rank 0 save completed iteration 10")[0]
    at = run.insert_before(
        CYCLE1, "rank 0 save scheduled iteration 10", done.replace("05.981", "04.859")
    )
    assert _reason(run).endswith(
        f"cycle 1 finalized checkpoint 10 ({CYCLE1}:{at}) before it scheduled that save"
        f" ({CYCLE1}:{at + 1}): a save is finalized after its submit"
    )
