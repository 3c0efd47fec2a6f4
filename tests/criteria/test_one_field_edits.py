"""One-field edits of a committed real passing run that an adversarial sweep found still passing
(R = a copy of tests/data/windows/cpu/ref-kill-save): each contradicts the rest of the evidence,
so the run cannot be judged (exit 2), the error naming the line and why. One test per edit; each
failed (the run passed) before the check it names existed.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import CYCLE0, CYCLE1, LAUNCHER, MARKER, Doctor, copy_run

DATA = Path(__file__).parents[1] / "data"
REF_KILL_SAVE = DATA / "windows" / "cpu" / "ref-kill-save"
G2_BASELINE = DATA / "windows" / "gpu" / "g2-baseline"
RECORD0 = "cycle_infos/cycle_info..0.0"
RECORD1 = "cycle_infos/cycle_info..0.1"
RUN_JSON = "run.json"
RESULT = "result.json"
TRACKER = "checkpoints/latest_checkpointed_iteration.txt"


@pytest.fixture
def ref(tmp_path: Path) -> Doctor:
    return copy_run(REF_KILL_SAVE, tmp_path / "ref")


def _cannot_judge(run: Doctor, *said: str) -> str:
    """The run cannot be judged (exit 2), its errors naming each of ``said``."""
    judgement = judge_run_dir(run.root)
    assert not judgement.judgeable and not judgement.passed
    assert all(not v.passed or v.not_applicable for v in judgement.verdicts)
    out, err = io.StringIO(), io.StringIO()
    code = verify_main([str(run.root)], out, err)
    text = out.getvalue() + err.getvalue()
    assert code == 2, text
    for part in said:
        assert part in text, text
    return text


def _at(run: Doctor, rel: str, needle: str) -> str:
    return f"{rel}:{run.line_no(rel, needle)}"


def test_the_unchanged_run_passes(ref: Doctor) -> None:
    assert judge_run_dir(ref.root).passed


# 1. a profiling event's own UTC stamp against its line's stamp (clocks._profiling_disagrees)


def test_a_profiling_utc_stamp_an_hour_off_its_line_cannot_be_judged(ref: Doctor) -> None:
    at = _at(ref, LAUNCHER, "Time: 2026-11-30 16:22:11.249 UTC")
    ref.replace(LAUNCHER, "Time: 2026-11-30 16:22:11.249 UTC", "Time: 2026-11-30 17:22:11.249 UTC")
    _cannot_judge(
        ref,
        f"{at}: the failure_detected event says it happened at 2026-11-30 17:22:11.249 UTC, but"
        " its line is stamped 2026-11-30 16:22:11.249 UTC (read in UTC+00:00",
    )


def test_a_profiling_utc_stamp_a_day_back_cannot_be_judged(ref: Doctor) -> None:
    old = "worker_start_completed Node: localhost_519_0 Rank: 0 Time: 2026-11-30 16:22:13.642"
    at = _at(ref, LAUNCHER, old)
    ref.replace(LAUNCHER, old, old.replace("2026-11-30", "2026-11-29"))
    _cannot_judge(ref, f"{at}: the worker_start_completed event says it happened at 2026-11-29")


# 2. every launcher line inside the launch (clocks._records_out_of_order)


def test_a_glog_line_an_hour_late_cannot_be_judged(ref: Doctor) -> None:
    at = _at(ref, LAUNCHER, "E1130 16:22:11.247000")
    ref.replace(LAUNCHER, "E1130 16:22:11.247000", "E1130 17:22:11.247000")
    _cannot_judge(
        ref,
        f"{at} (the launcher's latest stamp) is stamped 2026-11-30 17:22:11.247, outside the"
        " launch",
    )


def test_a_launcher_line_of_another_century_cannot_be_judged(ref: Doctor) -> None:
    at = _at(ref, LAUNCHER, "2026-11-30 16:22:23,960")
    ref.replace(LAUNCHER, "2026-11-30 16:22:23,960", "2100-11-30 16:22:23,960")
    _cannot_judge(ref, f"{at} (the launcher's latest stamp) is stamped 2100-11-30 16:22:23.960")


# 3. a cycle's lines after that cycle's end (clocks._after_its_cycle)


def test_cycle_lines_stamped_after_the_cycle_ended_cannot_be_judged(ref: Doctor) -> None:
    ref.replace(CYCLE1, "+00:00 rank", "-00:01 rank")
    # the latest stamped line: rank 0's exit (its stamp read since adv9's H3)
    last = _at(ref, CYCLE1, "rank 0 exit code 0")
    _cannot_judge(
        ref,
        f"{last} is stamped 2026-11-30 16:23:21.498, after the launcher ended cycle 1 at"
        f" {RECORD1}:",
    )


def test_cycle_lines_stamped_after_the_launch_ended_cannot_be_judged(ref: Doctor) -> None:
    """The last cycle's record carries no end (removed): result.json's end still bounds it."""
    data = ref.json(RECORD1)
    del data["cycle_end_time"]
    ref.path(RECORD1).write_text(json.dumps(data, indent=2) + "\n")
    ref.replace(CYCLE1, "+00:00 rank", "-00:01 rank")
    _cannot_judge(ref, "after the launch ended at result.json:")


# 4. cycle records as NVRx writes them (cycle_infos._unlike_nvrx, _gaps, _unended;
#    consistency._last_cycle_unended)


def _drop_key(run: Doctor, rel: str, key: str) -> None:
    data = run.json(rel)
    del data[key]
    run.path(rel).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def test_a_cycle_record_without_its_start_cannot_be_judged(ref: Doctor) -> None:
    _drop_key(ref, RECORD1, "cycle_start_time")
    _cannot_judge(ref, f"cycle record {RECORD1} has no cycle_start_time: NVRx writes it")


def test_a_cycle_record_without_its_end_before_a_later_cycle_cannot_be_judged(
    ref: Doctor,
) -> None:
    _drop_key(ref, RECORD0, "cycle_end_time")
    _cannot_judge(ref, f"{RECORD0} has no cycle_end_time, but {RECORD1} records the next cycle")


def test_the_last_cycle_record_without_its_end_of_a_run_that_ended_cannot_be_judged(
    ref: Doctor,
) -> None:
    _drop_key(ref, RECORD1, "cycle_end_time")
    _cannot_judge(
        ref,
        f"{RECORD1} has no cycle_end_time, but {RESULT}:2 says the launcher exited with code 0",
    )


def test_a_gap_in_the_cycle_records_cannot_be_judged(ref: Doctor) -> None:
    ref.remove(RECORD0)
    _cannot_judge(ref, f"{RECORD1} records cycle 1 of attempt 0, but no record of cycle 0 exists")


def test_a_cycle_record_of_another_job_cannot_be_judged(ref: Doctor) -> None:
    ref.set_json(RECORD1, job_id="4242")
    _cannot_judge(ref, f"cycle record {RECORD1}: job_id is the string '4242' ({RECORD1}:")


@pytest.mark.parametrize("value", ["", None, 7])
def test_a_cycle_record_naming_no_log_cannot_be_judged(ref: Doctor, value: object) -> None:
    ref.set_json(RECORD1, cycle_log_file=value)
    _cannot_judge(ref, f"cycle record {RECORD1} has cycle_log_file ")


# 5. run.json against itself (manifest_contradictions._contradictions)


def _edit_run_json(run: Doctor, edit: object) -> None:
    data = run.json(RUN_JSON)
    assert callable(edit)
    edit(data)
    run.path(RUN_JSON).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _argv_replace(key: str, old: str, new: str) -> object:
    def edit(data: dict[str, object]) -> None:
        argv = data[key]
        assert isinstance(argv, list) and old in argv
        argv[argv.index(old)] = new

    return edit


def test_a_top_level_key_other_than_configs_cannot_be_judged(ref: Doctor) -> None:
    ref.set_json(RUN_JSON, run_id="other")
    top, inner = _at(ref, RUN_JSON, '"run_id": "other"'), _at(ref, RUN_JSON, '"run_id": "ks1"')
    _cannot_judge(ref, f'{top} says run_id "other", but {inner} (config.run_id) says "ks1"')


def test_a_top_level_fault_other_than_configs_cannot_be_judged(ref: Doctor) -> None:
    ref.set_json(RUN_JSON, fault="hang")
    _cannot_judge(ref, 'says fault "hang", but run.json:', '(config.fault) says "kill"')


@pytest.mark.parametrize(
    ("key", "old", "new", "said"),
    [
        ("workload_argv", "--train-iters=20", "--train-iters=30", "--train-iters '30'"),
        ("workload_argv", "--save-interval=5", "--save-interval=4", "--save-interval '4'"),
        ("launcher_argv", "--nproc-per-node=2", "--nproc-per-node=3", "--nproc-per-node '3'"),
        ("launcher_argv", "--nnodes=1", "--nnodes=2", "--nnodes '2'"),
    ],
)
def test_an_argv_option_other_than_configs_cannot_be_judged(
    ref: Doctor, key: str, old: str, new: str, said: str
) -> None:
    _edit_run_json(ref, _argv_replace(key, old, new))
    _cannot_judge(ref, f"{_at(ref, RUN_JSON, key)} passes {said}, but run.json:")


def test_a_world_size_other_than_nodes_times_gpus_cannot_be_judged(tmp_path: Path) -> None:
    """On a baseline (no marker: a fault run's marker records its world size already)."""
    run = copy_run(G2_BASELINE, tmp_path / "base")

    def edit(data: dict[str, object]) -> None:
        config = data["config"]
        assert isinstance(config, dict) and config["world_size"] == 2
        config["world_size"] = 4

    _edit_run_json(run, edit)
    _cannot_judge(
        run,
        f"{_at(run, RUN_JSON, '"world_size": 4')} says world_size 4, but",
        "say 1 node(s) of 2 GPU(s): 2 rank(s): run.json contradicts itself",
    )


# 6. the marker against itself and run.json (marker.read_marker; marker_agreement)


@pytest.mark.parametrize(
    "key", ["window", "trigger", "in_flight_iteration", "section", "write_done", "rank_pid"]
)
def test_a_schema_1_marker_with_a_schema_2_field_cannot_be_judged(tmp_path: Path, key: str) -> None:
    """Schema 1 with every schema-2 field but one removed: the one left still says schema 2.
    (Not a one-field edit: before, these FAILED prior_checkpoint, a window asked of a v1 marker.)
    """
    run = copy_run(REF_KILL_SAVE, tmp_path / "ref")
    data = run.json(MARKER)
    for other in ("window", "trigger", "in_flight_iteration", "section", "write_done", "rank_pid"):
        if other != key:
            del data[other]
    data["schema_version"] = 1
    run.path(MARKER).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    _cannot_judge(run, f"a schema 1 marker ('schema_version' 1) carries schema 2's '{key}'")


def test_a_schema_1_marker_still_carrying_schema_2_fields_cannot_be_judged(ref: Doctor) -> None:
    ref.set_json(MARKER, schema_version=1)
    _cannot_judge(
        ref,
        "injection marker unusable: fault_injected.json: a schema 1 marker ('schema_version' 1)"
        " carries schema 2's 'window', 'trigger', 'in_flight_iteration', 'section', 'write_done',"
        " 'rank_pid'",
    )


def test_a_marker_argv_other_than_run_jsons_cannot_be_judged(ref: Doctor) -> None:
    argv = ref.json(MARKER)["argv"]
    argv[argv.index("--train-iters=20")] = "--train-iters=30"
    ref.set_json(MARKER, argv=argv)
    _cannot_judge(
        ref,
        f"{_at(ref, MARKER, '"argv"')} records the workload's argv as"
        " 'pytest_nvrx.workloads.reference --train-iters=30",
        f"but run.json ({_at(ref, RUN_JSON, '"workload_argv"')}) ran"
        " 'pytest_nvrx.workloads.reference --train-iters=20",
    )


def test_a_marker_argv_of_another_entry_point_cannot_be_judged(ref: Doctor) -> None:
    argv = ref.json(MARKER)["argv"]
    argv[0] = "pytest_nvrx.workloads.other"
    ref.set_json(MARKER, argv=argv)
    _cannot_judge(ref, "the marker of another workload")


def test_a_marker_host_other_than_run_jsons_cannot_be_judged(ref: Doctor) -> None:
    ref.set_json(MARKER, host="elsewhere")
    _cannot_judge(
        ref,
        f"{_at(ref, MARKER, '"host"')} records host 'elsewhere', but run.json"
        f" ({_at(ref, RUN_JSON, '"host"')}) ran on 'vm' alone",
    )


# 7. a checkpoint tracker that holds no iteration (tracker.Tracker.junk; consistency._tracker_junk)


@pytest.mark.parametrize("text", ["twenty", "-20"])
def test_a_tracker_holding_no_iteration_cannot_be_judged(ref: Doctor, text: str) -> None:
    ref.path(TRACKER).write_text(f"{text}\n", encoding="utf-8")
    _cannot_judge(
        ref, f"checkpoint tracker {TRACKER}:1 is not an iteration: {text!r}: the workload"
    )


# 9. the injector's fire line (marker_agreement._no_fire_line)


def test_a_schema_2_marker_without_its_fire_line_cannot_be_judged(ref: Doctor) -> None:
    ref.delete(CYCLE0, "sending SIGKILL to pid 539")
    _cannot_judge(
        ref,
        f"{_at(ref, MARKER, 'schema_version')}: the injector's schema-2 marker says it fired on"
        f" rank 1 (kill), but {CYCLE0} holds no fire line of that rank",
    )
