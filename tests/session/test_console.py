"""The console's closing table and line fitting (issue #23 item 4):
pytest_nvrx.session.verdict_table, fed the
rows of committed real runs."""

from __future__ import annotations

from pathlib import Path

from pytest_nvrx.criteria.judgement import judge_run_dir
from pytest_nvrx.layout import RunLayout
from pytest_nvrx.session.scenario_run import Limits, ScenarioRun
from pytest_nvrx.session.verdict_table import Row, fit, verdict_table

DATA = Path(__file__).resolve().parents[1] / "data"


def _row(path: Path, limits: Limits | None = None) -> Row:
    run = ScenarioRun(path.name, None, RunLayout.for_run(path), judge_run_dir(path))
    return run.table_row(limits)


def test_the_table_has_a_row_per_scenario_with_downtime_and_phases() -> None:
    rows = [_row(DATA / "gpu-one-matrix" / name) for name in ("baseline", "kill-save")]
    rows.append(_row(DATA / "gpu-one-matrix" / "hang-finalize", Limits(downtime_s=1.0)))
    lines = verdict_table(rows, width=150)
    assert lines[0].split() == [
        "scenario", "outcome", "downtime", "detect", "restart", "gpu", "wait", "load", "1st",
        "step", "cause",
    ]  # fmt: skip
    baseline, kill, hang = lines[2:5]
    assert baseline.split()[:2] == ["baseline", "QUALIFIED"] and "63.0s" not in baseline
    assert kill.split()[:3] == ["kill-save", "QUALIFIED", "63.0s"]
    assert "38.0s" in kill  # NVRx's wait for the shared GPU's memory, its own column
    assert hang.split()[:3] == ["hang-finalize", "NOT", "QUALIFIED"]
    assert "downtime" in hang and "exceeds the limit 1 s" in hang
    assert all(len(line) <= 150 for line in lines)


def test_the_cause_wraps_within_its_row_and_shared_gpus_are_marked() -> None:
    """The cause was cut at the width (``...Assertio…``, issue #38): it wraps in its column,
    word by word, whole; a word longer than the column is not broken either."""
    cause = "replaced_cycle: " + " ".join(f"word{i}" for i in range(60)) + " [logs/launcher.log:80]"
    long_word = "x" * 120
    rows = [
        Row("reference-kill-save", "NOT QUALIFIED", {}, cause=cause),
        Row("megatron-kill-save", "QUALIFIED", {"gpu_memory_reclaim_s": 38.0}, shared_gpu=True),
        Row("reference-hang", "NOT QUALIFIED", {}, cause=f"cannot judge: {long_word} end"),
    ]
    lines = verdict_table(rows, width=100)
    column = lines[0].index("cause")
    first = lines.index(next(x for x in lines if x.startswith("reference-kill-save")))
    end = lines.index(next(x for x in lines if x.startswith("megatron-kill-save *")))
    wrapped = lines[first:end]
    assert len(wrapped) > 2 and all(len(x) <= 100 for x in wrapped), wrapped
    assert all(x[column:] and not x[:column].strip() for x in wrapped[1:]), wrapped
    assert " ".join(x[column:] for x in wrapped) == cause  # whole, in order, no "…"
    assert not any("…" in x for x in lines)
    assert f"  {long_word}" in "\n".join(lines)  # a word longer than the column stays whole
    assert lines[-1].startswith("* shared its GPU with other scenarios")
    assert verdict_table([], width=100) == []


def test_the_rule_is_as_wide_as_the_table() -> None:
    """The dashed rule was 80 wide under a ~130-wide header (issue #38)."""
    timings = {
        "failure_to_first_iteration_after_restore_s": 64.9,
        "failure_to_detected_s": 0.4,
        "detected_to_replacement_start_s": 40.1,
        "gpu_memory_reclaim_s": 38.0,
        "replacement_start_to_checkpoint_loaded_s": 19.5,
        "replacement_start_to_first_iteration_s": 21.0,
    }
    name = "megatron-schedule-kill-step_kill-restore_kill-restore-restarts1"
    rows = [Row(name, "NOT QUALIFIED", timings, cause="prior_checkpoint: no checkpoint")]
    for width in (80, 200):
        header, rule, *body = verdict_table(rows, width=width)
        assert set(rule) == {"-"} and len(rule) == max(len(x) for x in [header, *body])
    narrow = verdict_table(rows, width=80)
    assert len(narrow[0]) > 100 and len(narrow[1]) == len(narrow[0])


def test_a_row_travels_as_plain_data() -> None:
    row = _row(DATA / "windows" / "cpu" / "ref-kill-save")
    assert Row.from_dict(row.as_dict()) == row


def test_fit_keeps_the_quoted_line() -> None:
    line = "  PASS training_continuity: " + "y" * 200 + " [logs/train_cycle1.log:1011]"
    short = fit(line, 120)
    assert len(short) == 120 and short.endswith("… [logs/train_cycle1.log:1011]")
    assert fit("short", 120) == "short"
    assert len(fit("z" * 300, 50)) == 50


def test_a_cause_with_no_room_beside_its_row_goes_below_it() -> None:
    """At 80 columns a NOT QUALIFIED row had no room left and its cause was dropped (the
    adversarial review of #23): it wraps below the row, whole."""
    timings = {"failure_to_first_iteration_after_restore_s": 64.9, "failure_to_detected_s": 0.4}
    cause = "gate: " + " ".join(["downtime 64.9 s exceeds the limit 10 s"] * 4)
    rows = [Row("megatron-ckpt-worker-finalize", "NOT QUALIFIED", timings, cause=cause)]
    lines = verdict_table(rows, width=80)
    row = next(i for i, line in enumerate(lines) if line.startswith("megatron-ckpt"))
    assert "gate" not in lines[row] and lines[row + 1].startswith("    gate: downtime")
    below = lines[row + 1 :]
    assert len(below) == 3 and all(len(x) <= 80 and x.startswith("    ") for x in below)
    assert " ".join(x.strip() for x in below) == cause


def test_the_report_of_an_empty_dir_says_it_cannot_be_judged(tmp_path: Path) -> None:
    """It said "NOT QUALIFIED: the requested fault never happened ... [run.json]" of a run.json
    that does not exist; verify says "cannot judge"."""
    from pytest_nvrx.report.model import ScenarioReport

    (tmp_path / "empty").mkdir()
    report = ScenarioReport.from_run_dir(tmp_path / "empty")
    assert not report.judgeable
    assert report.outcome.startswith("NOT QUALIFIED: cannot judge the run directory: "), (
        report.outcome
    )


def test_the_header_says_what_deselected_and_skipped_will_mean(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "NVRX_"))}
    env.pop("MEGATRON_PATH", None)
    argv = [sys.executable, "-m", "pytest", "--pyargs", "pytest_nvrx.suite", "-m", "not gpu"]
    done = subprocess.run(
        [*argv, "--co", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "nvrx: 10 scenarios: reference-baseline, reference-kill-save," in out
    assert "tests deselected by -m/-k: those the expression leaves out" in out
    assert "a baseline's criteria that need a fault" in out and "show as skipped" in out
