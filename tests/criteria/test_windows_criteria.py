"""Fault windows (issue #10) in the evidence and the criteria.

Real runs recorded before windows existed (tests/data/cpu-faults, gpu-faults, cpu) are doctored
into schema-2 window runs: the marker gains its window, trigger and in-flight iteration, the
injector's fire line takes its new form and run.json asks for the window. Each such run is
judged as it is (it must pass) and with one edit that a criterion must catch, asserting the
reason and the quoted line. What each edit does to the real timeline is said where it is made.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from pytest_nvrx.criteria import CRITERIA_IDS, Judgement, Verdict, judge_run_dir
from pytest_nvrx.evidence.injector_log import parse_injector_line
from pytest_nvrx.evidence.marker import read_marker
from pytest_nvrx.evidence.refs import LineCursor
from pytest_nvrx.evidence.rundir import load_run
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import LAUNCHER, MARKER, Doctor, copy_run, set_injector_option

DATA = Path(__file__).parents[1] / "data"
REF_TERM = DATA / "cpu-faults" / "ref-term"
REF_HANG = DATA / "cpu" / "reference-hang"
MEGATRON_TERM = DATA / "gpu-faults" / "g2-term-30"
CYCLE0 = "logs/train_cycle0.log"
CYCLE1 = "logs/train_cycle1.log"
RUN_JSON = "run.json"
INJECTOR = "[pytest-nvrx injector]"
# ref-term: rank 1 (pid 11290) got SIGTERM at 15:19:50.950, right after rank 0's "save completed
# iteration 4" (50.914) and before its "save scheduled iteration 8" (50.958); the launcher saw
# exit -15 at 51.202; cycle 1 loaded 4 and completed 8 again at 15:20:02.355.
REF_PID = 11290
MARKER_PATH = "/tmp/tw/runs/ref-term/fault_injected.json"


def fire_line(
    window: str,
    trigger: str,
    in_flight: int | None,
    tracker: int,
    action: str,
    rank: int = 1,
    pid: int = REF_PID,
    marker: str = MARKER_PATH,
) -> str:
    n = "none" if in_flight is None else in_flight
    return (
        f"{rank}: {INJECTOR} rank {rank} pid {pid}: window {window} ({trigger}): in-flight"
        f" iteration {n}, tracker {tracker}; marker {marker} written; {action}"
    )


def as_window_run(
    doc: Doctor,
    *,
    window: str,
    trigger: str,
    in_flight: int | None,
    section: str | None,
    time: str | None = None,
    fault: str | None = None,
    after: str | None = None,
    action: str | None = None,
    **marker: object,
) -> Doctor:
    """Turn a copied v1 run into a schema-2 run of ``window``: the marker's new keys, run.json's
    ``config.window`` (and fault), and the v1 fire line replaced by the v2 one (moved to after
    the first line containing ``after`` when given)."""
    data = doc.json(MARKER)
    fault = fault or data["fault"]
    pid = data["pid"]
    tracker = data["tracker_iteration"]
    changes: dict[str, object] = {
        "schema_version": 2,
        "fault": fault,
        "window": window,
        "trigger": trigger,
        "in_flight_iteration": in_flight,
        "section": section,
        "write_done": None if in_flight is None else False,
        "rank_pid": pid,
    }
    if time is not None:
        changes["time"] = time
    changes.update(marker)
    doc.set_json(MARKER, **changes)
    run = doc.json(RUN_JSON)
    run["config"].update(window=window, fault=fault)
    doc.set_json(RUN_JSON, config=run["config"])
    set_injector_option(doc, "--fault", fault)
    set_injector_option(doc, "--window", window)
    at = doc.line_no(CYCLE0, f"pid {pid}: tracker ")
    lines = doc.lines(CYCLE0)
    del lines[at - 1]
    doc.write_lines(CYCLE0, lines)
    signal = data["signal"]
    new = fire_line(
        window,
        trigger,
        in_flight,
        tracker,
        action or f"sending {signal} to pid {pid}",
        pid=pid,
        marker=data.get("tracker", "").rsplit("/", 2)[0] + "/fault_injected.json",
    )
    if after is None:
        lines.insert(at - 1, new + "\n")  # where the old line was
        doc.write_lines(CYCLE0, lines)
    else:
        doc.insert_after(CYCLE0, after, new)
    return doc


def judged(root: Path, **kwargs: object) -> Judgement:
    return judge_run_dir(root, **kwargs)  # type: ignore[arg-type]


def verdict(root: Path, criterion: str, **kwargs: object) -> Verdict:
    return judged(root, **kwargs).verdict(criterion)


def failed(root: Path, criterion: str, **kwargs: object) -> Verdict:
    v = verdict(root, criterion, **kwargs)
    assert not v.passed, v.render()
    return v


def assert_all_pass(j: Judgement) -> None:
    bad = [v.render() for v in j.verdicts if not v.passed or v.not_applicable]
    assert not bad and j.judgeable, "\n".join(bad) + f"\n{j.problems}"
    assert [v.id for v in j.verdicts] == list(CRITERIA_IDS)


# ---------------------------------------------------------------------------------------------
# The reference workload, window finalize: the fault comes after save 8 was submitted (rank 0's
# "save scheduled iteration 8" at 50.958) and before its finalization (the reference finalizes
# at the next save): the marker moves to 51.100, before the launcher's record at 51.202.


@pytest.fixture
def ref_finalize(tmp_path: Path) -> Doctor:
    doc = copy_run(REF_TERM, tmp_path / "ref-term-finalize")
    return as_window_run(
        doc,
        window="finalize",
        trigger="start_section(checkpointing)",
        in_flight=8,
        section="checkpointing",
        time="2026-11-30T15:19:51.100000+00:00",
        after="save scheduled iteration 8",
    )


def test_finalize_run_passes_all_six_and_says_how_the_fault_landed(ref_finalize: Doctor) -> None:
    j = judged(ref_finalize.root)
    assert_all_pass(j)
    assert j.window is not None and (j.window.window, j.window.source) == ("finalize", "run.json")
    c1 = j.verdict("prior_checkpoint")
    assert "checkpoint iteration 4 was finalized at 15:19:50.914, before the term" in c1.reason
    assert "in window finalize (from run.json): the marker records window finalize" in c1.reason
    assert "trigger start_section(checkpointing), section checkpointing open" in c1.reason
    assert "save 8 in flight, tracker 4, save 8 scheduled 0.142 s before the fault" in c1.reason
    assert "save 8 never completed in the faulted cycle, its background write still running" in (
        c1.reason
    )
    assert "restore point 4, never the in-flight 8" in c1.reason
    where = [r.location for r in c1.evidence]
    scheduled = ref_finalize.line_no(CYCLE0, "save scheduled iteration 8")
    fired = ref_finalize.line_no(CYCLE0, "window finalize (start_section(checkpointing))")
    assert f"{CYCLE0}:{scheduled}" in where and f"{CYCLE0}:{fired}" in where
    assert any(r.file == MARKER and "in_flight_iteration" in r.text for r in c1.evidence)
    c3 = j.verdict("optimizer_state_load")
    assert "cycle 1 loaded checkpoint iteration 4, the newest completed before" in c3.reason
    assert (
        "not the save 8 in flight at the fault (window finalize): checkpoints/iter_0000008/"
        " exists at the end of the run, rewritten by the save of 8 completed at 15:20:02.355"
    ) in c3.reason
    c4 = j.verdict("progress_past_restore")
    assert "the in-flight checkpoint 8 saved again at 15:20:02.355 (cycle 1)" in c4.reason
    resaved = ref_finalize.line_no(CYCLE1, "save completed iteration 8")
    assert f"{CYCLE1}:{resaved}" in [r.location for r in c4.evidence]
    c6 = j.verdict("training_continuity")
    assert c6.reason.startswith("cycle 1 vs cycle 0: iterations 5..8 replayed, 4/4 equal")


def test_the_in_flight_checkpoint_loaded_fails(ref_finalize: Doctor) -> None:
    """The replacement loads 8, the save in flight at the fault: the tracker named it early."""
    ref_finalize.replace(CYCLE1, "load checkpoint iteration 4 (", "load checkpoint iteration 8 (")
    v = failed(ref_finalize.root, "optimizer_state_load")
    assert v.reason == (
        "cycle 1 loaded iteration 8, the save in flight at the fault (window finalize): the"
        " tracker named it before its finalization; the newest checkpoint completed before the"
        " fault was 4"
    )
    assert v.evidence[0].location == f"{CYCLE1}:{ref_finalize.line_no(CYCLE1, 'iteration 8 (')}"
    assert any(r.file == MARKER and "in_flight_iteration" in r.text for r in v.evidence)


def test_in_flight_checkpoint_completed_before_the_fault_fails(ref_finalize: Doctor) -> None:
    """Save 8 completed (tracker written) before the fault: it was not in flight."""
    at = ref_finalize.insert_before(
        CYCLE0,
        "window finalize (",
        "0: [ref] 2026-11-30T15:19:51.000+00:00 rank 0 save completed iteration 8",
    )
    v = failed(ref_finalize.root, "prior_checkpoint")
    assert v.reason == (
        "window finalize: checkpoint 8, which the marker says was in flight, had completed at"
        " 15:19:51.000, before the fault at 15:19:51.100: the fault was not in window finalize"
    )
    assert v.evidence[0].location == f"{CYCLE0}:{at}"


def test_in_flight_checkpoint_completed_after_the_fault_in_the_faulted_cycle_fails(
    ref_finalize: Doctor,
) -> None:
    """Rank 0 finalized save 8 although rank 1 had died before it was durable."""
    at = ref_finalize.insert_after(
        CYCLE0,
        "window finalize (",
        "0: [ref] 2026-11-30T15:19:51.150+00:00 rank 0 save completed iteration 8",
    )
    v = failed(ref_finalize.root, "prior_checkpoint")
    assert "the faulted cycle completed checkpoint 8 at 15:19:51.150, after the fault" in v.reason
    assert "the tracker was advanced ahead of durability" in v.reason
    assert v.evidence[0].location == f"{CYCLE0}:{at}"


def test_in_flight_checkpoint_finalized_after_the_fault_and_loaded_fails(
    ref_finalize: Doctor,
) -> None:
    """The tracker got ahead of durability and the replacement loaded it: the restore point is
    still the marker's 4 (not 8, although 8 was finalized before the launcher's detection)."""
    ref_finalize.insert_after(
        CYCLE0,
        "window finalize (",
        "0: [ref] 2026-11-30T15:19:51.150+00:00 rank 0 save completed iteration 8",
    )
    ref_finalize.replace(CYCLE1, "load checkpoint iteration 4 (", "load checkpoint iteration 8 (")
    v = failed(ref_finalize.root, "optimizer_state_load")
    assert v.reason.startswith(
        "cycle 1 loaded iteration 8, the save in flight at the fault (window finalize): the"
        " tracker named it before its finalization"
    )


def test_a_newer_checkpoint_completed_before_the_fault_than_the_marker_names_fails(
    ref_finalize: Doctor,
) -> None:
    at = ref_finalize.insert_before(
        CYCLE0,
        "window finalize (",
        "0: [ref] 2026-11-30T15:19:51.000+00:00 rank 0 save completed iteration 6",
    )
    v = failed(ref_finalize.root, "prior_checkpoint")
    assert v.reason == (
        "window finalize: checkpoint 6 completed at 15:19:51.000, before the fault at"
        " 15:19:51.100, but the marker names 4 as the newest completed checkpoint"
    )
    assert v.evidence[0].location == f"{CYCLE0}:{at}"


def test_finalize_without_the_save_scheduled_fails(ref_finalize: Doctor) -> None:
    ref_finalize.delete(CYCLE0, "save scheduled iteration 8")
    v = failed(ref_finalize.root, "prior_checkpoint")
    assert v.reason == (
        "window finalize: no line of the faulted cycle says save 8 was scheduled by the fault at"
        " 15:19:51.100: it was never submitted"
    )


def test_finalize_scheduled_long_after_the_fault_fails(ref_finalize: Doctor) -> None:
    """Rank 0's scheduled line may trail the fault (ranks are not synchronised there), but not
    by more than the clock slack (1 s)."""
    ref_finalize.replace(
        CYCLE0,
        "2026-11-30T15:19:50.958+00:00 rank 0 save scheduled iteration 8",
        "2026-11-30T15:19:53.000+00:00 rank 0 save scheduled iteration 8",
    )
    v = failed(ref_finalize.root, "prior_checkpoint")
    assert "save 8 was scheduled by the fault at 15:19:51.100 (logged only at 15:19:53.000)" in (
        v.reason
    )


def test_the_in_flight_save_never_completed_after_the_restore_fails(ref_finalize: Doctor) -> None:
    ref_finalize.delete(CYCLE1, "save completed iteration 8")
    v = failed(ref_finalize.root, "progress_past_restore")
    assert v.reason == (
        "the save of iteration 8, in flight at the fault (window finalize), was never completed"
        " after the restore of iteration 4"
    )
    assert v.evidence[0].file == MARKER and "in_flight_iteration" in v.evidence[0].text
    c3 = verdict(ref_finalize.root, "optimizer_state_load")
    assert (
        c3.passed
        and (
            "checkpoints/iter_0000008/ exists at the end of the run and was never completed: the"
            " partial save"
        )
        in c3.reason
    )


def test_in_flight_directory_absent_is_said(ref_finalize: Doctor) -> None:
    ref_finalize.remove("checkpoints/iter_0000008")
    c3 = verdict(ref_finalize.root, "optimizer_state_load")
    assert c3.passed
    assert "checkpoints/iter_0000008/ is not on disk at the end of the run" in c3.reason


def test_requested_window_other_than_the_markers_fails(ref_finalize: Doctor) -> None:
    config = ref_finalize.json(RUN_JSON)["config"]
    config["window"] = "save"
    ref_finalize.set_json(RUN_JSON, config=config)
    v = failed(ref_finalize.root, "prior_checkpoint")
    assert v.reason == (
        "window save: the marker records window finalize but save was requested (run.json)"
    )
    assert [r.file for r in v.evidence] == [MARKER, RUN_JSON]


def test_callers_window_overrides_run_json(ref_finalize: Doctor) -> None:
    v = failed(ref_finalize.root, "prior_checkpoint", expect_window="step")
    assert "the marker records window finalize but step was requested (caller)" in v.reason
    with pytest.raises(ValueError, match="expected window 'later'"):
        judged(ref_finalize.root, expect_window="later")


def test_trigger_of_another_window_fails(ref_finalize: Doctor) -> None:
    ref_finalize.set_json(MARKER, trigger="save submit")
    v = failed(ref_finalize.root, "prior_checkpoint")
    assert v.reason == (
        "window finalize: the marker says save submit fired, not a probe of window finalize"
        " (start_section(checkpointing) or end_section(checkpointing))"
    )


def test_in_flight_not_newer_than_the_tracker_fails(ref_finalize: Doctor) -> None:
    ref_finalize.set_json(MARKER, in_flight_iteration=4)
    v = failed(ref_finalize.root, "prior_checkpoint")
    assert "the marker records tracker iteration 4 and in-flight iteration 4" in v.reason


def test_save_window_without_in_flight_iteration_fails(ref_finalize: Doctor) -> None:
    ref_finalize.set_json(MARKER, in_flight_iteration=None)
    v = failed(ref_finalize.root, "prior_checkpoint")
    assert "window finalize needs a save in flight, but the marker records no" in v.reason


def test_fire_line_that_contradicts_the_marker_fails(ref_finalize: Doctor) -> None:
    ref_finalize.replace(
        CYCLE0, "in-flight iteration 8, tracker 4", "in-flight iteration 12, tracker 4"
    )
    v = failed(ref_finalize.root, "prior_checkpoint")
    assert v.reason == (
        "window finalize: the injector's fire line says window finalize, in-flight iteration 12,"
        " tracker 4; the marker says window finalize, in-flight iteration 8, tracker 4"
    )
    assert v.evidence[0].location == f"{CYCLE0}:{ref_finalize.line_no(CYCLE0, 'iteration 12,')}"


def test_a_second_fire_line_fails_no_repeat_injection(ref_finalize: Doctor) -> None:
    at = ref_finalize.insert_after(
        CYCLE1,
        "save scheduled iteration 8",
        fire_line("finalize", "start_section(checkpointing)", 12, 8, "sending SIGTERM to pid 11363",
                  pid=11363),
    )  # fmt: skip
    v = failed(ref_finalize.root, "no_repeat_injection")
    assert v.reason.startswith("the injector fired 2 times:")
    assert f"{CYCLE1}:{at}" in [r.location for r in v.evidence]


def test_window_requested_but_no_marker_fails(ref_finalize: Doctor) -> None:
    ref_finalize.remove(MARKER)
    v = failed(ref_finalize.root, "prior_checkpoint")
    assert v.reason == (
        "no injection marker: fault term was requested in window finalize (run.json) but it"
        " never happened"
    )


def test_window_requested_but_a_v1_marker_fails(tmp_path: Path) -> None:
    doc = copy_run(REF_TERM, tmp_path / "run")
    config = doc.json(RUN_JSON)["config"]
    config["window"] = "step"
    doc.set_json(RUN_JSON, config=config)
    v = failed(doc.root, "prior_checkpoint")
    assert v.reason == (
        "window step was requested (run.json) but the marker records no window (schema 1: the"
        " legacy tracker trigger, not a window probe)"
    )


# ---------------------------------------------------------------------------------------------
# Windows save and step on the same run (the marker keeps its time: 50.950, between "save
# completed iteration 4" and "save scheduled iteration 8").


def test_save_window_run_passes(tmp_path: Path) -> None:
    doc = as_window_run(
        copy_run(REF_TERM, tmp_path / "run"),
        window="save",
        trigger="save submit",
        in_flight=8,
        section="checkpointing",
    )
    j = judged(doc.root)
    assert_all_pass(j)
    c1 = j.verdict("prior_checkpoint")
    assert (
        "in window save (from run.json): the marker records window save, trigger save submit"
        in c1.reason
    )
    assert "save 8 in flight, tracker 4, save 8 never completed in the faulted cycle" in c1.reason


def test_step_window_run_passes_without_a_save_in_flight(tmp_path: Path) -> None:
    doc = as_window_run(
        copy_run(REF_TERM, tmp_path / "run"),
        window="step",
        trigger="start_section(step)",
        in_flight=None,
        section="step",
    )
    j = judged(doc.root)
    assert_all_pass(j)
    c1 = j.verdict("prior_checkpoint")
    assert c1.reason.endswith(
        "in window step (from run.json): the marker records window step, trigger"
        " start_section(step), section step open; restore point 4"
    )
    assert "in flight" not in j.verdict("optimizer_state_load").reason


def test_window_from_the_marker_when_run_json_names_none(ref_finalize: Doctor) -> None:
    config = ref_finalize.json(RUN_JSON)["config"]
    del config["window"]
    ref_finalize.set_json(RUN_JSON, config=config)
    j = judged(ref_finalize.root)
    assert_all_pass(j)
    assert "in window finalize (from fault_injected.json)" in j.verdict("prior_checkpoint").reason


# ---------------------------------------------------------------------------------------------
# Megatron (2x H200, core_v0.19.0): g2-term-30's fault came at 15:24:11.923, after "scheduled an
# async checkpoint save at iteration 10" (11.870) and "successfully saved checkpoint from
# iteration 5" (11.906): a finalize fault with save 10 in flight, as the marker now says.


def test_megatron_finalize_run_passes(tmp_path: Path) -> None:
    doc = as_window_run(
        copy_run(MEGATRON_TERM, tmp_path / "g2"),
        window="finalize",
        trigger="start_section(checkpointing)",
        in_flight=10,
        section="checkpointing",
    )
    j = judged(doc.root)
    assert_all_pass(j)
    c1 = j.verdict("prior_checkpoint")
    assert "save 10 in flight, tracker 5, save 10 scheduled 0.053 s before the fault" in c1.reason
    scheduled = doc.line_no(CYCLE0, "scheduled an async checkpoint save at iteration      10")
    assert f"{CYCLE0}:{scheduled}" in [r.location for r in c1.evidence]
    c4 = j.verdict("progress_past_restore")
    assert "the in-flight checkpoint 10 saved again at 15:24:56.261 (cycle 1)" in c4.reason
    c3 = j.verdict("optimizer_state_load")
    assert "not the save 10 in flight at the fault (window finalize)" in c3.reason


def test_megatron_load_of_the_in_flight_checkpoint_fails(tmp_path: Path) -> None:
    doc = as_window_run(
        copy_run(MEGATRON_TERM, tmp_path / "g2"),
        window="finalize",
        trigger="start_section(checkpointing)",
        in_flight=10,
        section="checkpointing",
    )
    doc.replace(CYCLE1, "] at iteration 5", "] at iteration 10")
    doc.replace(CYCLE1, "checkpoints at iteration 5", "checkpoints at iteration 10")
    v = failed(doc.root, "optimizer_state_load")
    assert v.reason.startswith("cycle 1 loaded iteration 10, the save in flight at the fault")


# ---------------------------------------------------------------------------------------------
# Fault exception: rank 1 raises InjectedFault and exits 1 (the recorded run's -15 becomes 1 and
# its traceback is added where the fire line is).

TRACEBACK = (
    "1: [rank1]: Traceback (most recent call last):",
    '1: [rank1]:   File "/work/main/pytest_nvrx/injector.py", line 700, in _probe',
    "1: [rank1]:     raise InjectedFault(message)",
    "1: [rank1]: InjectedFault: pytest-nvrx injected exception on rank 1 in window step"
    " (in-flight iteration none, tracker 4)",
)


@pytest.fixture
def ref_exception(tmp_path: Path) -> Doctor:
    doc = as_window_run(
        copy_run(REF_TERM, tmp_path / "ref-exception"),
        window="step",
        trigger="start_section(step)",
        in_flight=None,
        section="step",
        fault="exception",
        signal=None,
        action="raising InjectedFault",
    )
    doc.insert_after(CYCLE0, "raising InjectedFault", *TRACEBACK)
    doc.replace(LAUNCHER, "(exitcode: -15)", "(exitcode: 1)")
    return doc


def test_exception_run_passes(ref_exception: Doctor) -> None:
    j = judged(ref_exception.root)
    assert_all_pass(j)
    c2 = j.verdict("replaced_cycle")
    assert "rank 1 exited 1 of the injected exception in cycle 0" in c2.reason
    raised = ref_exception.line_no(CYCLE0, "InjectedFault: pytest-nvrx")
    assert f"{CYCLE0}:{raised}" in [r.location for r in c2.evidence]


def test_exception_with_a_signal_exit_code_fails(ref_exception: Doctor) -> None:
    ref_exception.replace(LAUNCHER, "(exitcode: 1)", "(exitcode: -15)")
    v = failed(ref_exception.root, "replaced_cycle")
    assert v.reason == (
        "rank 1 failed with exit code -15, not the 1 of an uncaught exception, and no timeout of"
        " section 'step' of that rank was recorded: it did not fail of the injected exception"
    )


def test_exception_whose_rank_was_still_exiting_at_its_section_timeout_passes(
    ref_exception: Doctor,
) -> None:
    """Megatron on the GPU (docs/findings.md): the raising rank had not exited when its
    monitor timed out the step section it raised in; the launcher then killed it."""
    ref_exception.replace(LAUNCHER, "(exitcode: 1)", "(exitcode: -9)")
    ref_exception.insert_before(
        LAUNCHER,
        "(exitcode: -9)",
        "2026-11-30 15:19:51,150 [WARNING] [vm] [workload:?(1) infra:?(?)]"
        " rank_monitor_server.py:522 [Cycle 0] Section 'step' has been open for 30.40 seconds."
        " Timeout is 30.00 seconds.",
    )
    j = judged(ref_exception.root)
    assert_all_pass(j)
    assert "was still shutting down" in j.verdict("replaced_cycle").reason
    ref_exception.replace(LAUNCHER, "Section 'step' has been open", "Section 'x' has been open")
    assert (
        "not the 1 of an uncaught exception" in failed(ref_exception.root, "replaced_cycle").reason
    )


def test_exception_without_its_traceback_fails(ref_exception: Doctor) -> None:
    ref_exception.delete(CYCLE0, "InjectedFault: pytest-nvrx")
    v = failed(ref_exception.root, "replaced_cycle")
    assert v.reason.startswith(
        "logs/train_cycle0.log holds no InjectedFault traceback of rank 1: the injected exception"
    )


def test_exception_of_another_rank_fails(ref_exception: Doctor) -> None:
    ref_exception.replace(CYCLE0, "injected exception on rank 1 ", "injected exception on rank 0 ")
    v = failed(ref_exception.root, "replaced_cycle")
    assert "(only for another rank: InjectedFault: pytest-nvrx injected exception on rank 0" in (
        v.reason
    )


# ---------------------------------------------------------------------------------------------
# Fault ckpt-worker: SIGKILL to rank 1's checkpoint worker (pid 11999) right after save 8 was
# submitted (end_section(checkpointing), 50.990); the rank itself then failed (recorded -15).


@pytest.fixture
def ref_worker(tmp_path: Path) -> Doctor:
    return as_window_run(
        copy_run(REF_TERM, tmp_path / "ref-ckpt-worker"),
        window="finalize",
        trigger="end_section(checkpointing)",
        in_flight=8,
        section=None,
        fault="ckpt-worker",
        time="2026-11-30T15:19:50.990000+00:00",
        after="save scheduled iteration 8",
        action=f"sending SIGKILL to checkpoint worker pid 11999 (rank pid {REF_PID})",
        pid=11999,
        signal="SIGKILL",
    )


def test_ckpt_worker_run_passes_whatever_non_zero_exit_the_rank_had(ref_worker: Doctor) -> None:
    """The rank's -15 is not compared with SIGKILL's -9: the signal went to the worker."""
    j = judged(ref_worker.root)
    assert_all_pass(j)
    c2 = j.verdict("replaced_cycle")
    assert (
        "rank 1 failed with exit code -15 after its checkpoint worker (pid 11999) was killed"
        " in cycle 0"
    ) in c2.reason


def test_ckpt_worker_whose_rank_did_not_fail_fails(ref_worker: Doctor) -> None:
    ref_worker.replace(
        LAUNCHER, "(exitcode: -15) local_rank: 1 (pid: 11290)", "(exitcode: 1) local_rank: 0"
        " (pid: 11289)"
    )  # fmt: skip
    v = failed(ref_worker.root, "replaced_cycle")
    assert v.reason == (
        "the checkpoint worker (pid 11999) of rank 1 (pid 11290) was killed, but the launcher"
        " recorded no failure or section timeout of that rank (only of local_rank 0)"
    )


def test_ckpt_worker_in_another_window_is_an_unusable_marker(ref_worker: Doctor) -> None:
    ref_worker.set_json(MARKER, window="step")
    j = judged(ref_worker.root)
    assert not j.judgeable
    assert "fault 'ckpt-worker' cannot be injected in window 'step'" in j.problems[0].message


# ---------------------------------------------------------------------------------------------
# Fault hang: reference-hang's rank 1 was stopped at 11:53:26.050 and the rank monitor timed out
# its 'step' section. The marker must name the section that timed out.


@pytest.mark.parametrize(
    ("window", "trigger", "in_flight", "section", "passes"),
    [
        ("step", "start_section(step)", None, "step", True),
        ("finalize", "start_section(checkpointing)", 20, "checkpointing", False),
        ("step", "start_section(step)", None, None, False),
    ],
)
def test_hang_is_detected_in_the_section_the_marker_names(
    tmp_path: Path,
    window: str,
    trigger: str,
    in_flight: int | None,
    section: str | None,
    passes: bool,
) -> None:
    doc = as_window_run(
        copy_run(REF_HANG, tmp_path / "hang"),
        window=window,
        trigger=trigger,
        in_flight=in_flight,
        section=section,
    )
    c2 = verdict(doc.root, "replaced_cycle")
    assert c2.passed is passes, c2.render()
    if not passes:
        said = f"section {section!r}" if section else "no section"
        assert c2.reason == (
            f"rank 1 timed out in section 'step', but the marker says {said} was open when it hung"
        )


# ---------------------------------------------------------------------------------------------
# Parsers: the marker's schema 2, run.json's window, the injector's lines.


def _marker(tmp_path: Path, **changes: object) -> Path:
    data = json.loads((REF_TERM / MARKER).read_text())
    data.update(
        schema_version=2,
        window="finalize",
        trigger="start_section(checkpointing)",
        in_flight_iteration=8,
        section="checkpointing",
        write_done=False,
        rank_pid=REF_PID,
    )
    data.update(changes)
    path = tmp_path / MARKER
    path.write_text(json.dumps(data, indent=2))
    return path


def test_marker_schema_2_fields(tmp_path: Path) -> None:
    m = read_marker(_marker(tmp_path), tmp_path)
    assert m is not None and m.ok, m and m.error
    assert (m.schema_version, m.window, m.trigger, m.in_flight_iteration) == (
        2, "finalize", "start_section(checkpointing)", 8
    )  # fmt: skip
    assert (m.section, m.write_done, m.rank_pid, m.rank_process) == (
        "checkpointing", False, REF_PID, REF_PID
    )  # fmt: skip
    assert m.ref("in_flight_iteration").text.strip() == '"in_flight_iteration": 8,'
    worker = read_marker(_marker(tmp_path, fault="ckpt-worker", pid=7), tmp_path)
    assert worker is not None and worker.ok and (worker.pid, worker.rank_process) == (7, REF_PID)
    raised = read_marker(_marker(tmp_path, fault="exception", signal=None), tmp_path)
    assert raised is not None and raised.ok and raised.signal is None


def test_v1_marker_has_no_window(tmp_path: Path) -> None:
    m = read_marker(REF_TERM / MARKER, REF_TERM)
    assert m is not None and m.ok
    assert (m.schema_version, m.window, m.in_flight_iteration, m.trigger) == (1, None, None, None)
    assert m.rank_process == m.pid == REF_PID


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"window": None}, "a schema 2 marker must record its 'window'"),
        ({"window": "later"}, "'window' must be one of step, save, finalize"),
        ({"trigger": "timer"}, "'trigger' must be one of start_section(step), save submit"),
        ({"write_done": "no"}, "'write_done' must be a boolean, not the string 'no'"),
        ({"in_flight_iteration": "8"}, "'in_flight_iteration' must be an integer"),
        ({"rank_pid": 0}, "'rank_pid' must be at least 1, not 0"),
        ({"schema_version": 3}, "'schema_version' 3 is unknown (this reader knows 1 and 2)"),
        (
            {"fault": "ckpt-worker", "window": "save"},
            "fault 'ckpt-worker' cannot be injected in window 'save'",
        ),
    ],
)
def test_bad_schema_2_markers_are_unusable(
    tmp_path: Path, changes: dict[str, object], problem: str
) -> None:
    m = read_marker(_marker(tmp_path, **changes), tmp_path)
    assert m is not None and not m.ok
    assert problem in (m.error or "")


def test_run_json_window(ref_finalize: Doctor) -> None:
    run = load_run(ref_finalize.root)
    assert run.manifest is not None and run.manifest.window is not None
    assert run.manifest.window.value == "finalize"
    assert run.manifest.window.ref.text.strip().rstrip(",") == '"window": "finalize"'
    config = ref_finalize.json(RUN_JSON)["config"]
    config["window"] = "during"
    ref_finalize.set_json(RUN_JSON, config=config)
    bad = load_run(ref_finalize.root)
    assert any(
        "'window' must be one of step, save, finalize, not the string 'during' (in config)"
        in p.message
        for p in bad.fatal_problems
    )


def test_in_flight_checkpoint_metadata_is_read(ref_finalize: Doctor) -> None:
    run = load_run(ref_finalize.root)
    meta = run.checkpoint(8)
    assert meta is not None and meta.dir == "checkpoints/iter_0000008"


def _line(text: str):  # type: ignore[no-untyped-def]
    cursor = LineCursor("logs/train_cycle0.log")
    cursor.lineno, cursor.raw = 7, "1: " + text
    return parse_injector_line(text, cursor)


def test_injector_lines_of_both_schemas() -> None:
    head = f"{INJECTOR} rank 1 pid 42: "
    fired = _line(
        head + "window finalize (start_section(checkpointing)): in-flight iteration 10, tracker"
        " 5; marker /r/fault_injected.json written; sending SIGSTOP to pid 42"
    )
    assert fired is not None and fired.kind == "fired" and not fired.legacy
    assert (fired.window, fired.trigger, fired.in_flight_iteration, fired.tracker_iteration) == (
        "finalize", "start_section(checkpointing)", 10, 5
    )  # fmt: skip
    assert (fired.signal, fired.target_pid, fired.ref.location) == ("SIGSTOP", 42, CYCLE0 + ":7")
    step = _line(
        head + "window step (start_section(step)): in-flight iteration none, tracker 5; marker"
        " /r/m.json written; raising InjectedFault"
    )
    assert step is not None and step.raises and step.in_flight_iteration is None
    assert step.trigger == "start_section(step)" and step.signal is None
    save = _line(
        head + "window save (save submit): in-flight iteration 10, tracker 5; marker /r/m.json"
        " written; sending SIGTERM to pid 42"
    )
    assert save is not None and save.trigger == "save submit"
    worker = _line(
        head + "window finalize (end_section(checkpointing)): in-flight iteration 10, tracker 5;"
        " marker /r/m.json written; sending SIGKILL to checkpoint worker pid 77 (rank pid 42)"
    )
    assert worker is not None and (worker.signal, worker.target_pid) == ("SIGKILL", 77)
    v1 = _line(head + "tracker /c/t.txt advanced 0 -> 5; marker /r/m.json written; sending SIGTERM")
    assert v1 is not None and v1.legacy and (v1.tracker_iteration, v1.signal) == (5, "SIGTERM")
    assert v1.target_pid == 42
    watching = _line(
        head + "watching /c/t.txt (baseline 0) to inject ckpt-worker in window finalize"
    )
    assert watching is not None and (watching.fault, watching.window) == ("ckpt-worker", "finalize")
    old = _line(head + "watching /c/t.txt (baseline 0) to inject kill (SIGKILL) once it advances")
    assert old is not None and old.legacy and old.signal == "SIGKILL"
    skipped = _line(head + "marker /r/m.json exists: fault already injected; running the workload")
    assert skipped is not None and skipped.kind == "skipped"
    assert _line(head + "resumed after SIGSTOP") is None
    assert _line("[ref] 2026-11-30T15:19:50.006+00:00 rank 0 save scheduled iteration 4") is None


def test_cycle_logs_keep_the_injector_lines_of_real_runs() -> None:
    run = load_run(REF_TERM)
    kinds = [(log.cycle, line.kind) for log in run.cycle_logs for line in log.injector]
    assert kinds == [(0, "watching"), (0, "fired"), (1, "skipped")]


def test_verify_reports_the_window(ref_finalize: Doctor, tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    report = tmp_path / "verify.json"
    code = verify_main(
        [str(ref_finalize.root), "--expect-window", "finalize", "--json", str(report)], out, err
    )
    assert code == 0, out.getvalue() + err.getvalue()
    assert (
        "expected fault term (from run.json) in window finalize (from --expect-window)"
        in out.getvalue().splitlines()[0]
    )
    data = json.loads(report.read_text())
    assert data["expected_window"] == {"window": "finalize", "source": "--expect-window"}
    out = io.StringIO()
    assert verify_main([str(ref_finalize.root), "--expect-window", "save"], out, err) == 1
    assert "FAIL prior_checkpoint: window save: the marker records window finalize" in (
        out.getvalue()
    )
