"""The five criteria on the real H200 runs and on doctored copies that must fail one criterion.

Each doctored test asserts *which* evidence made the criterion fail: the reason and the quoted
``file:line`` of the line that proves it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_nvrx.criteria import CRITERIA_IDS, Judgement, Verdict, judge_run_dir
from tests.helpers.doctor import (
    BASELINE_RUN,
    CYCLE0,
    CYCLE1,
    HARNESS_RESULT,
    KILL_RUN,
    LAUNCHER,
    MARKER,
    Doctor,
    copy_run,
    glog_failed,
    nvrx_line,
    profiling_line,
)

# the real run whose replacements died loading their checkpoint (distributed optimizer)
DISTOPT_RUN = Path(__file__).parents[1] / "data" / "gpu-recipe" / "megatron-kill-40-distopt"


def judged(root: Path, expect: str | None = None) -> Judgement:
    return judge_run_dir(root, expect_fault=expect)


def locations(verdict: Verdict) -> list[str]:
    return [ref.location for ref in verdict.evidence]


def failing(root: Path, criterion: str, expect: str | None = None) -> Verdict:
    verdict = judged(root, expect).verdict(criterion)
    assert not verdict.passed, verdict.render()
    assert verdict.status == "FAIL"
    return verdict


@pytest.fixture
def kill(tmp_path: Path) -> Doctor:
    return copy_run(KILL_RUN, tmp_path / "gpu-kill-100")


# ---------------------------------------------------------------------------------------------
# real runs


def test_real_kill_run_passes_all_five_with_quoted_evidence() -> None:
    j = judged(KILL_RUN)
    assert j.passed and j.judgeable
    assert [v.id for v in j.verdicts] == list(CRITERIA_IDS)
    assert all(v.passed and not v.not_applicable for v in j.verdicts)
    assert j.expected.kind == "kill" and j.expected.source == MARKER
    proof = {v.id: locations(v) for v in j.verdicts}
    assert f"{CYCLE0}:1057" in proof["prior_checkpoint"]  # successfully saved ... iteration 5
    assert f"{MARKER}:7" in proof["prior_checkpoint"]  # "tracker_iteration": 5
    assert f"{LAUNCHER}:39" in proof["replaced_cycle"]  # failed (exitcode: -9) local_rank: 0
    assert "cycle_infos/cycle_info..0.1:3" in proof["replaced_cycle"]
    assert (
        f"{CYCLE1}:972" in proof["optimizer_state_load"]
    )  # successfully loaded ... at iteration 5
    assert f"{CYCLE1}:1260" in proof["progress_past_restore"]  # iteration 100/100
    assert f"{LAUNCHER}:62" in proof["no_repeat_injection"]  # Agent .run() is OK


def test_real_kill_run_timings_match_the_recorded_figures() -> None:
    t = judged(KILL_RUN).timings
    # gpu-evidence/README.md: failure → detected 0.28, detected → replacement 4.4,
    # replacement → checkpoint loaded 18.9, → first iteration after restore 20.1
    assert t["failure_to_detected_s"] == pytest.approx(0.281, abs=0.001)
    assert t["detected_to_replacement_start_s"] == pytest.approx(4.368, abs=0.001)
    assert t["replacement_start_to_checkpoint_loaded_s"] == pytest.approx(18.878, abs=0.001)
    assert t["replacement_start_to_first_iteration_s"] == pytest.approx(20.069, abs=0.001)
    assert t["whole_run_s"] > 90


@pytest.mark.parametrize("expect", [None, "kill", "hang"])
def test_real_baseline_judged_as_fault_run_fails(expect: str | None) -> None:
    j = judged(BASELINE_RUN, expect)
    assert not j.passed
    c1 = j.verdict("prior_checkpoint")
    assert not c1.passed and "no injection marker" in c1.reason
    assert c1.evidence[0].render().startswith(f"{MARKER}: (absent")
    assert not j.verdict("no_repeat_injection").passed
    assert not j.verdict("replaced_cycle").passed


def test_real_baseline_judged_as_baseline_passes() -> None:
    j = judged(BASELINE_RUN, "none")
    assert j.passed
    na = {v.id for v in j.verdicts if v.not_applicable}
    assert na == {
        "prior_checkpoint",
        "replaced_cycle",
        "optimizer_state_load",
        "training_continuity",
    }
    c4 = j.verdict("progress_past_restore")
    assert "final iteration 20" in c4.reason and not c4.not_applicable
    assert j.verdict("no_repeat_injection").passed


def test_baseline_from_run_json_and_a_marker_in_it_fails(tmp_path: Path) -> None:
    base = copy_run(BASELINE_RUN, tmp_path / "b")
    # made as our harness makes a run: run.json, and result.json at its end
    base.set_json("run.json", schema=1, config={"fault": "none", "train_iters": 20})
    base.set_json("result.json", **HARNESS_RESULT)
    assert judged(base.root).passed
    assert judged(base.root).expected.source == "run.json"
    base.set_json(MARKER, fault="kill", rank=0, time="2026-11-29T10:54:52+00:00")
    v = failing(base.root, "no_repeat_injection")
    assert "baseline run (fault=none) has an injection marker" in v.reason


def test_kill_run_judged_as_baseline_fails() -> None:
    v = failing(KILL_RUN, "no_repeat_injection", expect="none")
    assert "injection marker" in v.reason


# ---------------------------------------------------------------------------------------------
# 1. prior_checkpoint


def test_prior_checkpoint_fails_without_marker(kill: Doctor) -> None:
    kill.remove(MARKER)
    v = failing(kill.root, "prior_checkpoint")
    assert "no injection marker" in v.reason and "never happened" in v.reason
    assert v.evidence[0].location == MARKER and v.evidence[0].line is None


def test_prior_checkpoint_fails_when_marker_tracker_never_advanced(kill: Doctor) -> None:
    kill.set_json(MARKER, tracker_iteration=0)
    v = failing(kill.root, "prior_checkpoint")
    assert "tracker iteration 0" in v.reason and "before any checkpoint completed" in v.reason
    line = kill.line_no(MARKER, '"tracker_iteration": 0')
    assert f"{MARKER}:{line}" in locations(v)


def test_prior_checkpoint_fails_when_save_was_only_scheduled(kill: Doctor) -> None:
    # the fault came before any checkpoint was finalized: only the scheduling line is left
    kill.delete(CYCLE0, "successfully saved checkpoint from iteration       5")
    v = failing(kill.root, "prior_checkpoint")
    assert "only scheduled" in v.reason and "never finalized" in v.reason
    scheduled = kill.line_no(CYCLE0, "scheduled an async checkpoint save at iteration       5")
    assert f"{CYCLE0}:{scheduled}" in locations(v)


def test_prior_checkpoint_fails_when_finalized_after_the_failure(kill: Doctor) -> None:
    kill.replace(
        CYCLE0, "[2026-11-29 11:03:55.958385] successfully", "[2026-11-29 11:03:57.5] successfully"
    )
    v = failing(kill.root, "prior_checkpoint")
    assert "finalized only at 11:03:57.500, after the failure" in v.reason
    assert f"{CYCLE0}:1057" in locations(v)


def test_prior_checkpoint_fails_when_marker_records_another_fault(kill: Doctor) -> None:
    kill.set_json("run.json", schema=1, config={"fault": "kill", "train_iters": 100})
    kill.set_json(MARKER, fault="hang", signal="SIGSTOP")
    v = failing(kill.root, "prior_checkpoint")
    assert "marker records fault 'hang' but 'kill' was expected (run.json)" in v.reason
    assert f"{MARKER}:{kill.line_no(MARKER, '"fault": "hang"')}" in locations(v)


def test_prior_checkpoint_fails_on_an_unusable_marker(kill: Doctor) -> None:
    kill.path(MARKER).write_bytes(b'{"fault": "kill", "rank": 0, \xff truncated')
    j = judged(kill.root)
    assert not j.judgeable and not j.passed
    v = j.verdict("prior_checkpoint")
    assert not v.passed and "unusable" in v.reason and "not UTF-8" in v.reason


# ---------------------------------------------------------------------------------------------
# 2. replaced_cycle


def test_replaced_cycle_fails_without_replacement_cycle_record(kill: Doctor) -> None:
    kill.remove("cycle_infos/cycle_info..0.1")
    v = failing(kill.root, "replaced_cycle")
    assert "no replacement cycle record after the failure of cycle 0" in v.reason
    assert "cycles: 0)" in v.reason
    assert "cycle_infos/cycle_info..0.0:2" in locations(v)


def test_replaced_cycle_fails_without_replacement_log(kill: Doctor) -> None:
    kill.remove(CYCLE1)
    v = failing(kill.root, "replaced_cycle")
    assert "replacement cycle 1 has no application log" in v.reason
    assert CYCLE1 in locations(v)


def test_replaced_cycle_fails_without_cycle_infos(kill: Doctor) -> None:
    kill.remove("cycle_infos")
    v = failing(kill.root, "replaced_cycle")
    assert "cycle_infos/ is missing" in v.reason


def test_replaced_cycle_fails_when_marker_claims_a_rank_outside_the_world(kill: Doctor) -> None:
    kill.set_json(MARKER, rank=1)
    v = failing(kill.root, "replaced_cycle")
    assert "marker claims rank 1" in v.reason and "world of 1 rank" in v.reason
    assert f"{MARKER}:{kill.line_no(MARKER, '"rank": 1')}" in locations(v)


def test_replaced_cycle_fails_when_marker_claims_another_local_rank(kill: Doctor) -> None:
    kill.replace(LAUNCHER, "Using nproc_per_node=1.", "Using nproc_per_node=2.")
    kill.replace(LAUNCHER, "  nproc_per_node   : 1", "  nproc_per_node   : 2")
    kill.set_json(MARKER, rank=1)
    v = failing(kill.root, "replaced_cycle")
    assert "failure of local_rank 0 (pid 585), but the marker claims rank 1" in v.reason
    assert f"{LAUNCHER}:39" in locations(v)


def test_replaced_cycle_fails_when_marker_pid_is_not_the_failed_process(kill: Doctor) -> None:
    kill.set_json(MARKER, pid=4242)
    v = failing(kill.root, "replaced_cycle")
    assert "(pid 585), but the marker claims rank 0 (pid 4242)" in v.reason


def test_replaced_cycle_fails_when_launcher_recorded_no_failure(kill: Doctor) -> None:
    for needle in ("failed (exitcode", "failure_detected", "Worker group FAILED"):
        kill.delete(LAUNCHER, needle)
    v = failing(kill.root, "replaced_cycle")
    assert "recorded no worker failure at or after the fault (11:03:55.960)" in v.reason
    assert f"{MARKER}:9" in locations(v)


def test_replaced_cycle_fails_when_the_worker_died_of_something_else(kill: Doctor) -> None:
    kill.replace(LAUNCHER, "(exitcode: -9)", "(exitcode: 1)")
    v = failing(kill.root, "replaced_cycle")
    assert "exit code 1, not the -9 that SIGKILL gives" in v.reason
    assert f"{LAUNCHER}:39" in locations(v)


def test_replaced_cycle_fails_without_a_restart_decision(kill: Doctor) -> None:
    kill.delete(LAUNCHER, "will restart worker group")
    v = failing(kill.root, "replaced_cycle")
    assert "no decision to restart" in v.reason


TIMEOUT_MSG = "[Cycle 0] Section 'step' has been open for 30.24 seconds. Timeout is 30.00 seconds."


def _as_hang(kill: Doctor, timeout_local_rank: str | None) -> None:
    kill.set_json(MARKER, fault="hang", signal="SIGSTOP")
    if timeout_local_rank is not None:
        line = nvrx_line("11:03:56,100", TIMEOUT_MSG, "WARNING", local=timeout_local_rank)
        kill.insert_before(LAUNCHER, "failed (exitcode: -9)", line)


def test_replaced_cycle_hang_passes_with_section_timeout_for_the_rank(kill: Doctor) -> None:
    _as_hang(kill, "0")
    j = judged(kill.root)
    v = j.verdict("replaced_cycle")
    assert v.passed, v.render()
    assert "timed out in section 'step'" in v.reason
    assert f"{LAUNCHER}:39" in locations(v)  # the inserted timeout line
    assert j.passed


def test_replaced_cycle_hang_fails_without_section_timeout(kill: Doctor) -> None:
    _as_hang(kill, None)
    v = failing(kill.root, "replaced_cycle")
    assert "no section-timeout message for rank 0: the hang was not detected" in v.reason


def test_replaced_cycle_hang_fails_when_timeout_names_another_rank(kill: Doctor) -> None:
    _as_hang(kill, "3")
    v = failing(kill.root, "replaced_cycle")
    assert "names local rank 3, but the marker claims rank 0" in v.reason
    assert f"{LAUNCHER}:39" in locations(v)


# ---------------------------------------------------------------------------------------------
# 3. optimizer_state_load

LOADING = "loading distributed checkpoint from"
LOADED = "successfully loaded checkpoint from"


def test_optimizer_state_load_fails_when_replacement_starts_from_random(kill: Doctor) -> None:
    kill.delete(CYCLE1, LOADING)
    kill.insert_after(
        CYCLE1,
        LOADED,
        "0: WARNING: could not find the metadata file /x/latest_checkpointed_iteration.txt",
        "0:     will not load any checkpoints and will start from random",
    )
    kill.delete(CYCLE1, LOADED)
    v = failing(kill.root, "optimizer_state_load")
    assert "found no checkpoint and started from random initialization" in v.reason
    assert f"{CYCLE1}:{kill.line_no(CYCLE1, 'will start from random')}" in locations(v)


def test_optimizer_state_load_fails_on_loading_an_in_flight_checkpoint(kill: Doctor) -> None:
    # iteration 10 was scheduled in cycle 0 but never finalized before the kill
    kill.replace(CYCLE1, "checkpoints at iteration 5", "checkpoints at iteration 10")
    kill.replace(CYCLE1, "p 1/1 ] at iteration 5", "p 1/1 ] at iteration 10")
    v = failing(kill.root, "optimizer_state_load")
    assert "loaded iteration 10, a save only scheduled before the failure" in v.reason
    assert "in flight" in v.reason and "newest completed checkpoint was 5" in v.reason
    assert f"{CYCLE0}:1053" in locations(v)  # scheduled an async checkpoint save at iteration 10
    assert f"{CYCLE1}:972" in locations(v)


def test_optimizer_state_load_fails_on_unable_to_load_optimizer(kill: Doctor) -> None:
    at = kill.insert_after(
        CYCLE1,
        LOADING,
        "0: Unable to load optimizer from checkpoint /x/iter_0000005. Specify --no-load-optim "
        "or --finetune to prevent attempting to load the optimizer state, exiting ...",
    )
    v = failing(kill.root, "optimizer_state_load")
    assert "could not restore its state: 0: Unable to load optimizer" in v.reason
    assert v.evidence[0].location == f"{CYCLE1}:{at}"


def test_optimizer_state_load_fails_on_unable_to_load_rng(kill: Doctor) -> None:
    at = kill.insert_after(CYCLE1, LOADING, "0: Unable to load rng state from checkpoint /x.")
    v = failing(kill.root, "optimizer_state_load")
    assert v.evidence[0].location == f"{CYCLE1}:{at}" and "rng" in v.reason


def _real_traceback(first: int = 955, last: int = 989) -> list[str]:
    """The replacement's death on the distributed-optimizer run (tests/data/gpu-recipe), as the
    device logged it: lines 955-989 of its cycle 1 log."""
    lines = (DISTOPT_RUN / CYCLE1).read_text(encoding="utf-8").splitlines()
    assert lines[first - 1].endswith("Traceback (most recent call last):")
    assert lines[last - 1] == "0: [rank0]: AssertionError"
    return lines[first - 1 : last]


def test_optimizer_state_load_fails_on_a_load_traceback(kill: Doctor) -> None:
    # the distributed optimizer's assert on the stack without TE/Apex, transplanted where the
    # kill run's replacement loaded its checkpoint
    kill.delete(CYCLE1, LOADED)
    at = kill.insert_after(CYCLE1, LOADING, *_real_traceback())
    v = failing(kill.root, "optimizer_state_load")
    assert v.reason == (
        "cycle 1 died loading checkpoint iteration 5: AssertionError at"
        " megatron/core/optimizer/distrib_optimizer.py:839 (assert len(steps) == 1)"
    )
    # the load_checkpoint frame, the innermost frame, its source line, the exception, the load
    assert locations(v) == [
        f"{CYCLE1}:{at + 19}",
        f"{CYCLE1}:{at + 31}",
        f"{CYCLE1}:{at + 32}",
        f"{CYCLE1}:{at + 34}",
        f"{CYCLE1}:953",
    ]
    assert "in load_checkpoint" in v.evidence[0].text
    assert v.evidence[2].text.endswith("assert len(steps) == 1")


def test_optimizer_state_load_names_an_error_after_the_load_completed(kill: Doctor) -> None:
    at = kill.insert_after(
        CYCLE1,
        LOADED,
        "0: [rank0]: Traceback (most recent call last):",
        '0: [rank0]:   File "/x/Megatron-LM/megatron/training/training.py", line 2210, in setup',
        "0: [rank0]:     torch.cuda.synchronize()",
        '0: [rank0]:   File "/venv/lib/python3.12/site-packages/torch/cuda/__init__.py", line'
        " 1097, in synchronize",
        "0: [rank0]:     return torch._C._cuda_synchronize()",
        "0: [rank0]:            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        "0: [rank0]: RuntimeError: CUDA error: an illegal memory access was encountered",
    )
    v = failing(kill.root, "optimizer_state_load")
    assert v.reason == (
        "error while cycle 1 restored: RuntimeError: CUDA error: an illegal memory access was"
        " encountered at torch/cuda/__init__.py:1097 (return torch._C._cuda_synchronize())"
    )
    # no checkpoint-load frame in this traceback: innermost frame, source, exception, the load
    assert locations(v) == [
        f"{CYCLE1}:{at + 3}",
        f"{CYCLE1}:{at + 4}",
        f"{CYCLE1}:{at + 6}",
        f"{CYCLE1}:972",
    ]


def test_optimizer_state_load_fails_on_a_death_before_any_load(kill: Doctor) -> None:
    kill.delete(CYCLE1, LOADING)
    kill.delete(CYCLE1, LOADED)
    at = kill.insert_after(
        CYCLE1,
        "[after dataloaders are built]",
        "0: Traceback (most recent call last):",
        '0:   File "/x/Megatron-LM/pretrain_gpt.py", line 523, in <module>',
        "0:     pretrain(",
        "0: torch.OutOfMemoryError: CUDA out of memory.",
    )
    v = failing(kill.root, "optimizer_state_load")
    assert v.reason == (
        "cycle 1 failed before loading any checkpoint: torch.OutOfMemoryError: CUDA out of"
        " memory. at /x/Megatron-LM/pretrain_gpt.py:523 (pretrain()"
    )
    assert locations(v) == [f"{CYCLE1}:{at + 1}", f"{CYCLE1}:{at + 2}", f"{CYCLE1}:{at + 3}"]


def test_optimizer_state_load_fails_when_load_never_finished(kill: Doctor) -> None:
    kill.delete(CYCLE1, LOADED)
    v = failing(kill.root, "optimizer_state_load")
    assert "began loading iteration 5 but never finished" in v.reason
    assert f"{CYCLE1}:953" in locations(v)


def test_optimizer_state_load_fails_when_an_older_checkpoint_is_loaded(kill: Doctor) -> None:
    kill.append(
        CYCLE0,
        "0:   [2026-11-29 11:03:55.959000] successfully saved checkpoint from iteration      10"
        " to /x [ t 1/1, gtp_remat 1/1, p 1/1 ]",
    )
    v = failing(kill.root, "optimizer_state_load")
    assert "older than the newest checkpoint completed before the failure (10)" in v.reason
    assert f"{CYCLE0}:1058" in locations(v)


def test_optimizer_state_load_fails_when_training_restarts_from_one(kill: Doctor) -> None:
    kill.replace(CYCLE1, "iteration        6/     100", "iteration        1/     100")
    v = failing(kill.root, "optimizer_state_load")
    assert "loaded iteration 5 but then trained iteration 1" in v.reason
    assert f"{CYCLE1}:1010" in locations(v)


# ---------------------------------------------------------------------------------------------
# 4. progress_past_restore


def test_progress_fails_when_run_stopped_before_final_iteration(kill: Doctor) -> None:
    kill.truncate_after(CYCLE1, "iteration       57/     100")
    v = failing(kill.root, "progress_past_restore")
    assert "stopped at iteration 57, before the final iteration 100" in v.reason
    assert v.evidence[0].location == f"{CYCLE1}:{kill.line_no(CYCLE1, 'iteration       57/')}"


def test_progress_fails_when_final_iteration_from_run_json_not_reached(kill: Doctor) -> None:
    kill.truncate_after(CYCLE1, "iteration       60/")
    kill.set_json("run.json", schema=1, config={"fault": "kill", "train_iters": 100})
    v = failing(kill.root, "progress_past_restore")
    assert "stopped at iteration 60, before the final iteration 100 (from run.json)" in v.reason
    assert "run.json:" in " ".join(locations(v))


def test_progress_fails_when_the_lines_count_other_iterations_than_run_json(kill: Doctor) -> None:
    kill.set_json("run.json", schema=1, config={"fault": "kill", "train_iters": 200})
    v = failing(kill.root, "progress_past_restore")
    assert (
        v.reason == "cycle 0 was started to train 100 iterations, but the run trains 200 (run.json)"
    )


def test_progress_fails_without_a_later_completed_checkpoint(kill: Doctor) -> None:
    kill.delete(CYCLE1, "successfully saved checkpoint")
    v = failing(kill.root, "progress_past_restore")
    assert "no checkpoint beyond iteration 5 completed after the restore" in v.reason
    assert "scheduled but never finalized" in v.reason
    first_scheduled = kill.line_no(
        CYCLE1, "scheduled an async checkpoint save at iteration      10"
    )
    assert f"{CYCLE1}:{first_scheduled}" in locations(v)


def test_progress_names_the_load_death_when_nothing_trained(kill: Doctor) -> None:
    kill.delete(CYCLE1, LOADED)
    at = kill.insert_after(CYCLE1, LOADING, *_real_traceback())
    kill.truncate_after(CYCLE1, "[rank0]: AssertionError")
    v = failing(kill.root, "progress_past_restore")
    assert v.reason == (
        "no iteration was committed after the restore: cycle 1 died loading checkpoint"
        " iteration 5: AssertionError at megatron/core/optimizer/distrib_optimizer.py:839"
    )
    assert locations(v) == [f"{CYCLE1}:{at + 34}"]


def test_progress_fails_without_iterations_after_restore(kill: Doctor) -> None:
    kill.truncate_after(CYCLE1, LOADED)
    v = failing(kill.root, "progress_past_restore")
    assert "no iteration beyond iteration 5 was committed" in v.reason
    assert f"{CYCLE1}:972" in locations(v)


# ---------------------------------------------------------------------------------------------
# 5. no_repeat_injection


def test_no_repeat_fails_on_a_no_progress_stop(kill: Doctor) -> None:
    kill.delete(LAUNCHER, "worker group successfully finished")
    kill.delete(LAUNCHER, "Agent .run() is OK")
    at = kill.append(
        LAUNCHER,
        nvrx_line(
            "11:04:50,100",
            "EARLY TERMINATION: 2 consecutive training cycles without progress (threshold: 2). "
            "Training stuck at iteration ~5.",
            "ERROR",
        ),
        nvrx_line(
            "11:04:50,200",
            "NVRx decided the job must not be restarted (no_progress): Progress tracker detected"
            " no progress across restarts.. Agent's exit code = 93",
            "ERROR",
        ),
    )
    v = failing(kill.root, "no_repeat_injection")
    assert "no-progress stop" in v.reason and "EARLY TERMINATION" in v.reason
    assert locations(v)[:2] == [f"{LAUNCHER}:{at}", f"{LAUNCHER}:{at + 1}"]
    assert judged(kill.root).verdict("progress_past_restore").passed  # targeted


def test_no_repeat_fails_on_exit_code_93_in_result_json(kill: Doctor) -> None:
    kill.set_json("result.json", exit_code=93, start_time="2026-11-29T11:03:10Z")
    v = failing(kill.root, "no_repeat_injection")
    assert "launcher exited with code 93 (no-progress stop)" in v.reason
    assert v.evidence[0].location.startswith("result.json:")


def test_no_repeat_fails_on_a_second_failure_after_replacement(kill: Doctor) -> None:
    at = kill.insert_after(
        LAUNCHER,
        "Updated num_warmup_iterations to 0 from client",
        glog_failed("11:04:30.000000", 0, 901),
        profiling_line("11:04:30,010", 2, "failure_detected"),
        nth=1,
    )
    v = failing(kill.root, "no_repeat_injection")
    assert "a second failure after the replacement started" in v.reason
    assert "exitcode: -9" in v.reason
    assert locations(v)[:2] == [f"{LAUNCHER}:{at}", f"{LAUNCHER}:{at + 1}"]


def test_no_repeat_fails_on_a_further_cycle(kill: Doctor) -> None:
    record = kill.json("cycle_infos/cycle_info..0.1")
    record.update(cycle_number=2, cycle_start_time="2026-11-29T11:04:45Z")
    kill.set_json("cycle_infos/cycle_info..0.2", **record)
    v = failing(kill.root, "no_repeat_injection")
    assert "started cycle 2 after the replacement cycle 1" in v.reason
    assert "cycle_infos/cycle_info..0.2:" in locations(v)[0]


def test_no_repeat_fails_without_successful_finish(kill: Doctor) -> None:
    kill.delete(LAUNCHER, "worker group successfully finished")
    kill.delete(LAUNCHER, "Agent .run() is OK")
    v = failing(kill.root, "no_repeat_injection")
    assert "no successful finish" in v.reason
    assert v.evidence[0].location == f"{LAUNCHER}:{kill.line_no(LAUNCHER, 'Store host waiting')}"


def test_no_repeat_fails_without_injection(kill: Doctor) -> None:
    kill.remove(MARKER)
    v = failing(kill.root, "no_repeat_injection")
    assert "no injection happened" in v.reason


# ---------------------------------------------------------------------------------------------
# all criteria stay workload-agnostic and location-independent


def test_verdicts_do_not_depend_on_where_the_run_dir_lives(tmp_path: Path) -> None:
    moved = copy_run(KILL_RUN, tmp_path / "somewhere" / "else" / "renamed")
    a = judged(KILL_RUN)
    b = judged(moved.root)
    assert [v.as_dict() for v in a.verdicts] == [v.as_dict() for v in b.verdicts]


def test_every_verdict_has_evidence() -> None:
    with pytest.raises(ValueError, match="no evidence"):
        Verdict("prior_checkpoint", True, "trust me", ())


# ---------------------------------------------------------------------------------------------
# launcher-level criteria on the recorded CPU reference runs (2 ranks; a real SIGSTOP hang)

CPU_DATA = Path(__file__).parents[1] / "data" / "cpu"


@pytest.mark.skipif(not CPU_DATA.is_dir(), reason="no recorded CPU runs")
@pytest.mark.parametrize(
    ("name", "how", "proof"),
    [
        ("reference-hang", "rank 1 timed out in section 'step'", f"{LAUNCHER}:46"),
        ("reference-kill", "rank 1 failed with exit code -9", None),
    ],
)
def test_launcher_criteria_on_real_two_rank_cpu_runs(
    name: str, how: str, proof: str | None
) -> None:
    from pytest_nvrx.criteria import judge
    from pytest_nvrx.evidence import load_run

    j = judge(load_run(CPU_DATA / name))
    c2 = j.verdict("replaced_cycle")
    assert c2.passed and how in c2.reason, c2.render()
    if proof is not None:
        # the hung rank's own monitor line, although both monitors timed out and torchelastic
        # reported rank 0 dying first
        assert c2.evidence[0].location == proof
    assert j.verdict("no_repeat_injection").passed
