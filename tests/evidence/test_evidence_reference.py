"""The CPU reference workload's log adapter, and the five criteria on its recorded real runs.

The runs in tests/data/cpu were made by the real ft_launcher (see the README there). Each doctored
copy of reference-kill fails one criterion, and the test asserts which quoted line made it fail.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import warnings
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from pytest_nvrx.criteria import CRITERIA_IDS, Verdict, judge_run_dir
from pytest_nvrx.evidence import get_adapter, load_run
from pytest_nvrx.evidence.checkpoint import OptimizerState
from pytest_nvrx.evidence.cycle_log import parse_cycle_log
from pytest_nvrx.evidence.reference import REFERENCE
from pytest_nvrx.evidence.refs import LineCursor, iter_lines, split_rank_prefix
from pytest_nvrx.evidence.workload import (
    FtTimeoutsReported,
    IterationCommitted,
    LoadCompleted,
    LoadFailed,
    Milestone,
    MilestoneLookalike,
    ProcessExited,
    ProcessStarted,
    SaveCompleted,
    SaveScheduled,
    StartedFromScratch,
    WorkloadError,
)
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import Doctor, copy_run, glog_failed
from tests.helpers.sessions import ONE_RANK_STORE_PORT

REPO = Path(__file__).resolve().parents[2]
CPU_DATA = Path(__file__).parents[1] / "data" / "cpu"
KILL = CPU_DATA / "reference-kill"
HANG = CPU_DATA / "reference-hang"
BASELINE = CPU_DATA / "reference-baseline"
LAUNCHER = "logs/launcher.log"
CYCLE0 = "logs/train_cycle0.log"
CYCLE1 = "logs/train_cycle1.log"
MARKER = "fault_injected.json"
# what the recorded runs print, for doctored lines
CKPT = "/shared/nvrx-ref/runs/reference-kill/checkpoints"
PARTS = "(model, optimizer, scheduler, rng, data)"


def ref_line(time: str, rank: int, event: str) -> str:
    """A reference-workload line as it appears in a per-cycle log (rank prefix included)."""
    return f"{rank}: [ref] 2026-11-29T{time}+00:00 rank {rank} {event}"


def parse(body: str, tz: timezone | None = None) -> object:
    cursor = LineCursor(CYCLE1, tz if tz is not None else UTC)
    cursor.lineno, cursor.raw = 9, "0: " + body
    return REFERENCE.parse_line(body, cursor)


def locations(verdict: Verdict) -> list[str]:
    return [ref.location for ref in verdict.evidence]


def failing(root: Path, criterion: str, expect: str | None = None) -> Verdict:
    judgement = judge_run_dir(root, expect_fault=expect)
    assert judgement.judgeable, judgement.problems
    verdict = judgement.verdict(criterion)
    assert verdict.status == "FAIL", verdict.render()
    return verdict


def others_pass(root: Path, criterion: str) -> None:
    """The doctoring broke only what it meant to (where the criteria are independent)."""
    j = judge_run_dir(root)
    assert [v.id for v in j.verdicts if not v.passed] == [criterion], "\n".join(
        v.render() for v in j.verdicts
    )


@pytest.fixture
def kill(tmp_path: Path) -> Doctor:
    return copy_run(KILL, tmp_path / "reference-kill")


# ---------------------------------------------------------------------------------------------
# the adapter, line by line


def test_iteration_line() -> None:
    event = parse(
        "[ref] 2026-11-29T11:52:53.145+00:00 rank 0 iteration 11/40 consumed_samples 44"
        " loss 4.7973 lr 9.051e-03"
    )
    assert isinstance(event, IterationCommitted)
    assert (event.iteration, event.total, event.consumed_samples, event.loss) == (
        11,
        40,
        44,
        4.7973,
    )
    assert event.time == datetime(2026, 11, 29, 11, 52, 53, 145000, tzinfo=UTC)
    assert event.ref.location == f"{CYCLE1}:9"
    # the recorded runs' format (4 decimals): its values as printed
    assert event.values == (
        ("consumed_samples", "44"),
        ("loss", "4.7973"),
        ("learning_rate", "9.051e-03"),
    )
    assert event.value("grad_norm") is None


def test_iteration_line_with_exact_values() -> None:
    """The current format: floats as repr, the texts kept as printed for exact comparison."""
    event = parse(
        "[ref] 2026-11-30T13:44:22.532+00:00 rank 0 iteration 8/12 consumed_samples 32"
        " loss 4.941676139831543 lr 0.0055000000000000005 grad_norm 0.5339168906211853"
    )
    assert isinstance(event, IterationCommitted)
    assert (event.iteration, event.total, event.consumed_samples) == (8, 12, 32)
    assert event.loss == 4.941676139831543
    assert event.values == (
        ("consumed_samples", "32"),
        ("loss", "4.941676139831543"),
        ("learning_rate", "0.0055000000000000005"),
        ("grad_norm", "0.5339168906211853"),
    )
    assert event.value("learning_rate") == "0.0055000000000000005"  # not 0.0055


@pytest.mark.parametrize(
    ("event", "kind", "iteration"),
    [
        (f"save scheduled iteration 20 path {CKPT}/iter_0000020", SaveScheduled, 20),
        ("save completed iteration 10", SaveCompleted, 10),
        (
            f"load checkpoint iteration 10 {PARTS} consumed_samples 40 path {CKPT}/iter_0000010",
            LoadCompleted,
            10,
        ),
    ],
)
def test_checkpoint_lines(event: str, kind: type, iteration: int) -> None:
    parsed = parse(f"[ref] 2026-11-29T11:52:40.187+00:00 rank 0 {event}")
    assert isinstance(parsed, kind)
    assert parsed.iteration == iteration  # type: ignore[attr-defined]


def test_load_line_carries_the_restored_parts() -> None:
    parsed = parse(
        f"[ref] 2026-11-29T11:52:52.916+00:00 rank 1 load checkpoint iteration 10 {PARTS}"
        f" consumed_samples 40 path {CKPT}/iter_0000010"
    )
    assert isinstance(parsed, LoadCompleted)
    assert parsed.parts == ("model", "optimizer", "scheduler", "rng", "data")
    broken = parse(  # --break-restore optimizer in a replacement
        "[ref] 2026-11-30T13:44:21.681+00:00 rank 1 load checkpoint iteration 4 (model,"
        f" scheduler, rng, data) consumed_samples 16 path {CKPT}/iter_0000004"
    )
    assert isinstance(broken, LoadCompleted)
    assert broken.parts == ("model", "scheduler", "rng", "data")


@pytest.mark.parametrize(
    ("event", "kind"),
    [
        (
            f"no checkpoint found at {CKPT}/latest_checkpointed_iteration.txt, starting from"
            " scratch",
            StartedFromScratch,
        ),
        (
            f"load failed: tracker names iteration 10 but {CKPT}/iter_0000010/.metadata is missing",
            LoadFailed,
        ),
        ("training finished iteration 40", Milestone),
        ("aborted RuntimeError: Connection closed by peer [127.0.0.1]:41234", WorkloadError),
        ("save failed iteration 20: OSError: [Errno 28] No space left on device", WorkloadError),
        ("ft monitoring failed: cannot connect", WorkloadError),
        ("exit code 1", WorkloadError),
    ],
)
def test_other_events(event: str, kind: type) -> None:
    assert isinstance(parse(f"[ref] 2026-11-29T11:52:59.613+00:00 rank 0 {event}"), kind)


def test_training_finished_is_the_whole_event_naming_its_iteration() -> None:
    done = parse("[ref] 2026-11-29T11:52:59.613+00:00 rank 0 training finished iteration 40")
    assert isinstance(done, Milestone)
    assert (done.name, done.iteration) == ("training_done", 40)


@pytest.mark.parametrize(
    "event",
    [
        "training finished iteration 40 (not really)",
        "training finished iteration x",
        "training finished iteration ",
        "training finished",
        "training finished at iteration 40",
    ],
)
def test_a_line_almost_training_finished_is_no_milestone(event: str) -> None:
    almost = parse(f"[ref] 2026-11-29T11:52:59.613+00:00 rank 0 {event}")
    assert isinstance(almost, MilestoneLookalike)
    assert almost.name == "training_done"
    assert "'training finished iteration N'" in almost.why


def test_exit_code_0_is_a_clean_exit_and_any_other_an_error() -> None:
    """Every rank prints ``exit code C`` last: 0 closes a clean run (required of every rank of
    the last cycle of a run that exited 0), anything else is the workload's error."""
    clean = parse("[ref] 2026-11-29T11:52:59.645+00:00 rank 0 exit code 0")
    assert isinstance(clean, ProcessExited)
    assert isinstance(
        parse("[ref] 2026-11-29T11:52:59.645+00:00 rank 1 exit code 1"), WorkloadError
    )
    assert parse("[ref] 2026-11-29T11:52:59.645+00:00 rank 0 exit code 0 (not really)") is None


@pytest.mark.parametrize(
    "body",
    [
        # workload lines that are no evidence
        # the load line already leaves the part out (LoadCompleted.parts)
        "[ref] 2026-11-30T13:44:21.681+00:00 rank 1 restore skipped optimizer of iteration 4"
        " on purpose (--break-restore, restart_count 1)",
        "[ref] 2026-11-29T11:52:50.555+00:00 rank 0 ft monitoring disabled (--no-ft)",
        # our injector's lines: verdicts must never rest on them
        "[pytest-nvrx injector] rank 1 pid 14181: watching /c/latest_checkpointed_iteration.txt"
        " (baseline 0) to inject kill (SIGKILL) once it advances",
        "[pytest-nvrx injector] rank 1 pid 14181: tracker /c/latest_checkpointed_iteration.txt"
        " advanced 0 -> 10; marker /r/fault_injected.json written; sending SIGKILL to pid 14181",
        # lines that only look like ours, and torch's warnings
        "iteration 11/40 consumed_samples 44 loss 4.7973 lr 9.051e-03",
        "[ref] yesterday rank 0 save completed iteration 10",
        "/venv/lib/python3.12/site-packages/torch/distributed/checkpoint/state_dict.py:1: Future"
        "Warning: save completed iteration 10",
        "",
    ],
)
def test_lines_that_are_not_evidence(body: str) -> None:
    assert parse(body) is None
    assert REFERENCE.iteration_of(body) is None


@pytest.mark.parametrize(
    ("body", "sections", "out_of_section"),
    [
        (
            "checkpointing:60.0,setup:120.0,step:10.0 out_of_section 60.0",
            (("checkpointing", 60.0), ("setup", 120.0), ("step", 10.0)),
            60.0,
        ),
        ("- out_of_section 600.0", (), 600.0),
    ],
)
def test_the_ft_monitor_line_says_its_deadlines(
    body: str, sections: tuple[tuple[str, float], ...], out_of_section: float
) -> None:
    # run.json's section_timeouts and the other cycles' are checked against it
    event = parse(
        f"[ref] 2026-11-29T11:52:50.555+00:00 rank 0 ft monitoring initialized sections {body}"
    )
    assert isinstance(event, FtTimeoutsReported) and not event.calculated
    assert (event.sections, event.out_of_section) == (sections, out_of_section)


@pytest.mark.parametrize(
    "body",
    [
        "step:\u0661\u0660.0 out_of_section 60.0",  # Arabic-Indic digits: no number a run prints
        "step:10.0 out_of_section inf",
        "step 10.0 out_of_section 60.0",
    ],
)
def test_an_ft_monitor_line_of_no_deadline_is_no_evidence(body: str) -> None:
    assert (
        parse(
            f"[ref] 2026-11-29T11:52:50.555+00:00 rank 0 ft monitoring initialized sections {body}"
        )
        is None
    )


@pytest.mark.parametrize(
    ("body", "world", "restarts"),
    [
        ("started pid 14331 world_size 2", 2, None),
        ("started pid 6425 world_size 2 restart_count 1", 2, 1),
        ("started pid 6425 world_size 4 restart_count 3 cpus 2", 4, 3),
    ],
)
def test_a_start_line_says_its_world_and_restart_count(
    body: str, world: int, restarts: int | None
) -> None:
    # run.json's world size and the cycle of the log are checked against it
    event = parse(f"[ref] 2026-11-30T13:44:16.013+00:00 rank 1 {body}")
    assert isinstance(event, ProcessStarted)
    assert (event.world_size, event.restart_count) == (world, restarts)


def test_tracebacks_are_errors() -> None:
    assert isinstance(parse("[rank0]: Traceback (most recent call last):"), WorkloadError)
    assert isinstance(parse("Traceback (most recent call last):"), WorkloadError)


def test_timestamps_are_utc_as_written_whatever_the_host_zone() -> None:
    # Megatron's naive stamps take the launcher host's zone; these carry their own offset.
    body = "[ref] 2026-11-29T11:52:40.187+00:00 rank 0 save completed iteration 10"
    east = parse(body, timezone(timedelta(hours=2)))
    assert isinstance(east, SaveCompleted)
    assert east.time == datetime(2026, 11, 29, 11, 52, 40, 187000, tzinfo=UTC)
    other = parse(body.replace("11:52:40.187+00:00", "12:52:40.187+01:00"))
    assert isinstance(other, SaveCompleted) and other.time == east.time


def test_real_cycle_log_times_ignore_the_zone_passed_in() -> None:
    west = timezone(timedelta(hours=-5))
    c1 = parse_cycle_log(KILL / CYCLE1, 1, REFERENCE, file=CYCLE1, tz=west)
    assert c1.first_iteration is not None
    assert c1.first_iteration.time == datetime(2026, 11, 29, 11, 52, 53, 145000, tzinfo=UTC)
    saved = c1.of_type(SaveCompleted)
    assert [e.iteration for e in saved] == [20, 30, 40]
    assert saved[0].time == datetime(2026, 11, 29, 11, 52, 57, 332000, tzinfo=UTC)


def test_real_cycle_logs() -> None:
    c0 = parse_cycle_log(KILL / CYCLE0, 0, REFERENCE, file=CYCLE0)
    assert (c0.ranks, c0.iteration_lines) == ((0, 1), 20)
    assert [e.ref.line for e in c0.of_type(StartedFromScratch)] == [5, 6]
    assert [e.iteration for e in c0.of_type(SaveScheduled)] == [10, 20]
    assert [e.iteration for e in c0.of_type(SaveCompleted)] == [10]
    assert c0.of_type(WorkloadError) == ()
    c1 = parse_cycle_log(KILL / CYCLE1, 1, REFERENCE, file=CYCLE1)
    loads = c1.of_type(LoadCompleted)
    assert [(e.iteration, e.ref.line) for e in loads] == [(10, 5), (10, 6)]
    assert c1.first_iteration is not None and c1.first_iteration.iteration == 11
    assert c1.max_iteration is not None and c1.max_iteration.iteration == 40
    assert [e.name for e in c1.of_type(Milestone)] == ["training_done"]


RECORDED_LOGS = [
    (run, rel) for run in (BASELINE, KILL, HANG) for rel in (CYCLE0, CYCLE1) if (run / rel).exists()
]


@pytest.mark.parametrize(("run", "rel"), RECORDED_LOGS, ids=lambda x: getattr(x, "name", x))
def test_iteration_fast_path_agrees_with_parse_line(run: Path, rel: str) -> None:
    cursor = LineCursor(rel)
    for lineno, text in iter_lines(run / rel):
        _, body = split_rank_prefix(text)
        cursor.lineno, cursor.raw = lineno, text
        event = REFERENCE.parse_line(body, cursor)
        number = REFERENCE.iteration_of(body)
        assert (number is not None) == isinstance(event, IterationCommitted), text
        if isinstance(event, IterationCommitted):
            assert event.iteration == number


def test_registered_under_run_json_workload_and_light() -> None:
    assert get_adapter("reference") is REFERENCE
    assert load_run(KILL).workload == "reference"
    # verify must not pay for torch when there are no checkpoint files to read
    code = (
        "import sys; from pathlib import Path; from pytest_nvrx.criteria import judge_run_dir; "
        f"j = judge_run_dir(Path({str(KILL)!r})); assert j.passed; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


# ---------------------------------------------------------------------------------------------
# the recorded real runs, through verify


def run_verify(*argv: str | Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = verify_main([str(a) for a in argv], stdout=out, stderr=err)
    return code, out.getvalue() + err.getvalue()


@pytest.mark.parametrize(
    ("run", "failure"),
    [
        pytest.param(KILL, f"{LAUNCHER}:46", id="kill"),  # failed (exitcode: -9) local_rank: 1
        pytest.param(HANG, f"{LAUNCHER}:46", id="hang"),  # rank 1: Section 'step' has been open
    ],
)
def test_real_fault_runs_pass_all_six(run: Path, failure: str) -> None:
    code, out = run_verify(run)
    assert code == 0, out
    assert out.rstrip().endswith("verify: PASSED (6 of 6)")
    j = judge_run_dir(run)
    assert [(v.id, v.status) for v in j.verdicts] == [(c, "PASS") for c in CRITERIA_IDS]
    proof = {v.id: locations(v) for v in j.verdicts}
    assert proof["prior_checkpoint"][:3] == [f"{MARKER}:22", f"{CYCLE0}:28", f"{MARKER}:20"]
    assert proof["replaced_cycle"][0] == failure
    c3 = j.verdict("optimizer_state_load")
    assert "loaded checkpoint iteration 10, the newest completed before the failure" in c3.reason
    assert "the workload reports optimizer state restored on 2 rank(s)" in c3.reason
    assert {f"{CYCLE1}:5", f"{CYCLE1}:6", f"{CYCLE0}:28"} <= set(proof["optimizer_state_load"])
    assert "checkpoints/iter_0000010" in proof["optimizer_state_load"]  # pruned: absent
    c4 = j.verdict("progress_past_restore")
    assert "committed iterations 11..40, checkpoint 20 completed" in c4.reason
    assert f"{CYCLE1}:39" in proof["progress_past_restore"]  # iteration 40/40
    # recorded before the workload printed full precision: its 4-decimal values still replay
    c6 = j.verdict("training_continuity")
    assert c6.reason.startswith("cycle 1 vs cycle 0: iterations 11..20 replayed, 10/10 equal")
    assert proof["training_continuity"][:2] == [f"{CYCLE1}:7", f"{CYCLE0}:18"]


def test_real_fault_run_timings_are_not_shifted() -> None:
    # docs/reference-workload.md: kill detected +0.15 s, first iteration after restore +12.9 s
    t = judge_run_dir(KILL).timings
    assert t["failure_to_detected_s"] == pytest.approx(0.149, abs=0.002)
    assert t["failure_to_first_iteration_after_restore_s"] == pytest.approx(12.947, abs=0.002)
    assert judge_run_dir(HANG).timings["failure_to_detected_s"] == pytest.approx(10.876, abs=0.002)


def test_real_baseline_passes_as_baseline() -> None:
    code, out = run_verify(BASELINE, "--expect-fault", "none")
    assert code == 0, out
    j = judge_run_dir(BASELINE, expect_fault="none")
    assert [v.status for v in j.verdicts] == ["N/A", "N/A", "N/A", "PASS", "PASS", "N/A"]
    # run.json says fault=none too: the same without the flag
    assert judge_run_dir(BASELINE).passed
    assert "after a fresh start (no checkpoint loaded)" in j.verdict("progress_past_restore").reason
    assert f"{CYCLE0}:4" in locations(j.verdict("optimizer_state_load"))  # starting from scratch


def test_real_baseline_judged_as_a_fault_run_fails() -> None:
    code, out = run_verify(BASELINE, "--expect-fault", "kill")
    assert code == 1, out
    v = failing(BASELINE, "prior_checkpoint", "kill")
    assert "no injection marker: fault kill was requested" in v.reason
    assert v.evidence[0].location == MARKER  # absent
    assert not judge_run_dir(BASELINE, expect_fault="kill").verdict("replaced_cycle").passed


# ---------------------------------------------------------------------------------------------
# doctored copies of reference-kill: one criterion fails, on the line that proves it


def test_prior_checkpoint_fails_when_the_save_was_only_scheduled(kill: Doctor) -> None:
    kill.delete(CYCLE0, "save completed iteration 10")
    v = failing(kill.root, "prior_checkpoint")
    assert "save of iteration 10 was only scheduled before the failure" in v.reason
    assert locations(v)[:2] == [f"{MARKER}:22", f"{CYCLE0}:17"]  # save scheduled iteration 10


def test_prior_checkpoint_fails_when_finalized_after_the_failure(kill: Doctor) -> None:
    # the line moves with its time: a rank's lines never go back in time (criteria/clocks.py)
    moved = kill.delete(CYCLE0, "11:52:40.187+00:00 rank 0 save completed iteration 10")[0]
    at = kill.insert_after(
        CYCLE0, "rank 0 save scheduled iteration 20", moved.replace("40.187", "41.187")
    )
    v = failing(kill.root, "prior_checkpoint")
    assert "finalized only at 11:52:41.187, after the failure (11:52:40.347)" in v.reason
    assert f"{CYCLE0}:{at}" in locations(v)


def test_replaced_cycle_fails_for_another_pid(kill: Doctor) -> None:
    kill.replace(LAUNCHER, "local_rank: 1 (pid: 14181)", "local_rank: 1 (pid: 14180)")
    v = failing(kill.root, "replaced_cycle")
    assert "recorded the failure of local_rank 1 (pid 14180), but the marker claims" in v.reason
    assert v.evidence[0].location == f"{LAUNCHER}:46"


def test_replaced_cycle_fails_without_the_replacement_record(kill: Doctor) -> None:
    kill.remove("cycle_infos/cycle_info..0.1")
    kill.remove(CYCLE1)
    kill.set_json("result.json", exit_code=1)  # no cycle after the kill: no clean exit either
    v = failing(kill.root, "replaced_cycle")
    assert "no replacement cycle record after the failure of cycle 0" in v.reason


def test_optimizer_state_load_fails_on_a_load_failed_line(kill: Doctor) -> None:
    kill.replace(
        CYCLE1,
        f"rank 1 load checkpoint iteration 10 {PARTS} consumed_samples 40 path {CKPT}/iter_0000010",
        f"rank 1 load failed: tracker names iteration 10 but {CKPT}/iter_0000010/.metadata is"
        " missing",
    )
    v = failing(kill.root, "optimizer_state_load")
    assert "cycle 1 could not restore its state" in v.reason and "load failed:" in v.reason
    assert v.evidence[0].location == f"{CYCLE1}:5"


def test_optimizer_state_load_fails_on_a_fresh_start_after_the_restart(kill: Doctor) -> None:
    for rank in (1, 0):
        kill.replace(
            CYCLE1,
            f"rank {rank} load checkpoint iteration 10 {PARTS} consumed_samples 40 path"
            f" {CKPT}/iter_0000010",
            f"rank {rank} no checkpoint found at {CKPT}/latest_checkpointed_iteration.txt,"
            " starting from scratch",
        )
    v = failing(kill.root, "optimizer_state_load")
    assert "cycle 1 found no checkpoint and started from random initialization" in v.reason
    assert v.evidence[0].location == f"{CYCLE1}:5"


def test_optimizer_state_load_fails_when_one_rank_starts_from_scratch(kill: Doctor) -> None:
    kill.replace(
        CYCLE1,
        f"rank 0 load checkpoint iteration 10 {PARTS} consumed_samples 40 path {CKPT}/iter_0000010",
        f"rank 0 no checkpoint found at {CKPT}/latest_checkpointed_iteration.txt, starting from"
        " scratch",
    )
    v = failing(kill.root, "optimizer_state_load")
    assert "started from random initialization on others" in v.reason
    assert locations(v) == [f"{CYCLE1}:6", f"{CYCLE1}:5"]


def test_optimizer_state_load_fails_when_the_optimizer_is_not_among_the_parts(
    kill: Doctor,
) -> None:
    kill.replace(
        CYCLE1,
        f"rank 0 load checkpoint iteration 10 {PARTS}",
        "rank 0 load checkpoint iteration 10 (model, scheduler, rng, data)",
    )
    v = failing(kill.root, "optimizer_state_load")
    assert "restored iteration 10 without optimizer state" in v.reason
    assert "(model, scheduler, rng, data)" in v.reason
    assert v.evidence[0].location == f"{CYCLE1}:6"
    others_pass(kill.root, "optimizer_state_load")


def test_optimizer_state_load_fails_on_the_in_flight_save(kill: Doctor) -> None:
    kill.replace(CYCLE1, "load checkpoint iteration 10", "load checkpoint iteration 20")
    v = failing(kill.root, "optimizer_state_load")
    assert "loaded iteration 20, a save only scheduled before the failure" in v.reason
    # the scheduling line of 20, then the completion of 10
    assert locations(v) == [f"{CYCLE1}:5", f"{CYCLE0}:30", f"{CYCLE0}:28"]


def test_optimizer_state_load_fails_on_an_abort_during_the_restore(kill: Doctor) -> None:
    at = kill.insert_after(
        CYCLE1,
        "rank 0 load checkpoint iteration 10",
        ref_line("11:52:53.000", 1, "aborted RuntimeError: Connection closed by peer"),
    )
    v = failing(kill.root, "optimizer_state_load")
    assert "error while cycle 1 restored" in v.reason and "aborted RuntimeError" in v.reason
    assert v.evidence[0].location == f"{CYCLE1}:{at}"


def test_progress_fails_when_truncated_before_the_final_iteration(kill: Doctor) -> None:
    """The replacement ended training at 30 of 40 (said so, and exited 0)."""
    kill.truncate_after(CYCLE1, "save completed iteration 20")
    kill.append(
        CYCLE1,
        ref_line("11:52:57.400", 0, "training finished iteration 30"),
        ref_line("11:52:57.410", 0, "exit code 0"),
        ref_line("11:52:57.411", 1, "exit code 0"),
    )
    v = failing(kill.root, "progress_past_restore")
    assert "stopped at iteration 30, before the final iteration 40 (from run.json)" in v.reason
    assert locations(v)[:2] == [f"{CYCLE1}:27", "run.json:14"]  # iteration 30/40, train_iters


def test_progress_fails_without_a_save_completed_after_the_restore(kill: Doctor) -> None:
    kill.delete(CYCLE1, "save completed iteration")
    v = failing(kill.root, "progress_past_restore")
    assert "no checkpoint beyond iteration 10 completed after the restore" in v.reason
    assert "(saves were scheduled but never finalized)" in v.reason
    assert locations(v)[0] == f"{CYCLE1}:17"  # save scheduled iteration 20
    others_pass(kill.root, "progress_past_restore")


def test_no_repeat_fails_on_a_second_abort_after_the_replacement(kill: Doctor) -> None:
    at = kill.insert_after(
        CYCLE1,
        "rank 0 iteration 25/40",
        ref_line("11:52:56.300", 1, "aborted RuntimeError: Connection closed by peer"),
    )
    v = failing(kill.root, "no_repeat_injection")
    assert "the workload reported a failure after the replacement started" in v.reason
    assert v.evidence[0].location == f"{CYCLE1}:{at}"
    others_pass(kill.root, "no_repeat_injection")


def test_no_repeat_fails_on_a_second_worker_failure(kill: Doctor) -> None:
    at = kill.insert_after(
        LAUNCHER, "Event: worker_start_completed", glog_failed("11:52:55.000000", 0, 14330), nth=1
    )
    v = failing(kill.root, "no_repeat_injection")
    assert "a second failure after the replacement started" in v.reason
    assert v.evidence[0].location == f"{LAUNCHER}:{at}"


def test_no_repeat_fails_on_a_no_progress_exit(kill: Doctor) -> None:
    kill.set_json("result.json", exit_code=93)
    v = failing(kill.root, "no_repeat_injection")
    assert "launcher exited with code 93 (no-progress stop)" in v.reason
    assert v.evidence[0].location == "result.json:2"


def test_a_peer_abort_in_the_failed_cycle_is_expected(kill: Doctor) -> None:
    # docs/reference-workload.md: a rank whose peer was killed may log this before it is stopped
    kill.insert_after(
        CYCLE0,
        "save scheduled iteration 20",
        ref_line("11:52:40.300", 0, "aborted RuntimeError: Connection closed by peer"),
    )
    assert judge_run_dir(kill.root).passed


def test_baseline_fails_no_repeat_on_a_workload_error(tmp_path: Path) -> None:
    base = copy_run(BASELINE, tmp_path / "reference-baseline")
    at = base.insert_after(
        CYCLE0, "rank 0 iteration 30/40", ref_line("11:52:07.000", 0, "save failed iteration 30: x")
    )
    v = failing(base.root, "no_repeat_injection")
    assert "baseline run's workload reported a failure" in v.reason
    assert v.evidence[0].location == f"{CYCLE0}:{at}"


# ---------------------------------------------------------------------------------------------
# the workload's own torch DCP checkpoints


@pytest.fixture(scope="module")
def reference_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """iter_0000010 as the workload writes it, and a copy of it without the optimizer state."""
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    root = tmp_path_factory.mktemp("reference-ckpt")
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": ONE_RANK_STORE_PORT,
    }
    argv = ["--no-ft", "--train-iters=10", "--save-interval=10", f"--save={root}", "--step-time=0"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_nvrx.workloads.reference", *argv],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    real = root / "iter_0000010"
    flat = root / "flat.pt"
    dcp_to_torch_save(str(real), str(flat))
    state = torch.load(flat, weights_only=False)
    del state["optimizer"]
    stripped = root / "without-optimizer" / "iter_0000010"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: saving non-distributed"
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(stripped)))
    return {"real": real, "stripped": stripped}


def test_optimizer_state_confirmed_from_the_workloads_own_checkpoint(
    kill: Doctor, reference_checkpoints: dict[str, Path]
) -> None:
    shutil.copytree(reference_checkpoints["real"], kill.path("checkpoints/iter_0000010"))
    # the checkpoint the tracker names at the end is on disk too (its pruned directory: the
    # data kept no checkpoint directory, and one of them alone on disk is a contradiction)
    kill.path("checkpoints/iter_0000040").mkdir()
    meta = load_run(kill.root).checkpoint(10)
    assert meta is not None and meta.state is OptimizerState.PRESENT
    assert meta.example is not None and meta.example.startswith("optimizer.state.")
    assert meta.example.endswith(".exp_avg")
    j = judge_run_dir(kill.root)
    assert j.passed
    v = j.verdict("optimizer_state_load")
    assert f"optimizer state confirmed in the checkpoint ({meta.optimizer_keys}/" in v.reason
    assert "checkpoints/iter_0000010/.metadata" in locations(v)


def test_checkpoint_without_optimizer_keys_fails_despite_the_log(
    kill: Doctor, reference_checkpoints: dict[str, Path]
) -> None:
    # the log says "optimizer" was restored; the checkpoint on disk holds none: it wins
    shutil.copytree(reference_checkpoints["stripped"], kill.path("checkpoints/iter_0000010"))
    v = failing(kill.root, "optimizer_state_load")
    assert "checkpoint 10 on disk: torch DCP metadata: none of" in v.reason
    assert v.evidence[0].location == "checkpoints/iter_0000010/.metadata"
