"""Criteria cross-check their evidence (issue #9 item 4): doctored runs that were judged PASS.

Each case is a doctored copy of a real run whose artifacts contradict each other or are of the
wrong kind or type. Before the cross-checks every one of them was judged PASS; now each must
fail: a failing verdict that names the contradiction, or a fatal problem ("cannot judge",
``verify`` exit 2). The real runs themselves keep their verdicts (tests/criteria/test_criteria.py,
test_gpu_recipe_runs.py, test_gpu_continuity_runs.py, test_evidence_reference.py).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_nvrx.criteria import Judgement, judge_run_dir
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import CYCLE1, LAUNCHER, MARKER, Doctor, copy_run

DATA = Path(__file__).parents[1] / "data"
# the example: a 2-rank CPU reference run, rank 1 killed after checkpoint 10
REFERENCE_KILL = DATA / "cpu" / "reference-kill"
TRACKER = "checkpoints/latest_checkpointed_iteration.txt"
RESULT = "result.json"


@pytest.fixture
def ref(tmp_path: Path) -> Doctor:
    return copy_run(REFERENCE_KILL, tmp_path / "reference-kill")


def judged(root: Path) -> Judgement:
    return judge_run_dir(root)


def verify(root: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    status = verify_main([str(root)], stdout=out, stderr=err)
    return status, out.getvalue() + err.getvalue()


def test_the_undoctored_run_passes(ref: Doctor) -> None:
    # every case below starts from this: a run judged PASS on all six criteria
    j = judged(ref.root)
    assert j.passed and j.judgeable, "\n".join(v.render() for v in j.verdicts)
    assert verify(ref.root)[0] == 0


# ---------------------------------------------------------------------------------------------
# 1. the fault time (marker) must follow the checkpoint's finalization


def test_marker_time_before_the_checkpoint_finalized_fails(ref: Doctor) -> None:
    # the save of iteration 10 was finalized at 11:52:40.187; the marker claims the kill came
    # 2.2 s earlier. Before: PASS "finalized at 11:52:40.187, before the kill at 11:52:38.000"
    ref.replace(MARKER, "2026-11-29T11:52:40.198270+00:00", "2026-11-29T11:52:38.000000+00:00")
    j = judged(ref.root)
    v = j.verdict("prior_checkpoint")
    assert not v.passed, v.render()
    assert "finalized at 11:52:40.187" in v.reason
    assert "after the kill (SIGKILL) of rank 1 at 11:52:38.000" in v.reason
    assert "before the kill" not in v.reason
    locations = [ref.location for ref in v.evidence]
    assert f"{MARKER}:{ref.line_no(MARKER, '"time"')}" in locations
    assert "logs/train_cycle0.log:" in " ".join(locations)  # the 'save completed' line
    assert not j.passed


# ---------------------------------------------------------------------------------------------
# 2. the failed rank must be the marker's rank


def test_marker_rank_other_than_the_rank_the_launcher_saw_die_fails(ref: Doctor) -> None:
    # rank 0 in the marker (its local_rank still 1), the launcher recorded local rank 1 dying
    ref.replace(MARKER, '"rank": 1,', '"rank": 0,')
    j = judged(ref.root)
    v = j.verdict("replaced_cycle")
    assert not v.passed, v.render()
    assert "rank 0" in v.reason and "local_rank 1" in v.reason
    locations = [ref.location for ref in v.evidence]
    assert f"{MARKER}:{ref.line_no(MARKER, '"rank": 0')}" in locations
    assert f"{LAUNCHER}:{ref.line_no(LAUNCHER, 'local_rank: 1 (pid: 14181)')}" in locations
    assert not j.passed


# ---------------------------------------------------------------------------------------------
# 3. the tracker never goes backwards


def test_final_tracker_below_the_restored_iteration_fails(ref: Doctor) -> None:
    ref.path(TRACKER).write_text("5\n")
    j = judged(ref.root)
    v = j.verdict("progress_past_restore")
    assert not v.passed, v.render()
    assert "went backwards" in v.reason and "5" in v.reason and "iteration 10" in v.reason
    assert f"{TRACKER}:1" in [ref.location for ref in v.evidence]
    assert not j.passed


# ---------------------------------------------------------------------------------------------
# 4.-7. only regular files are evidence: "cannot judge"


def _tracker_folder(ref: Doctor) -> None:
    ref.remove(TRACKER)
    ref.path(TRACKER).mkdir()


def _tracker_fifo(ref: Doctor) -> None:
    ref.remove(TRACKER)
    os.mkfifo(ref.path(TRACKER))


def _tracker_link_to_passwd(ref: Doctor) -> None:
    ref.remove(TRACKER)
    ref.path(TRACKER).symlink_to("/etc/passwd")


def _checkpoint_dir_a_file(ref: Doctor) -> None:
    ref.remove("checkpoints")
    ref.path("checkpoints").write_text("40\n")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "doctor",
    [_tracker_folder, _tracker_fifo, _tracker_link_to_passwd, _checkpoint_dir_a_file],
    ids=["tracker-folder", "tracker-fifo", "tracker-link-to-etc-passwd", "checkpoint-dir-file"],
)
def test_special_files_where_evidence_is_expected_cannot_be_judged(
    ref: Doctor, doctor: Callable[[Doctor], None]
) -> None:
    doctor(ref)
    j = judged(ref.root)
    assert not j.judgeable and not j.passed
    fatal = [p.message for p in j.problems if p.severity == "fatal"]
    assert fatal and any("checkpoint" in m for m in fatal), fatal
    assert not any("root:" in p.message for p in j.problems)  # /etc/passwd is not echoed
    # no criterion passes on a run that cannot be judged (those that are N/A stay N/A)
    assert [v.status for v in j.verdicts] == ["FAIL"] * 6
    assert j.verdict("prior_checkpoint").reason.startswith(f"cannot judge: {fatal[0]}")
    status, text = verify(ref.root)
    assert status == 2, text
    assert "root:x:" not in text


# ---------------------------------------------------------------------------------------------
# 8. cycle logs without cycle records are flagged


def test_a_later_cycle_log_without_a_cycle_record_fails(ref: Doctor) -> None:
    # the job ran a third time, but the launcher's records stop at the replacement cycle 1
    ref.path("logs/train_cycle2.log").write_bytes(ref.path(CYCLE1).read_bytes())
    j = judged(ref.root)
    flagged = [p for p in j.problems if "logs/train_cycle2.log" in p.message]
    assert flagged and "no cycle record" in flagged[0].message, j.problems
    v = j.verdict("no_repeat_injection")
    assert not v.passed, v.render()
    assert "cycle 2" in v.reason and "replacement cycle 1" in v.reason
    assert any(ref.location.startswith("logs/train_cycle2.log:") for ref in v.evidence)
    assert not j.passed


# ---------------------------------------------------------------------------------------------
# 9. typed JSON fields: result.json's exit_code is an integer (a bool is not one)


@pytest.mark.parametrize("code", ["0", True], ids=["string-0", "bool-true"])
def test_exit_code_that_is_not_an_integer_cannot_be_judged(ref: Doctor, code: object) -> None:
    ref.set_json(RESULT, exit_code=code)
    j = judged(ref.root)
    assert not j.judgeable and not j.passed
    fatal = [p.message for p in j.problems if p.severity == "fatal"]
    assert fatal and "exit_code" in fatal[0] and "integer" in fatal[0], fatal
    status, text = verify(ref.root)
    assert status == 2 and "exit_code" in text


# ---------------------------------------------------------------------------------------------
# 10. typed JSON fields: the marker's time carries its timezone


def test_marker_time_without_a_timezone_cannot_be_judged(ref: Doctor) -> None:
    ref.replace(MARKER, "2026-11-29T11:52:40.198270+00:00", "2026-11-29T11:52:40.198270")
    j = judged(ref.root)
    assert not j.judgeable and not j.passed
    fatal = [p.message for p in j.problems if p.severity == "fatal"]
    assert fatal and "time" in fatal[0] and "timezone" in fatal[0], fatal
    assert not j.verdict("prior_checkpoint").passed
    assert verify(ref.root)[0] == 2


# ---------------------------------------------------------------------------------------------
# 11. a cycle record whose times run backwards


def test_a_cycle_record_that_ends_before_it_starts_cannot_be_judged(ref: Doctor) -> None:
    record = ref.json("cycle_infos/cycle_info..0.1")
    assert record["cycle_start_time"] == "2026-11-29T11:52:42.788942Z"
    record["cycle_end_time"] = "2026-11-29T11:52:30.000000Z"
    ref.set_json("cycle_infos/cycle_info..0.1", **record)
    j = judged(ref.root)
    assert not j.judgeable and not j.passed
    fatal = [p.message for p in j.problems if p.severity == "fatal"]
    assert fatal and "cycle 1" in fatal[0] and "ends before it starts" in fatal[0], fatal
    assert not any(v.passed for v in j.verdicts)
    assert verify(ref.root)[0] == 2


# ---------------------------------------------------------------------------------------------
# the edges of each check: what still passes, what the same check catches elsewhere


@pytest.mark.parametrize(
    ("marker_time", "passes"),
    [
        ("2026-11-29T11:52:40.186000+00:00", True),  # 1 ms before the line: the marker's resolution
        ("2026-11-29T11:52:40.185900+00:00", False),  # 1.1 ms before it
    ],
)
def test_finalization_slack_is_one_millisecond(ref: Doctor, marker_time: str, passes: bool) -> None:
    ref.replace(MARKER, "2026-11-29T11:52:40.198270+00:00", marker_time)
    assert judged(ref.root).verdict("prior_checkpoint").passed is passes


def test_marker_time_before_finalization_fails_on_a_megatron_run(tmp_path: Path) -> None:
    # the walkthrough's own GPU run: saved at 11:03:55.958385, the marker 2.2 s earlier
    kill = copy_run(DATA / "gpu" / "gpu-kill-100", tmp_path / "gpu-kill-100")
    kill.replace(MARKER, "2026-11-29T11:03:55.960+00:00", "2026-11-29T11:03:53.760+00:00")
    v = judged(kill.root).verdict("prior_checkpoint")
    assert not v.passed
    assert "finalized at 11:03:55.958, 2.198 s after the kill (SIGKILL) of rank 0" in v.reason


def test_a_marker_whose_local_rank_matches_its_rank_still_passes(ref: Doctor) -> None:
    # rank 1 of 2 per node is local rank 1: consistent, and the launcher saw local rank 1 die
    assert judged(ref.root).verdict("replaced_cycle").passed
    ref.set_json(MARKER, local_rank=None)  # the walkthrough's marker has none: rank % nproc
    assert judged(ref.root).verdict("replaced_cycle").passed


def test_a_hang_marker_whose_rank_contradicts_its_local_rank_fails(tmp_path: Path) -> None:
    hang = copy_run(DATA / "cpu" / "reference-hang", tmp_path / "reference-hang")
    assert judged(hang.root).passed
    hang.replace(MARKER, '"rank": 1,', '"rank": 0,')
    v = judged(hang.root).verdict("replaced_cycle")
    assert not v.passed
    assert "rank 0 with local_rank 1" in v.reason and "contradicts itself" in v.reason


def test_final_tracker_below_the_newest_finalized_save_fails(ref: Doctor) -> None:
    # above the restored 10, but checkpoints 20, 30 and 40 were finalized after it
    ref.path(TRACKER).write_text("20\n")
    v = judged(ref.root).verdict("progress_past_restore")
    assert not v.passed
    assert "holds 20 at the end, although checkpoint 40 was finalized at" in v.reason
    assert "iteration 10 was restored" not in v.reason


def test_an_empty_later_cycle_log_is_flagged_but_shows_no_second_run(ref: Doctor) -> None:
    ref.path("logs/train_cycle2.log").write_bytes(b"")
    j = judged(ref.root)
    assert [p.severity for p in j.problems if "train_cycle2.log" in p.message] == ["warning"]
    assert j.verdict("no_repeat_injection").passed and j.passed


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rank": True}, "no integer 'rank'"),
        ({"rank": -1}, "'rank' must be at least 0"),
        (
            {"fault": "explode"},
            "'fault' must be one of kill, hang, term, segv, exception, ckpt-worker, not the"
            " string 'explode'",
        ),
        ({"pid": "14181"}, "'pid' must be an integer, not the string '14181'"),
        ({"local_rank": 1.0}, "'local_rank' must be an integer, not the number 1.0"),
        ({"tracker_iteration": "10"}, "'tracker_iteration' must be an integer"),
        ({"signal": 9}, "'signal' must be a string, not the number 9"),
        ({"time": "2026-11-29 11:52:40"}, "'time' has no timezone"),
        ({"time": 1764417160}, "no valid 'time'"),
    ],
)
def test_marker_fields_of_the_wrong_type_make_it_unusable(
    ref: Doctor, changes: dict[str, object], message: str
) -> None:
    ref.set_json(MARKER, **changes)
    j = judged(ref.root)
    assert not j.judgeable and not j.passed
    fatal = [p.message for p in j.problems if p.severity == "fatal"]
    assert fatal and message in fatal[0], fatal


@pytest.mark.parametrize(
    ("rel", "where", "changes", "message"),
    [
        ("run.json", "config", {"train_iters": "40"}, "'train_iters' must be an integer"),
        (
            "run.json",
            "config",
            {"fault": "explode"},
            "'fault' must be one of kill, hang, term, segv, exception, ckpt-worker, none",
        ),
        ("run.json", "", {"start_time": "2026-11-29T11:52:17"}, "'start_time' has no timezone"),
        (RESULT, "", {"end_time": "2026-11-29T11:53:06"}, "'end_time' has no timezone"),
        (RESULT, "", {"exit_code": 0.0}, "'exit_code' must be an integer, not the number 0.0"),
    ],
)
def test_manifest_fields_of_the_wrong_type_cannot_be_judged(
    ref: Doctor, rel: str, where: str, changes: dict[str, object], message: str
) -> None:
    if where:
        ref.set_json(rel, **{where: {**ref.json(rel)[where], **changes}})
    else:
        ref.set_json(rel, **changes)
    j = judged(ref.root)
    assert not j.judgeable and not j.passed
    fatal = [p.message for p in j.problems if p.severity == "fatal"]
    assert fatal and message in fatal[0] and fatal[0].startswith(rel), fatal


def test_a_null_exit_code_nothing_stopped_is_a_missing_record(ref: Doctor) -> None:
    # the harness records the launcher's exit code whenever it saw the launch end; null with no
    # stop (our deadline, a stop signal) recorded beside it is a record emptied, not a pass
    ref.set_json(RESULT, exit_code=None)
    j = judged(ref.root)
    assert not j.judgeable and not j.passed
    assert any("records no exit code (null)" in p.message for p in j.problems), j.problems


def test_a_huge_bad_value_is_not_echoed(ref: Doctor) -> None:
    ref.set_json(RESULT, exit_code="9" * 100_000)
    fatal = [p.message for p in judged(ref.root).problems if p.severity == "fatal"]
    assert fatal and "the string '999" in fatal[0]
    assert len(fatal[0]) < 200 and "9" * 40 not in fatal[0]
