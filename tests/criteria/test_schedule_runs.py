"""Real fault-schedule runs of the reference workload (tests/data/cpu-schedules, issue #26),
re-judged, and doctored copies of them that must fail or be refused.

* ``ref-kill-step+kill-restore``: a kill in a step of cycle 0, then a kill into cycle 1 while it
  loaded checkpoint 5; cycle 2 restored 5 and trained to the end.
* ``ref-hang-finalize+ckpt-worker-finalize``: a hang while save 10 was finalized (cycle 0), then
  the checkpoint worker killed while save 15 was in flight (cycle 1); cycle 2 restored 10.
* ``ref-budget-kill-step+kill-restore+kill-restore``: three faults over ``--max-restarts 1``: the
  launcher gave up after the second (exit 1).
* ``ref-no-progress-kill-step+3x-kill-restore``: ``kill@step`` and three ``kill@restore`` (then a
  ``kill@step`` never due) over ``--max-restarts 5``: three cycles in a row without progress, and
  NVRx's progress tracker stopped the job (exit 93).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_nvrx.criteria import CRITERIA_IDS, judge_run_dir
from pytest_nvrx.criteria.outcome import run_outcome
from pytest_nvrx.layout import marker_name
from pytest_nvrx.report.model import ScenarioReport
from tests.helpers.doctor import Doctor, copy_run

DATA = Path(__file__).parents[1] / "data" / "cpu-schedules"
TWO = DATA / "ref-kill-step+kill-restore"
FINALIZE = DATA / "ref-hang-finalize+ckpt-worker-finalize"
BUDGET = DATA / "ref-budget-kill-step+kill-restore+kill-restore"
NO_PROGRESS = DATA / "ref-no-progress-kill-step+3x-kill-restore"
SIGNALS_AT_RESTORE = DATA / "ref-kill-step+term-restore+segv-restore"


def _statuses(run: Path) -> dict[str, str]:
    return {v.id: v.status for v in judge_run_dir(run).verdicts}


@pytest.mark.parametrize(("run", "n"), [(TWO, 2), (FINALIZE, 2), (SIGNALS_AT_RESTORE, 3)])
def test_a_schedule_that_recovers_every_time_passes_every_criterion_per_fault(
    run: Path, n: int
) -> None:
    j = judge_run_dir(run)
    assert j.passed and j.judgeable, run_outcome(j).summary
    assert [v.id for v in j.verdicts] == list(CRITERIA_IDS)
    for v in j.verdicts:
        if v.id != "no_repeat_injection":
            assert all(f"fault {k} of {n}" in v.reason for k in range(1, n + 1)), v.reason
    assert (
        f"each of the {n} scheduled faults happened exactly once"
        in j.verdict("no_repeat_injection").reason
    )


def test_a_restore_fault_is_judged_against_the_checkpoint_it_struck() -> None:
    j = judge_run_dir(TWO)
    c1 = j.verdict("prior_checkpoint").reason
    assert "fault 2 of 2, kill@restore in cycle 1: checkpoint iteration 5 was finalized" in c1
    assert "the marker records window restore, trigger checkpoint load" in c1
    c3 = j.verdict("optimizer_state_load").reason
    assert "fault 2 struck its replacement while it loaded: it was loading checkpoint 5" in c3
    assert "cycle 2 loaded checkpoint iteration 5" in c3
    # what cycle 2 computed again was last computed by cycle 0 (cycle 1 trained nothing)
    c6 = j.verdict("training_continuity")
    assert c6.passed and not c6.not_applicable
    assert "cycle 2 vs cycle 0: iterations 6..10 replayed, 5/5 equal" in c6.reason


def test_a_recovery_cut_short_by_the_next_fault_needs_no_final_iteration() -> None:
    c4 = judge_run_dir(FINALIZE).verdict("progress_past_restore").reason
    assert "fault 1 of 2, hang@finalize in cycle 0: after iteration 5, committed" in c4
    assert "before the next fault ended the cycle" in c4
    assert "fault 2 of 2, ckpt-worker@finalize in cycle 1: after iteration 10" in c4
    assert "final iteration 20 (from run.json) reached" in c4


def test_a_spent_restart_budget_is_the_launcher_s_qualification() -> None:
    j = judge_run_dir(BUDGET)
    assert j.passed, run_outcome(j).summary
    c5 = j.verdict("no_repeat_injection")
    assert "the launcher gave up after exactly 2 cycles" in c5.reason
    assert "max_restarts 1" in c5.reason and "(exit code 1)" in c5.reason
    assert "Worker group UNHEALTHY. 1/1 attempts left" in c5.reason
    # the fault that spent the budget has no replacement to judge
    assert (
        "fault 2 of 3, kill@restore in cycle 1: not applicable"
        in j.verdict("replaced_cycle").reason
    )


def test_a_schedule_faster_than_its_checkpoints_meets_nvrx_s_no_progress_stop() -> None:
    j = judge_run_dir(NO_PROGRESS)
    assert j.passed, run_outcome(j).summary
    c5 = j.verdict("no_repeat_injection").reason
    assert "NVRx stopped the job after 4 cycles, 3 of them in a row without progress" in c5
    assert "EARLY TERMINATION: 3 consecutive training cycles without progress" in c5
    assert "(exit code 93)" in c5


# -- doctored copies: each must fail, naming the fault, or be refused ---------------------------


def _copy(run: Path, tmp_path: Path) -> Doctor:
    return copy_run(run, tmp_path / run.name)


def test_a_scheduled_fault_that_never_happened_fails(tmp_path: Path) -> None:
    doc = _copy(TWO, tmp_path)
    doc.path(marker_name(2)).unlink()
    j = judge_run_dir(doc.root)
    assert not j.passed
    c1 = j.verdict("prior_checkpoint")
    assert not c1.passed
    assert "fault 2 of 2, kill@restore, never happened (fault_injected_2.json is absent)" in (
        c1.reason
    )
    assert not j.verdict("no_repeat_injection").passed


def test_a_restore_fault_that_struck_another_checkpoint_fails(tmp_path: Path) -> None:
    doc = _copy(TWO, tmp_path)
    doc.replace(marker_name(2), '"load_iteration": 5', '"load_iteration": 10')
    j = judge_run_dir(doc.root)
    c1 = j.verdict("prior_checkpoint")
    assert not c1.passed
    assert c1.reason.startswith("fault 2 of 2, kill@restore in cycle 1: the marker says the")
    assert "loading checkpoint 10 while the tracker named 5" in c1.reason
    assert not j.verdict("optimizer_state_load").passed


def test_a_second_recovery_that_restored_an_older_checkpoint_fails(tmp_path: Path) -> None:
    doc = _copy(FINALIZE, tmp_path)
    for rank in (0, 1):
        doc.replace(
            "logs/train_cycle2.log",
            f"rank {rank} load checkpoint iteration 10 (model, optimizer, scheduler, rng, data)"
            " consumed_samples 40",
            f"rank {rank} load checkpoint iteration 5 (model, optimizer, scheduler, rng, data)"
            " consumed_samples 20",
        )
    c3 = judge_run_dir(doc.root).verdict("optimizer_state_load")
    assert not c3.passed
    assert c3.reason.startswith("fault 2 of 2, ckpt-worker@finalize in cycle 1:"), c3.reason


def test_a_replay_that_differs_after_the_second_fault_fails(tmp_path: Path) -> None:
    doc = _copy(TWO, tmp_path)
    doc.replace(
        "logs/train_cycle2.log",
        "iteration 6/20 consumed_samples 24 loss 4.945107460021973",
        "iteration 6/20 consumed_samples 24 loss 4.945107460021999",
    )
    c6 = judge_run_dir(doc.root).verdict("training_continuity")
    assert not c6.passed
    assert c6.reason.startswith("fault 2 of 2, kill@restore in cycle 1: replayed"), c6.reason


def test_a_fault_beyond_the_schedule_fails(tmp_path: Path) -> None:
    doc = _copy(TWO, tmp_path)
    extra = json.loads(doc.path(marker_name(2)).read_text())
    extra["schedule_position"] = 2  # a marker that says it is the second, at the third's name
    doc.path(marker_name(3)).write_text(json.dumps(extra, indent=2))
    c5 = judge_run_dir(doc.root).verdict("no_repeat_injection")
    assert not c5.passed
    assert "fault 3 was injected beyond the schedule's 2 faults" in c5.reason


def test_a_budget_run_judged_with_a_budget_that_was_not_spent_fails(tmp_path: Path) -> None:
    doc = _copy(BUDGET, tmp_path)
    doc.replace("run.json", '"max_restarts": 1', '"max_restarts": 3')
    j = judge_run_dir(doc.root)
    assert not j.passed
    # with 3 restarts the third fault was due: it never happened, and the launcher gave up
    assert "fault 3 of 3, kill@restore, never happened" in j.verdict("prior_checkpoint").reason
    assert not j.verdict("no_repeat_injection").passed


def test_a_no_progress_stop_without_nvrx_s_line_fails(tmp_path: Path) -> None:
    doc = _copy(NO_PROGRESS, tmp_path)
    doc.delete("logs/launcher.log", "EARLY TERMINATION")
    doc.delete("logs/launcher.log", "no progress across restarts")
    c5 = judge_run_dir(doc.root).verdict("no_repeat_injection")
    assert not c5.passed
    assert "no line of NVRx says it stopped for no progress" in c5.reason


def test_an_unscheduled_failure_fails(tmp_path: Path) -> None:
    """A worker failure record in cycle 1 before its scheduled fault, which neither explains."""
    doc = _copy(FINALIZE, tmp_path)
    log = "logs/launcher.log"
    line = doc.lines(log)[doc.line_no(log, "failed (exitcode: 1)") - 1]
    early = line.replace("E1202 14:17:14.035000", "E1202 14:17:05.000000").replace(
        "failed (exitcode: 1) local_rank: 1", "failed (exitcode: -6) local_rank: 0"
    )
    doc.insert_after(log, "Cycle: 1 Event: worker_start_completed", early)
    j = judge_run_dir(doc.root)
    assert not j.passed, run_outcome(j).summary
    c5 = j.verdict("no_repeat_injection")
    assert not c5.passed
    assert "a failure no scheduled fault explains" in c5.reason
    assert "failed (exitcode: -6) local_rank: 0" in c5.reason


GPU = Path(__file__).parents[1] / "data" / "gpu-schedules"
GPU_RUNS = sorted(p for p in GPU.glob("core_*/megatron-schedule-*") if p.is_dir())


def test_the_megatron_schedule_matrix_ran_on_both_revisions() -> None:
    assert {p.parent.name for p in GPU_RUNS} == {"core_v0.19.0", "core_v0.18.2"}
    # the default schedule matrix on each revision, and a worker killed after two restarts
    assert len(GPU_RUNS) == 7


@pytest.mark.parametrize("run", GPU_RUNS, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_the_megatron_schedule_runs_pass_fault_by_fault(run: Path) -> None:
    j = judge_run_dir(run)
    assert j.passed and j.judgeable, run_outcome(j).summary
    c5 = j.verdict("no_repeat_injection").reason
    if run.name.endswith("restarts1"):
        assert "the launcher gave up after exactly 2 cycles" in c5
        assert "Worker group FAILED. 1/1 attempts left" in c5
    else:
        assert f"each of the {len(j.schedule)} scheduled faults happened exactly once" in c5
    for v in j.verdicts:
        if v.id != "no_repeat_injection":
            assert "fault 1 of" in v.reason and "fault 2 of" in v.reason, v.reason


@pytest.mark.parametrize("revision", ["core_v0.19.0", "core_v0.18.2"])
def test_megatron_restored_the_checkpoint_its_outliving_rank_finalized(revision: str) -> None:
    """After the checkpoint worker was killed with save 20 in flight, the rank finalized 15
    (submitted before the kill) and the next cycle restored 15, not 10 and never 20."""
    j = judge_run_dir(GPU / revision / "megatron-schedule-hang-finalize_ckpt-worker-finalize")
    c3 = j.verdict("optimizer_state_load").reason
    assert (
        "fault 2 of 2, ckpt-worker@finalize in cycle 1: cycle 2 loaded checkpoint iteration 15"
        in c3
    )
    assert "not the save 20 in flight at the fault" in c3


def test_megatron_s_restore_fault_struck_inside_its_checkpoint_load(tmp_path: Path) -> None:
    run = GPU / "core_v0.19.0" / "megatron-schedule-kill-step_kill-restore"
    marker = json.loads((run / marker_name(2)).read_text())
    assert (marker["window"], marker["trigger"], marker["load_iteration"]) == (
        "restore",
        "checkpoint load",
        5,
    )
    # the same edit as on the reference run fails here too
    doc = _copy(run, tmp_path)
    doc.replace(marker_name(2), '"load_iteration": 5', '"load_iteration": 10')
    assert not judge_run_dir(doc.root).verdict("prior_checkpoint").passed


def _set(doc: Doctor, rel: str, key: str, value: object, *, config: bool = False) -> None:
    data = doc.json(rel)
    (data["config"] if config else data)[key] = value
    doc.path(rel).write_text(json.dumps(data, indent=2))


def _load_line(rank: int, iteration: int, when: str) -> str:
    return (
        f"{rank}: [ref] 2026-12-02T14:{when}+00:00 rank {rank} load checkpoint iteration"
        f" {iteration} (model, optimizer, scheduler, rng, data) consumed_samples"
        f" {iteration * 4} path /tmp/s1/checkpoints/iter_{iteration:07d}"
    )


# Each one edit found by an adversarial pass over the committed runs (the run is wrong, or its
# evidence contradicts itself), with what must be said: a FAIL (1) or "cannot judge" (2).
Edit = Callable[[Doctor], object]
ATTACKS: dict[str, tuple[Path, Edit, int, str]] = {
    "marker 2 names another schedule": (
        TWO,
        lambda d: _set(d, marker_name(2), "schedule", ["kill@step", "kill@restore", "kill@step"]),
        2,
        "records the schedule kill@step,kill@restore,kill@step, but run.json runs",
    ),
    "marker 2 says it is fault 1": (
        FINALIZE,
        lambda d: _set(d, marker_name(2), "schedule_position", 1),
        2,
        "says it is fault 1, but its name fault_injected_2.json is fault 2's",
    ),
    "marker 2's restart count is not its cycle's": (
        TWO,
        lambda d: _set(d, marker_name(2), "restart_count", 0),
        2,
        "but fault 2 fired in cycle 1",
    ),
    "marker 2's time is after its failure was detected": (
        TWO,
        lambda d: _set(d, marker_name(2), "time", "2026-12-02T14:13:55.500000+00:00"),
        2,
        "impossible timing",
    ),
    "the struck replacement logged loading another checkpoint": (
        TWO,
        lambda d: d.insert_before(
            "logs/train_cycle1.log", "rank 0 load failed", _load_line(0, 10, "13:54.700")
        ),
        1,
        "but cycle 1 logged loading checkpoint 10, not 5",
    ),
    "the struck replacement trained": (
        NO_PROGRESS,
        lambda d: d.insert_before(
            "logs/train_cycle2.log",
            "window restore (checkpoint load)",
            "0: [ref] 2026-12-02T14:22:12.600+00:00 rank 0 iteration 6/20 consumed_samples 24"
            " loss 4.945107460021973 lr 0.009397114317029975 grad_norm 0.5321506261825562",
        ),
        1,
        "yet cycle 2 committed iteration 6: the fault did not land in its restore",
    ),
    "the launcher counts another restart budget": (
        BUDGET,
        lambda d: d.replace("logs/launcher.log", "1/1 attempts left", "3/3 attempts left"),
        2,
        "counts 3/3 restart attempts, but run.json:",
    ),
    "run.json's schedule is shorter than the markers'": (
        BUDGET,
        lambda d: _set(d, "run.json", "schedule", ["kill@step", "kill@restore"], config=True),
        2,
        "but run.json runs kill@step,kill@restore",
    ),
    "NVRx says a cycle struck in its restore made progress": (
        NO_PROGRESS,
        lambda d: d.replace(
            "logs/launcher.log",
            "Training cycle #2 made NO progress: 5 → 5 (0 iterations, need 1). Consecutive"
            " cycles without progress: 2/3",
            "Training cycle #2 made progress: 5 → 10 (5 iterations)",
        ),
        2,
        "NVRx says cycle 2 made progress, but a fault struck its restore",
    ),
    "a no-progress stop that exits as a failure": (
        NO_PROGRESS,
        lambda d: _set(d, "result.json", "exit_code", 1),
        1,
        "exit code is 93, NVRx's exit code for a job it must not restart, but it is 1",
    ),
    "a spent budget that exits as a no-restart stop": (
        BUDGET,
        lambda d: _set(d, "result.json", "exit_code", 93),
        1,
        "but it is 93",
    ),
    "run.json's max_restarts is not the launcher's": (
        TWO,
        lambda d: d.replace("run.json", '"max_restarts": 3', '"max_restarts": 2'),
        2,
        "says max_restarts 2, but the launcher ran with 3",
    ),
    "marker 2's baseline is not its injector's": (
        TWO,
        lambda d: _set(d, marker_name(2), "baseline_iteration", 0),
        2,
        "records baseline iteration 0, but the injector of rank 1 said it watched from baseline 5",
    ),
    "an arming line names another fault": (
        TWO,
        lambda d: d.replace(
            "logs/train_cycle1.log",
            "arming fault 2 of 2 (kill@restore)",
            "arming fault 1 of 2 (kill@step)",
        ),
        2,
        "armed fault 1 (kill@step) of kill@step,kill@restore, but fault 1 fired in cycle 0",
    ),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_an_adversarial_edit_is_never_a_pass(attack: str, tmp_path: Path) -> None:
    run, edit, code, said = ATTACKS[attack]
    doc = _copy(run, tmp_path)
    edit(doc)
    j = judge_run_dir(doc.root)
    assert not j.passed, run_outcome(j).summary
    assert (1 if j.judgeable else 2) == code, run_outcome(j).summary
    texts = [v.reason for v in j.verdicts] + [p.message for p in j.problems]
    assert any(said in t for t in texts), "\n".join(texts)


def test_the_report_timeline_shows_every_fault_and_cycle() -> None:
    report = ScenarioReport.from_run_dir(NO_PROGRESS)
    timeline = report.timeline
    assert timeline is not None
    faults = [(e.label, e.cycle) for e in timeline.events if e.kind == "fault"]
    assert faults == [
        ("kill (SIGKILL) into rank 1", 0),
        ("fault 2: kill (SIGKILL) into rank 1 (kill@restore)", 1),
        ("fault 3: kill (SIGKILL) into rank 1 (kill@restore)", 2),
        ("fault 4: kill (SIGKILL) into rank 1 (kill@restore)", 3),
    ]
    assert [c.cycle for c in timeline.cycles] == [0, 1, 2, 3]
    two = ScenarioReport.from_run_dir(TWO).timeline
    assert two is not None
    later = [(e.kind, e.cycle) for e in two.events if "(fault 2)" in e.label]
    assert later == [("checkpoint_loaded", 2), ("first_step", 2)]


EXCEPTION_RESTORE = DATA / "ref-kill-step+exception-restore"


def test_an_exception_in_the_restore_the_workload_reports_as_its_load_failure() -> None:
    """The reference workload catches what its load raises and reports it (``load failed: ...
    InjectedFault(...)``); its peer's load fails with it, and the launcher records the peer's
    exit first (torchelastic records the first exit it sees)."""
    c2 = judge_run_dir(EXCEPTION_RESTORE).verdict("replaced_cycle")
    assert c2.passed, c2.reason
    assert (
        "fault 2 of 2, exception@restore in cycle 1: launcher recorded rank 1 raised" in c2.reason
    )
    assert "the launcher recorded local_rank 0's exit 1 first 3.9 s after it raised" in c2.reason


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (
            # the peer's recorded exit before the fault: no failure the fault explains
            ("logs/launcher.log", "E1202 14:49:40.585000", "E1202 14:49:30.585000"),
            "the launcher recorded neither its exit nor a timeout",
        ),
        (
            (
                "logs/train_cycle1.log",
                "injected exception on rank 1 in",
                "injected exception on rank 0 in",
            ),
            "holds no InjectedFault traceback of rank 1",
        ),
    ],
)
def test_an_exception_in_the_restore_needs_the_rank_s_own_word(
    edit: tuple[str, str, str], said: str, tmp_path: Path
) -> None:
    doc = _copy(EXCEPTION_RESTORE, tmp_path)
    doc.replace(*edit)
    c2 = judge_run_dir(doc.root).verdict("replaced_cycle")
    assert not c2.passed
    assert c2.reason.startswith("fault 2 of 2, exception@restore in cycle 1:"), c2.reason
    assert said in c2.reason


def test_verify_names_the_schedule_in_its_text_and_its_json(tmp_path: Path) -> None:
    out = tmp_path / "v.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest_nvrx", "verify", str(TWO), "--json", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    head = done.stdout.splitlines()[0]
    assert head.endswith(
        "expected the fault schedule kill@step,kill@restore (from run.json), one fault per cycle"
    )
    data = json.loads(out.read_text())
    assert data["schedule"] == ["kill@step", "kill@restore"]
    assert judge_run_dir(DATA.parent / "windows" / "cpu" / "ref-kill-save").schedule == ()


def test_megatron_s_checkpoint_worker_survived_two_restarts() -> None:
    """kill@step,kill@step,ckpt-worker@finalize: the third cycle's persistent checkpoint worker
    (after two restarts) saved 15 and 20 before it was killed with 25 in flight; the rank waited
    in its checkpointing section until the section timeout (NVRx does not notice the dead
    worker, docs/findings.md), and the fourth cycle restored 20."""
    run = GPU / "core_v0.19.0" / "megatron-schedule-kill-step_kill-step_ckpt-worker-finalize"
    j = judge_run_dir(run)
    assert j.passed, run_outcome(j).summary
    c2 = j.verdict("replaced_cycle").reason
    assert "fault 3 of 3, ckpt-worker@finalize in cycle 2: launcher recorded rank 0 timed out" in c2
    c3 = j.verdict("optimizer_state_load").reason
    assert "cycle 3 loaded checkpoint iteration 20" in c3


def test_an_exception_whose_peer_exited_first_is_the_fault_s(tmp_path: Path) -> None:
    """One fault, window step (issue #26 made the reference's steps short): the raising rank
    unwinds while its peer's collective fails at once, and torchelastic records the peer's exit
    1, the first it sees, after the fault. The raising rank's traceback says what it died of;
    a peer's record from before the fault would not (that edit fails). The peer exited by
    itself: the launcher's closing signal to it, in the committed run, goes (a peer still
    running when the launcher stops the group is no peer that failed first:
    tests/criteria/test_peer_named_first.py)."""
    run = DATA.parent / "windows" / "cpu" / "ref-exception-step"
    doc = _copy(run, tmp_path)
    doc.replace("logs/launcher.log", "local_rank: 1 (pid: 2283)", "local_rank: 0 (pid: 2282)")
    doc.delete("logs/launcher.log", "Sending process 2282 closing signal")
    c2 = judge_run_dir(doc.root).verdict("replaced_cycle")
    assert c2.passed, c2.reason
    assert "the launcher recorded local_rank 0's exit 1 first" in c2.reason
    doc.replace("logs/launcher.log", "E1130 16:25:00.385000", "E1130 16:24:00.385000")
    assert not judge_run_dir(doc.root).verdict("replaced_cycle").passed
