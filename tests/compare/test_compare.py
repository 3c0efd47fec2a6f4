"""``python -m pytest_nvrx compare``: committed real reports of two stacks (the Megatron fault
schedules on one H200, core_v0.18.2 and core_v0.19.0, tests/data/compare/README.md) compared,
doctored copies of them that must fail the gate, and bad input that must be one line."""

from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.compare import (
    Limit,
    compare,
    load_side,
    parse_gate,
)
from pytest_nvrx.compare.main import compare_main
from pytest_nvrx.compare.side import CompareInputError
from pytest_nvrx.settings import ConfigError

DATA = Path(__file__).parents[1] / "data"
OLD = DATA / "compare" / "gpu-schedules-core_v0.18.2.report.json"
NEW = DATA / "compare" / "gpu-schedules-core_v0.19.0.report.json"
SCHEMA1 = DATA / "compare" / "gpu-recipe-schema1.report.json"
SCHEMA2 = DATA / "compare" / "gpu-recipe-schema2.report.json"


def cli(*args: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = compare_main([str(a) for a in args], out, err)
    return code, out.getvalue(), err.getvalue()


def doc(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def write(tmp_path: Path, name: str, data: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def scale(data: dict[str, Any], factor: float) -> dict[str, Any]:
    """A copy whose every recovery timing took ``factor`` times as long."""
    out = copy.deepcopy(data)

    def times(value: float | None) -> float | None:
        return None if value is None else round(value * factor, 3)

    for s in out["scenarios"]:
        s["downtime_s"] = times(s["downtime_s"])
        if "total_downtime_s" in s:
            s["total_downtime_s"] = times(s["total_downtime_s"])
        for r in [s["recovery"], *s.get("recoveries", [])]:
            if r is None:
                continue
            r["downtime_s"] = times(r["downtime_s"])
            for p in r["phases"]:
                p["seconds"] = times(p["seconds"])
    return out


def grow(scenario: dict[str, Any], recovery: int, phase: str, seconds: float) -> None:
    """One recovery's ``phase`` took ``seconds`` longer, and so did its downtime and the
    scenario's (a document that says otherwise contradicts itself: compare refuses it)."""
    r = scenario["recoveries"][recovery]
    p = next(p for p in r["phases"] if p["id"] == phase)
    p["seconds"] = round(p["seconds"] + seconds, 3)
    r["downtime_s"] = round(r["downtime_s"] + seconds, 3)
    for key in ("downtime_s", "total_downtime_s"):
        scenario[key] = round(scenario[key] + seconds, 3)


def unshared(data: dict[str, Any]) -> dict[str, Any]:
    """A copy whose runs had their GPU to themselves (no noise)."""
    out = copy.deepcopy(data)
    for s in out["scenarios"]:
        s["gpu_shared_with"] = []
    return out


# ----------------------------------------------------------------------------------------------
# Two real stacks


def test_two_stacks_compared_by_scenario_key() -> None:
    result = compare(load_side(OLD, "OLD"), load_side(NEW, "NEW"))
    changes = {c.field: (c.old, c.new) for c in result.stack_changes}
    assert changes["megatron_describe"] == ("core_v0.18.2", "core_v0.19.0")
    assert changes["megatron_rev"][0].startswith("571370c829ca")
    assert changes["megatron_rev"][1].startswith("5be9626709af")
    assert "torch" not in changes and "nccl" not in changes  # the same elsewhere
    keys = sorted(str(d.key) for d in result.scenarios)
    assert keys == [
        "megatron hang@finalize, ckpt-worker@finalize [30 iterations, 1 rank]",
        "megatron kill@step, kill@restore [30 iterations, 1 rank]",
        "megatron kill@step, kill@restore, kill@restore [30 iterations, 1 rank]",
    ]
    assert [str(k) for k in result.only_new] == [
        "megatron kill@step, kill@step, ckpt-worker@finalize [30 iterations, 1 rank]"
    ]
    assert not result.only_old
    for d in result.scenarios:
        assert d.old_outcome == d.new_outcome == "QUALIFIED"
        assert d.verdict_change is None
        # a schedule's every recovery, its downtime and its phases
        labels = {t.label for t in d.timings}
        assert "recovery 1 (" in " ".join(labels)
        assert any(t.what == "gpu_reclaim" and t.delta is not None for t in d.timings)
        # the runs shared the GPU: named as noise
        assert any("shared" in n for n in d.noise)
    hang = next(d for d in result.scenarios if d.key.fault.startswith("hang"))
    load = next(t for t in hang.timings if t.label == "recovery 1 (hang@finalize): checkpoint_load")
    assert (load.old, load.new, load.delta) == (23.379, 22.097, -1.282)


def test_the_cli_prints_the_stacks_verdicts_and_phases_and_passes_the_gate() -> None:
    code, out, err = cli(OLD, NEW, "--fail-on", "verdict,downtime:+20%")
    assert code == 0, err
    assert "megatron_describe core_v0.18.2 → core_v0.19.0" in out
    assert (
        "recovery 2 (kill@restore): checkpoint_load: 26.291 s → 26.652 s  +0.361 s (+1.4%)" in out
    )
    assert "only in NEW: megatron kill@step, kill@step, ckpt-worker@finalize" in out
    assert out.splitlines()[-1].startswith("compare: 0 regressions, 0 improvements")
    assert out.splitlines()[-1].endswith("gate verdict, downtime:+20% passes")


def test_a_report_against_itself_has_no_change() -> None:
    code, out, _ = cli(NEW, NEW, "--fail-on", "verdict,downtime:+0s", "--gate-noise")
    assert code == 0
    result = compare(load_side(NEW, "OLD"), load_side(NEW, "NEW"), parse_gate(["downtime:+0s"]))
    assert result.changes == 0 and not result.gate_failed
    assert result.count("unchanged") == 4
    assert "OLD and NEW are one file" in out
    assert "4 unchanged; 0 only in OLD, 0 only in NEW" in out


def test_a_doctored_slower_copy_fails_the_downtime_gate(tmp_path: Path) -> None:
    slower = write(tmp_path, "slower.json", scale(doc(NEW), 1.3))
    # three of the real runs shared their GPU: their timings are noise, shown and not gated
    # unless asked; the fourth had it to itself (tests/data/gpu-schedules/README.md) and fails
    code, out, _ = cli(NEW, slower, "--fail-on", "downtime:+20%")
    assert code == 1, out
    failed = {line.split(": downtime")[0] for line in out.splitlines() if "gate fails" in line}
    assert failed == {
        "gate fails: megatron kill@step, kill@step, ckpt-worker@finalize [30 iterations, 1 rank]"
    }
    assert "not gated: downtime:+20%: downtime 133.804 s → 173.945 s" in out
    code, out, _ = cli(NEW, slower, "--fail-on", "downtime:+20%", "--gate-noise")
    assert code == 1, out
    assert (
        "gate fails: megatron kill@step, kill@restore [30 iterations, 1 rank]: downtime:+20%" in out
    )
    assert "FAILS" in out.splitlines()[-1]
    # runs that had the GPU to themselves are gated as they are
    clean_old = write(tmp_path, "clean-old.json", unshared(doc(NEW)))
    clean_new = write(tmp_path, "clean-new.json", unshared(scale(doc(NEW), 1.3)))
    assert cli(clean_old, clean_new, "--fail-on", "downtime:+20%")[0] == 1
    assert cli(clean_old, clean_new, "--fail-on", "downtime:+10s")[0] == 1
    # ... and 30% slower is inside +40% and +60 s: the gate does not fire on every growth
    assert cli(clean_old, clean_new, "--fail-on", "downtime:+40%")[0] == 0
    assert cli(clean_old, clean_new, "--fail-on", "downtime:+60s")[0] == 0
    # faster is never a failure
    assert cli(clean_new, clean_old, "--fail-on", "downtime:+0%")[0] == 0


def test_a_phase_gate_names_the_phase(tmp_path: Path) -> None:
    data = unshared(doc(NEW))
    slower = copy.deepcopy(data)
    hang = next(s for s in slower["scenarios"] if s["schedule"][0] == "hang@finalize")
    grow(hang, 1, "checkpoint_load", 6.0)
    old, new = write(tmp_path, "a.json", data), write(tmp_path, "b.json", slower)
    code, out, _ = cli(old, new, "--fail-on", "phase:load:+5s")
    assert code == 1
    assert "phase:checkpoint_load:+5s: recovery 2 (ckpt-worker@finalize): checkpoint_load" in out
    assert cli(old, new, "--fail-on", "phase:load:+7s")[0] == 0
    assert cli(old, new, "--fail-on", "phase:rendezvous:+0s")[0] == 0  # another phase: unmoved


def test_a_timing_lost_on_new_fails_its_gate(tmp_path: Path) -> None:
    data = unshared(doc(NEW))
    lost = copy.deepcopy(data)
    kill = next(s for s in lost["scenarios"] if s["schedule"] == ["kill@step", "kill@restore"])
    for p in kill["recoveries"][1]["phases"]:
        if p["id"] == "checkpoint_load":
            p["seconds"], p["missing"] = None, "checkpoint loaded not in the evidence"
    code, out, _ = cli(
        write(tmp_path, "a.json", data),
        write(tmp_path, "b.json", lost),
        "--fail-on",
        "phase:load:+5s",
    )
    assert code == 1
    assert "checkpoint_load 26.652 s on OLD, not measured on NEW" in out


def test_a_verdict_that_turned_fails_the_verdict_gate(tmp_path: Path) -> None:
    broken = doc(NEW)
    s = broken["scenarios"][0]
    s["passed"], s["first_cause"] = False, "the replacement never loaded a checkpoint"
    s["outcome"] = f"NOT QUALIFIED: {s['first_cause']}"  # the cause, said once (its outcome)
    broken["passed"] = False  # the document's verdict is every scenario's
    new = write(tmp_path, "new.json", broken)
    code, out, _ = cli(NEW, new, "--fail-on", "verdict")
    assert code == 1
    lines = out.splitlines()
    # a verdict change leads
    assert lines[lines.index(next(x for x in lines if x.startswith("REGRESSION:"))) - 1].startswith(
        "stack:"
    )
    assert "QUALIFIED → NOT QUALIFIED: the replacement never loaded a checkpoint" in out
    assert cli(NEW, new)[0] == 0  # no gate: shown, not failed
    assert cli(new, NEW, "--fail-on", "verdict")[0] == 0  # the improvement


def test_no_scenario_in_common_cannot_be_compared(tmp_path: Path) -> None:
    other = doc(NEW)
    for s in other["scenarios"]:
        s["train_iters"] = 40
    code, out, err = cli(OLD, write(tmp_path, "x.json", other))
    assert code == 2 and not out
    assert err.startswith("compare: cannot compare: no scenario in common: OLD has megatron")
    assert len(err.splitlines()) == 1
    other_workload = doc(NEW)
    for s in other_workload["scenarios"]:
        s["workload"] = "reference"
    code, _, err = cli(OLD, write(tmp_path, "y.json", other_workload))
    assert code == 2
    assert "different workloads: OLD ran megatron, NEW ran reference" in err


def test_one_scenario_whose_key_changed_is_on_one_side_each(tmp_path: Path) -> None:
    other = doc(NEW)
    other["scenarios"][0]["train_iters"] = 40
    result = compare(load_side(OLD, "OLD"), load_side(write(tmp_path, "x.json", other), "NEW"))
    assert len(result.scenarios) == 2
    assert len(result.only_old) == 1 and len(result.only_new) == 2
    assert "[40 iterations" in str(result.only_new[0]) + str(result.only_new[1])


def test_run_dirs_judged_on_the_fly_match_their_reports() -> None:
    runs = DATA / "gpu-schedules"
    from_dirs = compare(
        load_side(runs / "core_v0.18.2", "OLD"), load_side(runs / "core_v0.19.0", "NEW")
    )
    from_files = compare(load_side(OLD, "OLD"), load_side(NEW, "NEW"))
    assert from_dirs.old.kind == "run directories"
    assert [(str(d.key), d.timings, d.status) for d in from_dirs.scenarios] == [
        (str(d.key), d.timings, d.status) for d in from_files.scenarios
    ]
    assert from_dirs.stack_changes == from_files.stack_changes


def test_schema_1_against_schema_2_leaves_the_changed_phases_out() -> None:
    # the same three H200 runs: reported at schema 1 (the earlier example report) and judged now
    result = compare(
        load_side(SCHEMA1, "OLD"), load_side(SCHEMA2, "NEW"), parse_gate(["phase:termination:+0s"])
    )
    assert any("schema 1" in n for n in result.notes)
    kill = next(d for d in result.scenarios if d.key.fault == "kill")
    by = {t.what: t for t in kill.timings}
    assert by["termination"].incomparable and by["gpu_reclaim"].incomparable
    assert by["downtime"].delta == 0.0 and by["checkpoint_load"].delta == 0.0
    assert not result.gate_failed  # termination is not compared, so not gated


def test_samples_are_the_median_and_too_few_are_noise(tmp_path: Path) -> None:
    data = unshared(doc(NEW))
    three = copy.deepcopy(data)
    first = three["scenarios"][0]
    slow, fast = copy.deepcopy(first), copy.deepcopy(first)
    grow(slow, 0, "checkpoint_load", 100.0)
    grow(fast, 0, "checkpoint_load", -1.0)
    three["scenarios"] += [slow, fast]
    result = compare(
        load_side(write(tmp_path, "a.json", data), "OLD"),
        load_side(write(tmp_path, "b.json", three), "NEW"),
        parse_gate(["downtime:+10s"]),
        min_samples=2,
    )
    d = next(d for d in result.scenarios if len(d.new) == 3)
    assert d.downtime is not None and d.downtime.delta == 0.0  # the median, not the mean
    assert "OLD has 1 sample(s), fewer than 2" in d.noise
    assert not any("NEW has" in n for n in d.noise)


# ----------------------------------------------------------------------------------------------
# The gate's spec


def test_limits() -> None:
    assert not Limit(20, True).exceeded(10.0, 12.0)
    assert Limit(20, True).exceeded(10.0, 12.01)
    assert not Limit(10, False).exceeded(5.0, 15.0)
    assert Limit(10, False).exceeded(5.0, 15.01)
    assert Limit(20, True).exceeded(0.0, 0.01)
    assert not Limit(0, True).exceeded(3.0, 2.0)


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("phase:nosuch:+1s", "no phase 'nosuch'"),
        ("downtime:20%", "is not +Ns or +N%"),
        ("downtime:+2x", "is not +Ns or +N%"),
        ("downtime:+-2s", "is not +Ns or +N%"),
        ("downtime:+nan%", "is not +Ns or +N%"),
        ("verdict,", "holds an empty rule"),
        ("loss", "is not a gate rule"),
        ("phase:load", "is not a gate rule"),
    ],
)
def test_a_bad_spec_is_one_line(spec: str, why: str) -> None:
    with pytest.raises(ConfigError, match="--fail-on"):
        parse_gate([spec])
    code, out, err = cli(OLD, NEW, "--fail-on", spec)
    assert code == 2 and not out
    assert err.startswith(f"compare: error: --fail-on {spec!r}") and why in err
    assert len(err.splitlines()) == 1


def test_phase_words_and_the_plugins_spelling() -> None:
    assert [str(r) for r in parse_gate(["phase:load:+5s,phase:reclaim:+10%", "verdict"])] == [
        "phase:checkpoint_load:+5s",
        "phase:gpu_reclaim:+10%",
        "verdict",
    ]
    with pytest.raises(ConfigError) as exc:
        parse_gate(["downtime"], "--nvrx-compare-fail")
    assert str(exc.value).startswith("--nvrx-compare-fail 'downtime' is not a gate rule")


# ----------------------------------------------------------------------------------------------
# Bad input: one line, exit 2, never a traceback


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    good = NEW.read_text()
    newer = doc(NEW)
    newer["schema_version"] = 3
    typed = doc(NEW)
    typed["scenarios"][0]["total_downtime_s"] = "fast"
    missing = doc(NEW)
    del missing["scenarios"][0]["criteria"]
    letters = doc(NEW)
    letters["scenarios"][0]["gpu_shared_with"] = "gw0"
    # what says whether a scenario qualified is read against 'passed': text, or refused
    problem = doc(NEW)
    problem["scenarios"][0]["problems"] = [1]
    status = doc(NEW)
    status["scenarios"][0]["criteria"][0]["status"] = None
    (tmp_path / "empty-dir").mkdir()
    cases = {
        "newer": (write(tmp_path, "newer.json", newer), "schema 3 is newer than this"),
        "truncated": (tmp_path / "cut.json", "not JSON"),
        "empty": (tmp_path / "empty.json", "empty; truncated"),
        "nested": (tmp_path / "nested.json", "nested too deep"),
        "nan": (tmp_path / "nan.json", "NaN is not a JSON number"),
        "digits": (tmp_path / "digits.json", "not JSON"),
        "binary": (tmp_path / "binary.json", "not UTF-8"),
        "list": (write(tmp_path, "list.json", [1, 2]), "top level is no object"),
        "no schema": (write(tmp_path, "noschema.json", {"scenarios": []}), "no report.json schema"),
        "scenarios": (
            write(tmp_path, "s.json", {"schema_version": 2, "scenarios": 7}),
            "not a list",
        ),
        "typed": (write(tmp_path, "typed.json", typed), "'total_downtime_s' is \"fast\""),
        "missing": (write(tmp_path, "missing.json", missing), "lacks the field 'criteria'"),
        "no run dir": (tmp_path / "empty-dir", "no run directory in it"),
        "letters": (
            write(tmp_path, "letters.json", letters),
            "'gpu_shared_with' is \"gw0\", not a list",
        ),
        "absent": (tmp_path / "absent.json", "cannot be read"),
        "problem": (write(tmp_path, "problem.json", problem), "'problems' is 1, not text"),
        "status": (write(tmp_path, "status.json", status), "'criteria.status' is null, not text"),
    }
    (tmp_path / "cut.json").write_text(good[: len(good) // 2])
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "nested.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "nan.json").write_text('{"schema_version": 2, "scenarios": [], "x": NaN}')
    (tmp_path / "digits.json").write_text('{"schema_version": ' + "9" * 5000 + "}")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe{}")
    return cases


def test_bad_input_is_one_line_on_either_side(tmp_path: Path) -> None:
    for name, (path, why) in _bad_inputs(tmp_path).items():
        for args, label in (((OLD, path), "NEW"), ((path, OLD), "OLD")):
            code, out, err = cli(*args)
            assert code == 2, (name, out, err)
            assert not out, name
            assert err.startswith(f"compare: cannot compare: {label} "), (name, err)
            assert why in err, (name, err)
            assert len(err.splitlines()) == 1, (name, err)
        with pytest.raises(CompareInputError):
            load_side(path, "OLD")


def test_the_command_runs_as_a_module_and_writes_its_outputs(tmp_path: Path) -> None:
    page, data = tmp_path / "out" / "compare.html", tmp_path / "compare.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_nvrx",
            "compare",
            str(OLD),
            str(NEW),
            "-o",
            str(page),
            "--json",
            str(data),
            "--fail-on",
            "verdict",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    text = page.read_text()
    assert text.startswith("<!doctype html>") and "<script" not in text
    assert "core_v0.18.2" in text and "checkpoint_load" in text and "<svg" in text
    document = json.loads(data.read_text())
    assert document["compare_schema"] == 1 and document["gate"]["failed"] is False
    assert document["stack_changes"][-1] == {
        "field": "megatron_describe",
        "old": "core_v0.18.2",
        "new": "core_v0.19.0",
    }
    assert document["changes"] == 4  # 3 faster, 1 only in NEW
    # --json -: the document alone on stdout, the text on stderr
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_nvrx", "compare", str(OLD), str(NEW), "--json", "-"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert json.loads(proc.stdout)["summary"].startswith("0 regressions")
    assert "compare: " in proc.stderr


def test_an_output_onto_a_side_or_into_a_run_dir_is_refused(tmp_path: Path) -> None:
    old = write(tmp_path, "old.json", doc(OLD))
    before = old.read_bytes()
    code, _, err = cli(old, NEW, "-o", old)
    assert code == 2 and "is the OLD side" in err
    assert old.read_bytes() == before
    run_dir = DATA / "gpu-schedules" / "core_v0.19.0"
    code, _, err = cli(OLD, run_dir, "--json", run_dir / "x.json")
    assert code == 2 and "NEW side" in err and not (run_dir / "x.json").exists()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code, _, err = cli(OLD, NEW, "-o", fifo)
    assert code == 2 and "not a regular file" in err


def test_the_committed_planted_regression_is_the_load_phase() -> None:
    # two real CPU runs, the second with --load-delay 6 (tests/data/compare/README.md); the
    # launching twin of this test is tests/compare/test_compare_planted.py
    runs = DATA / "compare" / "planted-load-delay"
    result = compare(load_side(runs / "plain", "OLD"), load_side(runs / "slow", "NEW"))
    [d] = result.scenarios
    grown = {t.what: t.delta for t in d.timings if t.delta is not None}
    assert grown["checkpoint_load"] == 6.158
    assert max(grown, key=lambda w: grown[w] or 0.0) == "checkpoint_load"
    assert all(
        abs(v or 0.0) < 0.2 for w, v in grown.items() if w not in ("checkpoint_load", "downtime")
    )
    code, out, _ = cli(runs / "plain", runs / "slow", "--fail-on", "phase:load:+5s")
    assert code == 1 and "checkpoint_load 6.738 s → 12.896 s (+6.158 s, +91.4%)" in out
    assert cli(runs / "plain", runs / "slow", "--fail-on", "phase:load:+7s")[0] == 0


def test_fields_a_later_version_adds_are_read_past(tmp_path: Path) -> None:
    # new fields do not raise the schema (docs/report.md): a reader ignores them
    later = doc(NEW)
    for s in later["scenarios"]:
        s["future"] = 1
        s["timeline"]["future"] = [1]
        s["timeline"]["cycles"][0]["future"] = 1
        s["timeline"]["events"][0]["future"] = 1
        for r in s["recoveries"]:
            r["future"] = {}
            r["phases"][0]["future"] = 1
            r["milestones"][0]["future"] = 1
            r["lost_work"]["future"] = 1
    code, out, err = cli(NEW, write(tmp_path, "later.json", later), "--fail-on", "downtime:+0s")
    assert code == 0, err
    assert "4 unchanged; 0 only in OLD, 0 only in NEW" in out


def test_a_sides_text_reaches_no_terminal_or_page_raw(tmp_path: Path) -> None:
    hostile = doc(NEW)
    for s in hostile["scenarios"]:
        s["workload"] = "<script>alert(1)</script>\x1b[2J\u202e"
    hostile["stack"]["megatron_describe"] = "<img src=x>\x1b]0;title\x07"
    side = write(tmp_path, "hostile.json", hostile)
    page = tmp_path / "page.html"
    code, out, _ = cli(side, side, "-o", page, "--json", tmp_path / "c.json")
    assert code == 0
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
    text = page.read_text()
    assert "<script>" not in text and "<img" not in text and "\x1b" not in text


def test_a_new_run_that_broke_before_its_first_cycle_is_still_its_scenario(tmp_path: Path) -> None:
    # no cycle: no ranks to read; it is matched with OLD's scenario and its verdict gated
    broken = doc(NEW)
    s = next(s for s in broken["scenarios"] if s["schedule"] == ["kill@step", "kill@restore"])
    s["timeline"]["cycles"], s["passed"] = [], False
    s["first_cause"] = "the launcher never started a worker"
    s["outcome"] = f"NOT QUALIFIED: {s['first_cause']}"
    broken["passed"] = False
    code, out, _ = cli(OLD, write(tmp_path, "broken.json", broken), "--fail-on", "verdict")
    assert code == 1, out
    assert "gate fails: megatron kill@step, kill@restore [30 iterations, 1 rank]: verdict" in out
    assert "only in NEW: megatron kill@step, kill@restore [30 iterations]" not in out
    assert "note: matched OLD megatron kill@step, kill@restore [30 iterations, 1 rank]" in out


def test_the_missing_rule_fails_a_scenario_new_lacks(tmp_path: Path) -> None:
    fewer = doc(OLD)
    del fewer["scenarios"][0]
    new = write(tmp_path, "fewer.json", fewer)
    assert cli(OLD, new, "--fail-on", "verdict")[0] == 0  # shown, not gated
    code, out, _ = cli(OLD, new, "--fail-on", "verdict,missing")
    assert code == 1
    assert (
        "gate fails: megatron hang@finalize, ckpt-worker@finalize [30 iterations, 1 rank]: "
        "missing: on OLD (QUALIFIED), not on NEW"
    ) in out
    assert cli(OLD, NEW, "--fail-on", "missing")[0] == 0  # NEW has more: nothing missing
