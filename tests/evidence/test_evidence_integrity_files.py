"""Which file is the evidence, and which run is the reference (issue #21, items 7 and 8).

Doctored copies of committed real passing runs, each with one thing edited that was judged
PASSED before: a second file claiming a cycle's log, a cycle log name with a non-ASCII digit,
the reference workload loading another run's checkpoints, a ``--baseline`` that is the run
itself, a fault run, a failed run or one of another configuration, a ``result.json`` saying the
run was interrupted or timed out, a ``run.json`` of an unknown schema.

The runs: ``ref-kill-save`` (the CPU reference workload, 2 ranks) and ``g2-kill-30`` /
``g2-baseline-30`` (Megatron on 2 x H200).
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge, judge_run_dir
from pytest_nvrx.evidence.rundir import load_run
from pytest_nvrx.layout import RunLayout
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import CYCLE0, CYCLE1, MARKER, Doctor, copy_run

DATA = Path(__file__).parents[1] / "data"
REF_KILL = DATA / "windows" / "cpu" / "ref-kill-save"
G2_KILL = DATA / "gpu-continuity" / "g2-kill-30"
G2_BASELINE = DATA / "gpu-continuity" / "g2-baseline-30"
RECORD1 = "cycle_infos/cycle_info..0.1"
RESULT = "result.json"
RUN_JSON = "run.json"
ARABIC_ONE = "\u0661"  # ARABIC-INDIC DIGIT ONE: str.isdigit() and re's \d say it is a digit


def run_verify(*argv: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = verify_main([str(a) for a in argv], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("verify: error:")]


def messages(run: Path, severity: str) -> list[str]:
    return [p.message for p in load_run(run).problems if p.severity == severity]


@pytest.fixture
def base(tmp_path: Path) -> Doctor:
    return copy_run(G2_BASELINE, tmp_path / "g2-baseline-30")


def test_the_unchanged_runs_pass_and_the_baseline_is_used() -> None:
    assert judge_run_dir(REF_KILL).passed
    j = judge_run_dir(G2_KILL, baseline=G2_BASELINE)
    assert j.passed and j.baseline_dir == G2_BASELINE
    assert "baseline g2-baseline-30" in j.verdict("training_continuity").reason
    from pytest_nvrx.criteria.baseline import baseline_refusal

    assert baseline_refusal(load_run(G2_KILL), load_run(G2_BASELINE)) is None


# --- item 7: one cycle log per cycle ------------------------------------------------------------


def test_cycle_log_names_take_ascii_digits_only(tmp_path: Path) -> None:
    layout = RunLayout.for_run(tmp_path / "run")
    layout.logs.mkdir(parents=True)
    for name in ("train_cycle1.log", f"train_cycle{ARABIC_ONE}.log", "train_cycle\uff12.log"):
        (layout.logs / name).write_text("")
    assert layout.cycle_log_paths() == {1: layout.cycle_log(1)}


def test_the_launchers_own_name_wins_among_look_alikes_for_progress_and_tails(
    tmp_path: Path,
) -> None:
    """Launch progress and log tails read cycle_log_paths: one file per cycle, the same one
    whatever order the directory lists them in."""
    layout = RunLayout.for_run(tmp_path / "run")
    layout.logs.mkdir(parents=True)
    for name in (
        "train_cycle01.log",
        "train_cycle1.log",
        "train_cycle001.log",
        "train_cycle02.log",
    ):
        (layout.logs / name).write_text("")
    assert layout.cycle_log_paths() == {
        1: layout.cycle_log(1),
        2: layout.logs / "train_cycle02.log",
    }
    assert [p.name for p in layout.cycle_log_candidates()[1]] == [
        "train_cycle001.log",
        "train_cycle01.log",
        "train_cycle1.log",
    ]


def test_a_non_ascii_digit_log_in_place_of_the_recorded_one_cannot_be_judged(ref: Doctor) -> None:
    """The record names train_cycle1.log; only train_cycle<ARABIC ONE>.log is there (it passed
    as cycle 1's log before)."""
    ref.path(CYCLE1).rename(ref.path(f"logs/train_cycle{ARABIC_ONE}.log"))
    code, _, err = run_verify(ref.root)
    assert code == 2
    assert any(
        "cannot tell which file is cycle 1's log" in line and "train_cycle1.log" in line
        for line in errors(err)
    ), err
    assert not judge_run_dir(ref.root).passed


def test_a_second_file_claiming_cycle_1_is_reported_and_not_read(ref: Doctor) -> None:
    shutil.copy(ref.path(CYCLE1), ref.path("logs/train_cycle01.log"))
    # the look-alike tells another story: had it been read, cycle 1 restored nothing
    Doctor(ref.root).delete("logs/train_cycle01.log", "load checkpoint iteration 5")
    run = load_run(ref.root)
    log = run.cycle_log(1)
    assert log is not None and log.file == CYCLE1
    (note,) = [m for m in messages(ref.root, "warning") if "train_cycle01.log" in m]
    assert note.startswith("logs/train_cycle01.log looks like cycle 1's log but")
    assert f"{RECORD1} names train_cycle1.log" in note
    assert judge_run_dir(ref.root).passed


def test_a_non_ascii_digit_look_alike_is_reported(ref: Doctor) -> None:
    shutil.copy(ref.path(CYCLE1), ref.path(f"logs/train_cycle{ARABIC_ONE}.log"))
    notes = [m for m in messages(ref.root, "warning") if ARABIC_ONE in m]
    assert len(notes) == 1 and "looks like a cycle log" in notes[0], notes
    assert load_run(ref.root).cycle_log(1).file == CYCLE1  # type: ignore[union-attr]


def test_the_record_decides_which_file_is_the_cycle_log(ref: Doctor) -> None:
    """Cycle 1's record names train_cycle01.log: that file is cycle 1's log, the canonical name
    beside it a look-alike (the launcher wrote what its record says)."""
    shutil.copy(ref.path(CYCLE1), ref.path("logs/train_cycle01.log"))
    ref.delete("logs/train_cycle01.log", "rank 1 load checkpoint iteration 5")
    ref.set_json(RECORD1, cycle_log_file="/tmp/wt/runs/ks1/logs/train_cycle01.log")
    run = load_run(ref.root)
    assert run.cycle_log(1).file == "logs/train_cycle01.log"  # type: ignore[union-attr]
    assert any(
        m.startswith(f"{CYCLE1} looks like cycle 1's log but")
        for m in messages(ref.root, "warning")
    )
    assert not judge_run_dir(ref.root).verdict("optimizer_state_load").passed


def test_two_files_for_one_cycle_without_a_record_cannot_be_judged(ref: Doctor) -> None:
    shutil.copy(ref.path(CYCLE1), ref.path("logs/train_cycle01.log"))
    ref.remove(RECORD1)
    (fatal,) = messages(ref.root, "fatal")
    assert fatal == (
        "logs/train_cycle01.log and logs/train_cycle1.log both look like cycle 1's log and no"
        " cycle record names either: cannot tell which file is cycle 1's log"
    )
    code, _, err = run_verify(ref.root)
    assert code == 2 and errors(err)


def test_a_recorded_log_that_is_absent_beside_a_look_alike_cannot_be_judged(ref: Doctor) -> None:
    ref.path(CYCLE1).rename(ref.path("logs/train_cycle01.log"))
    (fatal,) = messages(ref.root, "fatal")
    assert fatal.startswith(
        f"{RECORD1} names train_cycle1.log as cycle 1's log, which is absent, while"
        " logs/train_cycle01.log looks like it: cannot tell which file is cycle 1's log"
    )
    code, _, _ = run_verify(ref.root)
    assert code == 2


def test_a_record_naming_another_cycles_log_cannot_be_judged(ref: Doctor) -> None:
    ref.set_json(RECORD1, cycle_log_file="/tmp/wt/runs/ks1/logs/train_cycle0.log")
    (fatal,) = messages(ref.root, "fatal")
    assert "names train_cycle0.log as cycle 1's log: the name of cycle 0's log" in fatal
    assert run_verify(ref.root)[0] == 2


# --- item 8a: the reference workload's load path ------------------------------------------------


def test_a_reference_load_line_naming_another_runs_checkpoints_fails(ref: Doctor) -> None:
    ref.replace(
        CYCLE1,
        "rank 1 load checkpoint iteration 5 (model, optimizer, scheduler, rng, data)"
        " consumed_samples 20 path /tmp/wt/runs/ks1/",
        "rank 1 load checkpoint iteration 5 (model, optimizer, scheduler, rng, data)"
        " consumed_samples 20 path /tmp/wt/runs/other/",
    )
    verdict = judge_run_dir(ref.root).verdict("optimizer_state_load")
    assert not verdict.passed
    assert verdict.reason.startswith(
        "replacement cycle 1 loads from /tmp/wt/runs/other/checkpoints, not from"
        " /tmp/wt/runs/ks1/checkpoints where cycle 0 saved its checkpoints"
    ), verdict.reason
    assert [e.location for e in verdict.evidence][:2] == [f"{CYCLE1}:6", f"{CYCLE0}:12"]


def test_a_reference_load_of_another_directory_than_run_json_says_fails(ref: Doctor) -> None:
    """No save printed in the failed cycle to compare with: run.json's checkpoint dir is."""
    ref.delete(CYCLE0, "save scheduled iteration")
    ref.replace(
        CYCLE1, "path /tmp/wt/runs/ks1/checkpoints/iter_0000005", "path /elsewhere/iter_0000005"
    )
    verdict = judge_run_dir(ref.root).verdict("optimizer_state_load")
    assert not verdict.passed
    assert verdict.reason.startswith(
        "replacement cycle 1 loads from /elsewhere, not from /tmp/wt/runs/ks1/checkpoints,"
        " the run's checkpoint directory (run.json)"
    ), verdict.reason
    assert [e.location for e in verdict.evidence][1].startswith("run.json:")


# --- item 8b: verify --baseline refuses what is no baseline -----------------------------------


def test_the_run_itself_is_no_baseline(g2: Doctor) -> None:
    code, _, err = run_verify(g2.root, "--baseline", g2.root / "." / "logs" / "..")
    assert code == 2
    (line,) = errors(err)
    assert line.endswith("it is the run being judged")


def test_a_fault_run_is_no_baseline(g2: Doctor) -> None:
    code, _, err = run_verify(g2.root, "--baseline", G2_KILL)
    assert code == 2
    (line,) = errors(err)
    assert f"cannot use --baseline {G2_KILL}: its run.json says fault 'kill'" in line, line


def test_a_baseline_with_a_marker_is_no_baseline(g2: Doctor, base: Doctor) -> None:
    shutil.copy(g2.path(MARKER), base.path(MARKER))
    code, _, err = run_verify(g2.root, "--baseline", base.root)
    assert code == 2
    (line,) = errors(err)
    assert (
        "it is not an uninterrupted run: baseline run (fault=none) has an injection marker" in line
    )


def test_a_baseline_that_failed_is_no_baseline(g2: Doctor, base: Doctor) -> None:
    base.set_json(RESULT, exit_code=1)
    code, _, err = run_verify(g2.root, "--baseline", base.root)
    assert code == 2
    (line,) = errors(err)
    assert "it is not an uninterrupted run: launcher exited with code 1" in line, line


def test_a_baseline_that_needed_a_second_cycle_is_no_baseline(g2: Doctor, base: Doctor) -> None:
    shutil.copy(g2.path(RECORD1), base.path(RECORD1))
    code, _, err = run_verify(g2.root, "--baseline", base.root)
    assert code == 2
    assert "baseline run needed 2 cycles: it was restarted" in errors(err)[0]


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (("config", "train_iters", 40), "train_iters 40 (run.json"),
        (("config", "world_size", 4), "world_size 4 (run.json"),
        (("config", "tp", 2), "tp 2 (run.json"),
        (("argv", "--tensor-model-parallel-size=1", "--tensor-model-parallel-size=2"),
         "--tensor-model-parallel-size 2"),
        (("argv", "--lr=0.0001", "--lr=0.0001 --seed=7"), "--seed 7"),
        (("dump", "seed ............................................ 1234",
          "seed ............................................ 99"), "seed 99 ("),
    ],
)  # fmt: skip
def test_a_baseline_of_another_configuration_is_no_baseline(
    g2: Doctor, base: Doctor, edit: tuple[str, str, object], why: str
) -> None:
    kind, key, value = edit
    if kind == "config":
        data = base.json(RUN_JSON)
        data["config"][key] = value
        base.set_json(RUN_JSON, config=data["config"])
    elif kind == "argv":
        data = base.json(RUN_JSON)
        argv = " ".join(data["workload_argv"]).replace(key, str(value)).split(" ")
        base.set_json(RUN_JSON, workload_argv=argv)
    else:
        base.replace(CYCLE0, key, str(value))
    code, _, err = run_verify(g2.root, "--baseline", base.root)
    assert code == 2
    (line,) = errors(err)
    assert "it differs in configuration:" in line and why in line, line


def test_the_plugin_pairing_judges_by_replay_only_and_says_why(base: Doctor) -> None:
    """judge() (the plugin's pairing with the session's baseline, judge_run_dir) does not
    compare with a refused baseline: training_continuity is judged on the replay alone and a
    note says why."""
    base.set_json(RESULT, exit_code=1)
    j = judge(load_run(G2_KILL), baseline=load_run(base.root))
    assert j.passed and j.baseline_dir is None
    continuity = j.verdict("training_continuity")
    assert "baseline" not in continuity.reason
    (note,) = [p.message for p in j.problems if "baseline" in p.message]
    assert note.startswith(f"baseline {base.root} not used by training_continuity: it is not")
    # the refusal is the judgement's: the plugin says it without asking baseline_refusal again
    assert j.baseline_refused is not None and note.endswith(j.baseline_refused)
    assert judge(load_run(G2_KILL), baseline=load_run(G2_BASELINE)).baseline_refused is None


# --- item 8c: result.json's interrupted/timed_out, run.json's schema -------------------------


def test_an_interrupted_run_cannot_pass(ref: Doctor) -> None:
    ref.set_json(RESULT, interrupted="SIGTERM")
    code, out, err = run_verify(ref.root)
    assert code == 2, out
    assert "result.json:5 says the run was interrupted (SIGTERM)" in errors(err)[0], err
    assert not judge_run_dir(ref.root).passed


def test_a_timed_out_run_cannot_pass(ref: Doctor) -> None:
    ref.set_json(RESULT, timed_out=True)
    code, _, _ = run_verify(ref.root)
    assert code == 1
    judgement = judge_run_dir(ref.root)
    verdict = judgement.verdict("no_repeat_injection")
    assert not verdict.passed
    # led by the first cause: the run timeout, and that the logs show the workers had finished
    cause = judgement.first_cause
    assert cause is not None and cause.run_timeout
    assert "and the workers finished (logs/launcher.log:" in cause.text
    assert "but the launcher had not exited" in cause.text
    assert verdict.reason.startswith(
        f"{cause.text}; the launch timed out (result.json: timed_out true)"
    )
    assert verdict.evidence[0].location == f"{RESULT}:4"


@pytest.mark.parametrize("interrupted", [None, False])
def test_not_interrupted_is_null_or_false(ref: Doctor, interrupted: object) -> None:
    ref.set_json(RESULT, interrupted=interrupted)
    assert judge_run_dir(ref.root).passed


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        (None, "run.json has no schema number"),
        (2, "run.json schema 2 is not one this version reads (1)"),
        ("1", "run.json schema '1' is not one this version reads (1)"),
    ],
)
def test_run_json_of_an_unknown_schema_cannot_be_judged(
    ref: Doctor, schema: object, why: str
) -> None:
    data = ref.json(RUN_JSON)
    if schema is None:
        del data["schema"]
    else:
        data["schema"] = schema
    ref.path(RUN_JSON).write_text(json.dumps(data, indent=2), encoding="utf-8")
    code, _, err = run_verify(ref.root)
    assert code == 2
    assert any(why in line for line in errors(err)), err
