"""Honest timings on shared GPUs (issue #23 item 3).

On one H200 with 7 scenarios sharing it, ``detected -> workers terminated`` took 33-36 s for
kill/term/segv (about 1 s on a GPU of their own): NVRx waits until the whole GPU's memory is
reclaimed, the other scenarios' included (tests/data/gpu-one-matrix). So:

* the pool records which runs held a run's GPUs while it ran (result.json ``gpu_shared_with``:
  :class:`~pytest_nvrx.launch.gpu_slots.GpuLedger`), and verify, its JSON and JUnit say so;
* NVRx's reclaim wait is its own timing where the launcher logs it (``gpu_memory_reclaim_s``);
* the downtime gate refuses runs that shared a GPU unless ``--nvrx-gate-shared-gpu``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from pytest_nvrx.criteria.judgement import judge_run_dir
from pytest_nvrx.launch.gpu_slots import GpuLedger
from pytest_nvrx.launch.launcher import RunResult
from pytest_nvrx.layout import RunLayout
from pytest_nvrx.session import junit
from pytest_nvrx.session.scenario_run import Limits, ScenarioRun
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import Doctor, copy_run

DATA = Path(__file__).resolve().parents[1] / "data"
ONE_GPU_KILL = DATA / "gpu-one-matrix" / "kill-save"
OTHERS = ["megatron-baseline-20261201T224205-00457", "megatron-hang-finalize-x"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_ledger_names_the_runs_that_held_a_gpu_meanwhile() -> None:
    clock = Clock()
    ledger = GpuLedger(clock)
    ledger.started("a", ["0"])
    ledger.started("c", ["1"])
    clock.now = 5
    ledger.started("b", ["0", "1"])
    clock.now = 10
    assert ledger.shared_with("a") == ["b"]  # asked as a ends, b still running
    ledger.ended("a")
    clock.now = 11
    ledger.started("d", ["0"])
    clock.now = 12
    ledger.ended("d")
    assert ledger.shared_with("d") == ["b"]  # a had ended before d began
    clock.now = 20
    ledger.ended("b")
    ledger.ended("c")
    assert ledger.shared_with("b") == ["a", "c", "d"]
    assert ledger.shared_with("c") == ["b"]
    assert ledger.shared_with("unknown") == []


def test_result_json_records_the_sharing_only_where_counted() -> None:
    base = {"exit_code": 0, "wall_s": 1.0, "timed_out": False, "interrupted": None}
    times = {"start_time": "2026-12-02T00:00:00+00:00", "end_time": "2026-12-02T00:00:01+00:00"}
    counted = RunResult(**base, **times, gpu_shared_with=("x", "y")).as_dict()  # type: ignore[arg-type]
    alone = RunResult(**base, **times, gpu_shared_with=()).as_dict()  # type: ignore[arg-type]
    uncounted = RunResult(**base, **times).as_dict()  # type: ignore[arg-type]
    assert counted["gpu_shared_with"] == ["x", "y"] and alone["gpu_shared_with"] == []
    assert "gpu_shared_with" not in uncounted


def _shared(tmp_path: Path, value: object) -> Doctor:
    run = copy_run(ONE_GPU_KILL, tmp_path / "kill-save")
    run.set_json("result.json", gpu_shared_with=value)
    return run


def test_verify_says_the_timings_were_measured_beside_other_runs(tmp_path: Path) -> None:
    run = _shared(tmp_path, OTHERS)
    out, err = io.StringIO(), io.StringIO()
    assert verify_main([str(run.root), "--json", "-"], out, err) == 0, err.getvalue()
    doc = json.loads(out.getvalue())
    assert doc["gpu_shared_with"] == OTHERS
    assert doc["timings"]["gpu_memory_reclaim_s"] == 38.0
    assert "note: timings measured on a GPU shared with 2 other runs (result.json:" in (
        err.getvalue()
    )
    alone = copy_run(ONE_GPU_KILL, tmp_path / "alone")
    out = io.StringIO()
    assert verify_main([str(alone.root), "--json", "-"], out, io.StringIO()) == 0
    assert json.loads(out.getvalue())["gpu_shared_with"] is None  # not recorded then


def test_the_reclaim_wait_is_its_own_timing_inside_the_replacement_start() -> None:
    """gpu-one-matrix kill-save: 38 s of the 40.6 s detected -> replacement start was NVRx
    waiting for the GPU's memory (launcher.log:45); gpu-share2 kill-save shared GPU 0 too."""
    timings = judge_run_dir(ONE_GPU_KILL).timings
    assert timings["gpu_memory_reclaim_s"] == 38.0
    assert timings["gpu_memory_reclaim_s"] < timings["detected_to_replacement_start_s"]
    shared2 = judge_run_dir(DATA / "parallel" / "gpu-share2" / "kill-save").timings
    assert shared2["gpu_memory_reclaim_s"] > 20
    # a CPU run logs no reclaim: no such timing (never 0)
    cpu = judge_run_dir(DATA / "windows" / "cpu" / "ref-kill-save").timings
    assert "gpu_memory_reclaim_s" not in cpu


def _scenario_run(run: Doctor) -> ScenarioRun:
    return ScenarioRun("kill-save", None, RunLayout.for_run(run.root), judge_run_dir(run.root))


def test_the_gate_refuses_shared_gpu_timings_unless_told(tmp_path: Path) -> None:
    scenario = _scenario_run(_shared(tmp_path, OTHERS))
    refused = scenario.gate_failures(Limits(downtime_s=600.0))
    assert len(refused) == 1 and refused[0].startswith("cannot hold the run to --nvrx-max-down")
    assert "shared with 2 other runs" in refused[0] and "--nvrx-gate-shared-gpu" in refused[0]
    assert scenario.outcome(Limits(downtime_s=600.0)).text.startswith("NOT QUALIFIED: cannot hold")
    # told to: gated as any run (63 s of downtime)
    assert scenario.gate_failures(Limits(downtime_s=600.0, shared_gpu=True)) == []
    gated = scenario.gate_failures(Limits(downtime_s=10.0, shared_gpu=True))[0]
    assert gated.startswith("downtime 62.967 s exceeds the limit 10 s"), gated
    assert "replacement started 40.6 s later (of which 38 s waiting for GPU memory)" in gated
    # a run that had its GPU alone is gated as before
    alone = _scenario_run(_shared(tmp_path / "2", []))
    assert alone.gate_failures(Limits(downtime_s=600.0)) == []
    props = dict(junit.run_properties(scenario))
    assert props["nvrx_gpu_shared_with"] == ",".join(OTHERS)
    assert dict(junit.run_properties(alone))["nvrx_gpu_shared_with"] == ""


def test_a_sharing_record_that_is_no_list_of_run_ids_cannot_be_judged(tmp_path: Path) -> None:
    own = json.loads((ONE_GPU_KILL / "run.json").read_text())["run_id"]
    cases: list[tuple[object, str]] = [
        ("megatron-baseline", "must be a list of run IDs"),
        ([1, 2], "must be a list of run IDs"),
        ([""], "must be a list of run IDs"),
        ({"a": 1}, "must be a list of run IDs"),
        (["a\x1b]0;x\x07"], "must be a list of run IDs"),
        (["a", "a", "a"], "names a run twice"),
        ([own, "other"], "names the run itself"),
    ]
    for n, (bad, why) in enumerate(cases):
        run = _shared(tmp_path / str(n), bad)
        err = io.StringIO()
        assert verify_main([str(run.root)], io.StringIO(), err) == 2, bad
        assert f"'gpu_shared_with' {why}" in err.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("new", "said"),
    [
        ("GPU 0 memory reclaimed in 1000000000s (20 samples)", "impossible timing: NVRx waited"),
        ("GPU 0 memory reclaimed in nans (20 samples)", "gives no wait it can read"),
        ("GPU 0 memory reclaimed in -5s (20 samples)", "gives no wait it can read"),
    ],
    ids=["longer-than-its-span", "nan", "negative"],
)
def test_a_reclaim_wait_no_clock_allows_cannot_be_judged(
    tmp_path: Path, new: str, said: str
) -> None:
    """The adversarial review of #23: a wait of 10**9 s passed, and an unreadable line was
    dropped (its 33 s counted as termination, the GPU wait shown as 0)."""
    run = copy_run(ONE_GPU_KILL, tmp_path / "kill-save")
    run.replace("logs/launcher.log", "GPU 0 memory reclaimed in 38s (20 samples)", new, 1)
    err = io.StringIO()
    assert verify_main([str(run.root)], io.StringIO(), err) == 2, err.getvalue()
    assert said in err.getvalue(), err.getvalue()


def test_a_negative_phase_never_keeps_to_its_limit(tmp_path: Path) -> None:
    """The reclaim line moved before the stop (its wait 0 s): gpu_reclaim comes out negative;
    --nvrx-max-phase gpu_reclaim=0.001 passed it (the adversarial review of #23)."""
    run = copy_run(ONE_GPU_KILL, tmp_path / "kill-save")
    lines = run.lines("logs/launcher.log")
    at = run.line_no("logs/launcher.log", "GPU 0 memory reclaimed in 38s")
    reclaim = lines[at - 1].replace("22:43:29,110", "22:43:29,900").replace("in 38s", "in 0s")
    lines[at - 1], lines[at] = lines[at], reclaim
    run.write_lines("logs/launcher.log", lines)
    scenario = _scenario_run(run)
    failures = scenario.phase_failures({"gpu_reclaim": 0.001})
    assert len(failures) == 1 and "negative" in failures[0], failures


def test_the_report_marks_shared_gpu_timings_and_the_reclaim_is_a_phase(tmp_path: Path) -> None:
    from pytest_nvrx.report.main import report_main
    from pytest_nvrx.report.model import ScenarioReport

    run = _shared(tmp_path, OTHERS)
    scenario = ScenarioReport.from_run_dir(run.root)
    assert scenario.gpu_shared_with == tuple(OTHERS)
    assert ScenarioReport.from_dict(scenario.as_dict()) == scenario
    assert scenario.recovery is not None
    phases = {p.id: p.seconds for p in scenario.recovery.phases}
    # 38 s of waiting for the GPU's memory is its own phase; the stop itself took 2.3 s
    assert phases["gpu_reclaim"] is not None and 38.0 <= phases["gpu_reclaim"] < 39.0
    assert phases["termination"] is not None and phases["termination"] < 3.0
    assert scenario.recovery.unattributed_s == 0.0
    html = tmp_path / "out" / "r.html"
    out, err = io.StringIO(), io.StringIO()
    assert report_main([str(run.root), "-o", str(html)], out, err) == 0, err.getvalue()
    page = html.read_text()
    assert "Timings measured on a shared GPU" in page and OTHERS[0] in page
    doc = json.loads(html.with_suffix(".json").read_text())
    assert doc["scenarios"][0]["gpu_shared_with"] == OTHERS
    # a CPU run waits for no GPU: a phase of 0, not a missing one
    cpu = ScenarioReport.from_run_dir(DATA / "windows" / "cpu" / "ref-kill-save")
    assert cpu.recovery is not None
    assert {p.id: p.seconds for p in cpu.recovery.phases}["gpu_reclaim"] == 0.0


SHARED = DATA / "gpu-shared"
SHARED_FAULTS = [
    "kill-save",
    "hang-finalize",
    "term-finalize",
    "segv-step",
    "exception-step",
    "ckpt-worker-finalize",
]


def _full_id(name: str) -> str:
    return str(json.loads((SHARED / name / "run.json").read_text())["run_id"])


def test_a_real_shared_gpu_matrix_records_who_shared_and_is_refused_by_the_gate() -> None:
    """tests/data/gpu-shared: four Megatron scenarios at a time on one H200. Each run's
    result.json names the runs that held its GPU meanwhile (all of them runs of this matrix
    whose launches overlapped its own); every criterion passes; the gate refuses them all."""
    ids = {name: _full_id(name) for name in ["baseline", *SHARED_FAULTS]}
    spans = {
        name: (
            json.loads((SHARED / name / "result.json").read_text())["start_time"],
            json.loads((SHARED / name / "result.json").read_text())["end_time"],
        )
        for name in ids
    }
    by_id = {run_id: name for name, run_id in ids.items()}
    waits = {}
    for name in SHARED_FAULTS:
        judgement = judge_run_dir(SHARED / name, baseline=SHARED / "baseline")
        waits[name] = judgement.timings["gpu_memory_reclaim_s"]
        assert judgement.passed, [v.reason for v in judgement.verdicts if not v.passed]
        shared = judgement.gpu_shared_with
        assert shared is not None and 3 <= len(shared) <= 6, shared
        start, end = spans[name]
        for other in shared:
            theirs = spans[by_id[other]]  # a run of this matrix ...
            assert theirs[0] <= end and theirs[1] >= start  # ... that overlapped this one
        run = ScenarioRun(name, None, RunLayout.for_run(SHARED / name), judgement)
        (refused,) = run.gate_failures(Limits(downtime_s=300.0))
        assert refused.startswith("cannot hold the run to --nvrx-max-downtime")
        assert run.gate_failures(Limits(downtime_s=300.0, shared_gpu=True)) == []
    assert (
        waits["kill-save"] == 32.0 and waits["segv-step"] == 22.0 and waits["hang-finalize"] == 2.0
    )
