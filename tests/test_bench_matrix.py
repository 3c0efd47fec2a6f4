"""benchmarks/bench_matrix.py's pure parts: launcher walls read from committed run dirs, interval
unions, the overhead ratio, the breakdown of a pytest wall and the parallel speed-up."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
CPU = ROOT / "tests" / "data" / "cpu"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_matrix", ROOT / "benchmarks" / "bench_matrix.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_matrix", module)
    spec.loader.exec_module(module)
    return module


bench = _load()


def test_launcher_walls_of_a_committed_matrix() -> None:
    """tests/data/cpu holds one session's baseline, kill and hang runs, each with result.json."""
    dirs = bench.find_run_dirs(CPU)
    assert [d.name for d in dirs] == ["reference-baseline", "reference-hang", "reference-kill"]
    walls = {Path(w.run_dir).name: w for w in map(bench.read_launcher_wall, dirs)}
    kill = walls["reference-kill"]
    assert kill.wall_s == 48.518 and kill.exit_code == 0
    # the recorded start/end agree with the recorded wall to the millisecond
    assert kill.end - kill.start == pytest.approx(48.524, abs=0.001)
    intervals = [(w.start, w.end) for w in walls.values()]
    # one after the other: the union is the sum of the three (gaps of 5 ms and 7 ms)
    assert bench.union_s(intervals) == pytest.approx(36.582 + 48.524 + 61.681, abs=0.01)


def test_unusable_result_json_is_no_wall(tmp_path: Path) -> None:
    assert bench.read_launcher_wall(tmp_path) is None
    (tmp_path / "result.json").write_text('{"wall_s": "48"}')
    assert bench.read_launcher_wall(tmp_path) is None
    (tmp_path / "result.json").write_text('{"wall_s": 3, "start_time": "2026-11-29T11:52:17"}')
    wall = bench.read_launcher_wall(tmp_path)
    assert wall.wall_s == 3.0 and wall.start is None  # a naive time is not a time we can place


def test_union_and_overhead() -> None:
    assert bench.union_s([(0, 10), (5, 12), (20, 21), (1, 2)]) == 13
    assert bench.union_s([]) == 0
    assert bench.overhead_ratio(139.2, 119.2) == pytest.approx(20 / 139.2)
    assert bench.overhead_ratio(0, 5) == 0.0


def test_scenario_of_a_suite_test_id() -> None:
    nodeid = "pytest_nvrx/suite/test_recovery.py::test_replaced_cycle[reference-kill-save]"
    assert bench.scenario_of(nodeid) == "reference-kill-save"
    assert bench.scenario_of("tests/test_x.py::test_plain") is None


def test_breakdown_of_a_session_around_committed_runs(tmp_path: Path) -> None:
    """A made-up session around the committed runs' real launcher intervals: a second to start,
    two of collection, each scenario's setup holding its launcher plus a probe before and a
    judgement after; what no timer covers is reported, not hidden."""
    for name in ("reference-baseline", "reference-kill"):
        shutil.copytree(CPU / name, tmp_path / f"{name}-20261129T115141-00001")
    walls = [bench.read_launcher_wall(d) for d in bench.find_run_dirs(tmp_path)]
    base, kill = sorted(walls, key=lambda w: w.start)
    started = base.start - 10.0
    S = bench.Span
    spans = [
        S("configure", started + 1.0, started + 1.0),
        S("collection", started + 1.0, started + 3.0),
        S("setup", started + 3.0, base.end + 2.0, "reference-baseline"),
        S("stack_probe", started + 3.0, started + 9.0, "reference-baseline"),
        S("judge", base.end + 0.5, base.end + 1.5, "reference-baseline"),
        S("call", base.end + 2.0, base.end + 2.1, "reference-baseline"),
        S("setup", base.end + 2.1, kill.end + 1.0, "reference-kill"),
        S("judge", kill.end + 0.2, kill.end + 0.9, "reference-kill"),
        S("call", kill.end + 1.0, kill.end + 1.1, "reference-kill-replaced_cycle"),
    ]
    wall = kill.end + 3.0 - started
    result = bench.breakdown(wall, started, walls, spans)
    assert result.launcher_sum_s == pytest.approx(36.577 + 48.518)
    assert result.overhead_s == pytest.approx(wall - 36.577 - 48.518, abs=0.002)
    assert result.overhead_ratio == pytest.approx(result.overhead_s / wall, abs=1e-4)
    assert result.phases["interpreter_to_configure"] == 1.0
    assert result.phases["collection"] == 2.0
    assert result.phases["session_end"] == pytest.approx(1.9, abs=0.002)
    assert result.phases["calls.judge"] == pytest.approx(1.7, abs=0.002)
    assert result.phases["calls.stack_probe"] == 6.0
    # a criterion's test (<scenario>-<criterion>) counts for its scenario
    assert set(result.scenarios) == {"reference-baseline", "reference-kill"}
    scenario = result.scenarios["reference-kill"]
    assert scenario["launcher_wall"] == 48.518 and scenario["judge"] == pytest.approx(0.7)
    assert scenario["call"] == pytest.approx(0.1)
    # no timer covers: the second between the probe and the baseline's launcher, the few ms
    # between the two launchers, and the 0.2 s before and after the kill run's judgement (the
    # baseline's judgement ran while the next launcher did: here they are back to back)
    gaps = 1.0 + (kill.start - base.end) + 0.2 + 0.2
    assert result.unaccounted_s == pytest.approx(gaps, abs=0.002)
    text = bench.format_report(
        {
            "machine": "m",
            "command": ["pytest"],
            "exit_code": 0,
            "parallel": None,
            "launchers": [vars(w) for w in walls],
            "breakdown": vars(result),
        }
    )
    assert "overhead" in text and "reference-kill" in text and "calls.judge" in text


def test_scenario_of_a_run_dir() -> None:
    assert bench.run_scenario("reference-kill-save-20261130T223439-30702") == "reference-kill-save"
    assert bench.run_scenario("reference-kill") == "reference-kill"  # not named by the plugin


def test_speedup_of_two_results() -> None:
    serial = {"breakdown": {"pytest_wall_s": 150.0}, "launchers": []}
    parallel = {
        "breakdown": {"pytest_wall_s": 75.0},
        "launchers": [{"wall_s": 60.0}, {"wall_s": 70.0}],
    }
    got = bench.speedup(serial, parallel)
    assert got["speedup"] == 2.0
    assert got["slowest_launcher_s"] == 70.0
    assert got["wall_over_slowest"] == pytest.approx(75 / 70, abs=1e-3)


def test_spans_written_by_the_plugin_are_read_back(tmp_path: Path) -> None:
    path = tmp_path / "timings.json"
    path.write_text(
        json.dumps([{"label": "judge", "start": 1.0, "end": 2.5, "scenario": "reference-kill"}])
    )
    (span,) = bench.load_spans([path])
    assert span == bench.Span("judge", 1.0, 2.5, "reference-kill") and span.seconds == 1.5
    assert bench.totals([span, bench.Span("judge", 2.0, 3.0)]) == {"judge": 2.0}
