"""Every recovery of a fault schedule measured (issue #35): the committed CPU and GPU schedule
runs re-judged, each fault's recovery by its own recovery clock, through every output that shows
it: verify (text and JSON), the console's closing table, the report (HTML and report.json), JUnit
and the downtime gate; doctored copies whose later recovery cannot be measured fail the gate, and
a fault never detected has no timing.

The figures are not written down here: each is read from the run's own files (the markers'
instants) or from the judgement's recovery clock, then looked for in every output.
"""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from datetime import datetime
from html import escape
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.criteria.judgement import Judgement
from pytest_nvrx.criteria.outcome import run_outcome
from pytest_nvrx.evidence.timeline import RUN_TIMINGS
from pytest_nvrx.layout import RunLayout, marker_name
from pytest_nvrx.report import ScenarioReport, render_html, report_json
from pytest_nvrx.session import junit
from pytest_nvrx.session.scenario_run import Limits, ScenarioRun
from pytest_nvrx.session.verdict_table import Row, verdict_table
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import Doctor, copy_run

pytest_plugins = ["pytester"]

DATA = Path(__file__).parents[1] / "data"
#: every committed fault-schedule run, CPU and GPU
SCHEDULE_RUNS = sorted(
    [p.parent for p in DATA.glob("*-schedules/**/run.json")]
    + [p.parent for p in DATA.glob("gpu-first-night/*schedule*/run.json")]
    + [DATA / "gpu-first-night" / "cli-kill-step_hang-restore-setup150"]
)
CPU = DATA / "cpu-schedules"
TWO = CPU / "ref-kill-step+kill-restore"
FINALIZE = CPU / "ref-hang-finalize+ckpt-worker-finalize"
BUDGET = CPU / "ref-budget-kill-step+kill-restore+kill-restore"
GPU_TWO = DATA / "gpu-schedules" / "core_v0.19.0" / "megatron-schedule-kill-step_kill-restore"
GPU_THREE = (
    DATA
    / "gpu-schedules"
    / "core_v0.19.0"
    / "megatron-schedule-kill-step_kill-step_ckpt-worker-finalize"
)
#: kill@step,hang@restore that the 45 s run timeout ended before the hang was detected
TIMED_OUT = DATA / "cpu-timed-out-schedule" / "ref-kill-step+hang-restore-timeout"
#: the QUALIFIED kill@step,kill@restore runs: the reference's and Megatron's on both revisions
#: and on a freshly extracted checkout
KILL_STEP_KILL_RESTORE = [
    p for p in SCHEDULE_RUNS if p.name in ("ref-kill-step+kill-restore", GPU_TWO.name)
]


def _id(path: Path) -> str:
    return str(path.relative_to(DATA))


def _marker_time(run: Path, position: int) -> datetime:
    return datetime.fromisoformat(json.loads((run / marker_name(position)).read_text())["time"])


def _markers(run: Path) -> int:
    return sum(1 for k in range(1, 10) if (run / marker_name(k)).exists())


def _scenario(run: Path, judgement: Judgement | None = None) -> ScenarioRun:
    judged = judgement if judgement is not None else judge_run_dir(run)
    return ScenarioRun(run.name, None, RunLayout.for_run(run), judged)


def _plural(n: int) -> str:
    return f"{n} recover{'y' if n == 1 else 'ies'}"


def test_the_committed_schedule_runs_are_all_here() -> None:
    assert len(SCHEDULE_RUNS) == 17
    assert [_id(p) for p in KILL_STEP_KILL_RESTORE] == [
        "cpu-schedules/ref-kill-step+kill-restore",
        "gpu-first-night/megatron-schedule-kill-step_kill-restore",
        "gpu-schedules/core_v0.18.2/megatron-schedule-kill-step_kill-restore",
        "gpu-schedules/core_v0.19.0/megatron-schedule-kill-step_kill-restore",
    ]


@pytest.mark.parametrize("run", SCHEDULE_RUNS, ids=_id)
def test_every_fault_of_a_schedule_has_its_own_measured_recovery(run: Path) -> None:
    j = judge_run_dir(run)
    assert j.passed, run_outcome(j).summary
    n = _markers(run)
    assert [(r.position, r.fault) for r in j.recoveries] == [
        (k, j.schedule[k - 1]) for k in range(1, n + 1)
    ]
    due = [r for r in j.recoveries if r.due]
    for r in j.recoveries:
        assert r.outcome != "not recovered", r.label
        if r.outcome == "struck":
            # down from its fault to the next fault, which struck its replacement's restore
            assert json.loads((run / marker_name(r.position + 1)).read_text())["window"] == (
                "restore"
            )
            down = (
                _marker_time(run, r.position + 1) - _marker_time(run, r.position)
            ).total_seconds()
            assert r.downtime_s == pytest.approx(down, abs=0.001)
            assert r.unreached == ("checkpoint_load", "first_step")
        elif r.outcome == "stopped":
            assert r is j.recoveries[-1] and r.downtime_s is None
        else:
            # the fault to its first committed step after the restore: verify's own timing
            assert r.downtime_s == r.timings()["failure_to_first_iteration_after_restore_s"] > 0
    # the run's timings are the whole run's: no fault's figure stands for the run's
    assert set(j.timings) <= RUN_TIMINGS
    assert j.recovery_count == len(due)
    total = j.total_downtime_s
    assert total is not None
    assert total == pytest.approx(sum(r.downtime_s or 0.0 for r in due), abs=0.003)


@pytest.mark.parametrize("run", KILL_STEP_KILL_RESTORE, ids=_id)
def test_kill_step_kill_restore_shows_two_recoveries(run: Path) -> None:
    j = judge_run_dir(run)
    first, second = j.recoveries
    assert (first.outcome, first.struck_by, second.outcome) == ("struck", 2, "recovered")
    assert first.downtime_s is not None and second.downtime_s is not None
    assert first.note() == "struck while restoring by fault 2" and second.note() is None
    assert j.recovery_count == 2


@pytest.mark.parametrize("run", SCHEDULE_RUNS, ids=_id)
def test_verify_text_and_json_show_every_recovery_and_the_total(run: Path) -> None:
    j = judge_run_dir(run)
    out, err = io.StringIO(), io.StringIO()
    assert verify_main([str(run), "--json", "-"], out, err) == 0
    data, text = json.loads(out.getvalue()), err.getvalue()
    assert set(data["timings"]) <= RUN_TIMINGS
    assert [
        (r["position"], r["fault"], r["outcome"], r["downtime_s"]) for r in data["recoveries"]
    ] == [(r.position, r.fault, r.outcome, r.downtime_s) for r in j.recoveries]
    assert data["total_downtime_s"] == j.total_downtime_s
    n = len(j.schedule)
    for r in j.recoveries:
        head = f"fault {r.position} of {n}, {r.fault}: "
        (line,) = [x for x in text.splitlines() if x.startswith(head)]
        if r.due:
            assert line.startswith(f"{head}downtime {r.downtime_s:.1f}s"), line
        if r.outcome == "struck":
            assert f"struck while restoring by fault {r.position + 1}" in line
        assert data["recoveries"][r.position - 1]["timings"] == r.timings()
    total = f"schedule downtime: {j.total_downtime_s:.1f}s in total, {_plural(j.recovery_count)}"
    assert total in text.splitlines()
    assert "not recovered" not in text


@pytest.mark.parametrize("run", SCHEDULE_RUNS, ids=_id)
def test_the_console_row_shows_the_total_and_a_row_per_fault(run: Path) -> None:
    j = judge_run_dir(run)
    row = _scenario(run, j).table_row()
    assert Row.from_dict(json.loads(json.dumps(row.as_dict()))) == row
    lines = verdict_table([row], width=240)
    head = lines[2].split()
    shared = " *" if j.gpu_shared else ""
    assert lines[2].startswith(f"{run.name} ({_plural(j.recovery_count)}){shared} ")
    assert "QUALIFIED" in head and f"{j.total_downtime_s:.1f}s" in head
    faults = [line for line in lines if line.startswith("  fault ")]
    assert len(faults) == len(j.recoveries)
    for line, r in zip(faults, j.recoveries, strict=True):
        cells = line.split()
        assert cells[:3] == ["fault", str(r.position), r.fault]
        assert cells[3] == (f"{r.downtime_s:.1f}s" if r.due else "—")
        if r.outcome == "struck":
            assert line.endswith(f"struck while restoring by fault {r.position + 1}")
    assert not any("not recovered" in line for line in lines)


@pytest.mark.parametrize("run", SCHEDULE_RUNS, ids=_id)
def test_the_report_shows_the_schedule_and_a_bar_per_fault(run: Path) -> None:
    j = judge_run_dir(run)
    report = ScenarioReport.from_run_dir(run)
    html = render_html([report])
    matrix = html[html.index("<table class=matrix>") : html.index("</table>")]
    assert f"<td>{escape(', '.join(j.schedule))}</td>" in matrix
    assert f"{j.total_downtime_s:.3f}<br><span class=small>total," in matrix
    cost = html[html.index("<h2>Recovery cost</h2>") :]
    chart = cost[: cost.index("</svg>")]
    assert f"{run.name}: {j.total_downtime_s:.1f} s down in total" in chart
    for r in j.recoveries:
        assert f">fault {r.position} {escape(r.fault)}</text>" in chart
        if r.outcome == "struck":
            assert f"{r.downtime_s:.1f} s down: struck while restoring by fault" in chart
    # a QUALIFIED row's bars: no red "not recovered"
    assert "not recovered" not in html
    doc = json.loads(json.dumps(report_json([report])))
    (scenario,) = doc["scenarios"]
    assert scenario["schedule"] == list(j.schedule)
    assert scenario["downtime_s"] == scenario["total_downtime_s"] == j.total_downtime_s
    assert [(r["position"], r["outcome"], r["downtime_s"]) for r in scenario["recoveries"]] == [
        (r.position, r.outcome, r.downtime_s) for r in j.recoveries
    ]
    assert ScenarioReport.from_dict(scenario) == report


def test_an_older_report_json_of_a_schedule_still_reads() -> None:
    """A document written before a schedule's recoveries (no ``schedule``, ``recoveries``,
    ``total_downtime_s``, ``fault_windows``) reads and renders as the one recovery it has."""
    report = ScenarioReport.from_run_dir(TWO)
    older = report.as_dict()
    for key in ("schedule", "recoveries", "total_downtime_s"):
        del older[key]
    del older["timeline"]["fault_windows"]
    for key in ("position", "fault", "outcome", "struck_by", "stopped", "restoring_s", "unreached"):
        del older["recovery"][key]
    read = ScenarioReport.from_dict(older)
    assert read.schedule == () and read.recoveries == () and read.timeline.fault_windows == ()
    assert read.fault_recoveries == (read.recovery,) and read.downtime_s == 7.735
    assert read.name in render_html([read])


@pytest.mark.parametrize("run", SCHEDULE_RUNS, ids=_id)
def test_junit_properties_carry_every_recovery(run: Path) -> None:
    j = judge_run_dir(run)
    props = dict(junit.run_properties(_scenario(run, j)))
    assert not any(
        k.startswith("nvrx_timing_") and k.removeprefix("nvrx_timing_") not in RUN_TIMINGS
        for k in props
    )
    assert props["nvrx_schedule_downtime_s"] == str(j.total_downtime_s)
    assert props["nvrx_recoveries"] == str(j.recovery_count)
    for r in j.recoveries:
        head = f"nvrx_fault{r.position}"
        assert props[head] == r.fault and props[f"{head}_outcome"] == r.outcome
        assert props.get(f"{head}_downtime_s") == (str(r.downtime_s) if r.due else None)
        for key, value in r.timings().items():
            assert props[f"{head}_timing_{key}"] == str(value)
        for phase in r.phases:
            assert props.get(f"{head}_phase_{phase.id}_s") == (
                str(phase.seconds) if phase.seconds is not None else None
            )


# -- the downtime gate and the phase limits: every recovery -------------------------------------


def test_the_gate_holds_each_recovery_not_only_the_first() -> None:
    """Megatron's kill@step,kill@step,ckpt-worker@finalize: a limit between its third
    recovery's downtime and the others' fails on the third alone."""
    j = judge_run_dir(GPU_THREE)
    downs = [r.downtime_s for r in j.recoveries]
    assert all(d is not None for d in downs)
    *others, third = (d or 0.0 for d in downs)
    limit = (max(others) + third) / 2
    assert third > limit > max(others)
    failures = _scenario(GPU_THREE, j).gate_failures(Limits(limit, shared_gpu=True))
    assert len(failures) == 1
    assert failures[0].startswith(
        f"fault 3 of 3, ckpt-worker@finalize: downtime {third:.3f} s exceeds the limit {limit:g} s"
    )
    assert "fault 1" not in failures[0] and "fault 2" not in failures[0]


@pytest.mark.parametrize("run", KILL_STEP_KILL_RESTORE, ids=_id)
def test_a_struck_recovery_is_held_by_the_time_it_was_down(run: Path) -> None:
    j = judge_run_dir(run)
    scenario = _scenario(run, j)
    first, second = (r.downtime_s or 0.0 for r in j.recoveries)
    # within a limit above both, and over the load and first step the strike cut off: judged
    # in the second recovery, which restores the same checkpoint
    phases = {"worker_start": 1000.0, "checkpoint_load": 1000.0, "first_step": 1000.0}
    assert scenario.gate_failures(Limits(max(first, second) + 1, phases, shared_gpu=True)) == []
    held = Limits(max(first, second) + 1, phases, shared_gpu=True)
    assert scenario.outcome(held).text == "QUALIFIED"
    (failure,) = scenario.gate_failures(Limits(first - 0.5, shared_gpu=True))
    assert f"fault 1 of 2, kill@step: down {first:.3f} s until fault 2 struck its replacement" in (
        failure
    )
    assert f"fault 2 of 2, kill@restore: downtime {second:.3f} s exceeds" in failure


def test_a_stopped_job_owes_no_recovery_to_the_gate() -> None:
    """After the fault that spent the restart budget no recovery was due: not held to a
    limit, not even to the phases a replacement would have had."""
    scenario = _scenario(BUDGET)
    limits = Limits(1000.0, {"rendezvous": 1000.0, "first_step": 1000.0})
    assert scenario.gate_failures(limits) == []


def _break(doc: Doctor, edit: str) -> None:
    if edit == "second-rendezvous":
        doc.delete("logs/launcher.log", "Cycle: 2 Event: rendezvous_completed")
    elif edit == "second-first-step":
        # no step committed after the second restore (its replacement's iterations gone): the
        # workers stopped there, so the launcher did not exit 0
        doc.truncate_after("logs/train_cycle2.log", "load checkpoint iteration 10")
        doc.set_json("result.json", exit_code=1)
    elif edit == "struck-rendezvous":
        doc.delete("logs/launcher.log", "Cycle: 1 Event: rendezvous_completed")


@pytest.mark.parametrize(
    ("run", "edit", "limits", "said"),
    [
        pytest.param(
            FINALIZE,
            "second-rendezvous",
            Limits(1000.0, {"rendezvous": 1000.0}),
            "fault 2 of 2, ckpt-worker@finalize: phase rendezvous (terminated → rendezvous) not"
            " measurable, limit 1000 s (--nvrx-max-phase rendezvous=1000): rendezvous not in the"
            " evidence",
            id="second-recovery-without-its-rendezvous",
        ),
        pytest.param(
            FINALIZE,
            "second-first-step",
            Limits(1000.0),
            "fault 2 of 2, ckpt-worker@finalize: no measurable downtime, limit 1000 s"
            " (--nvrx-max-downtime)",
            id="second-recovery-without-a-first-step",
        ),
        pytest.param(
            TWO,
            "struck-rendezvous",
            Limits(1000.0, {"rendezvous": 1000.0, "checkpoint_load": 1000.0}),
            "fault 1 of 2, kill@step: phase rendezvous (terminated → rendezvous) not measurable",
            id="struck-recovery-without-its-rendezvous",
        ),
    ],
)
def test_a_recovery_the_evidence_cannot_measure_fails_the_gate(
    run: Path, edit: str, limits: Limits, said: str, tmp_path: Path
) -> None:
    """The real run keeps to the limits; its copy with one later (or struck) recovery's
    measurement broken does not, the failure naming that recovery. The first recovery's
    measurement is intact in each: a gate over the first recovery alone would pass them."""
    assert _scenario(run).gate_failures(limits) == []
    doc = copy_run(run, tmp_path / run.name)
    _break(doc, edit)
    j = judge_run_dir(doc.root)
    assert j.judgeable, j.unjudgeable_reasons
    if edit != "struck-rendezvous":
        assert j.recoveries[0].downtime_s == judge_run_dir(run).recoveries[0].downtime_s
    failures = _scenario(doc.root, j).gate_failures(limits)
    assert any(f.startswith(said) for f in failures), failures
    # a struck recovery is excused only the load and first step the strike cut off
    assert not any("phase checkpoint_load" in f for f in failures), failures


def test_a_fault_never_detected_has_no_timing(tmp_path: Path) -> None:
    """The harness killed the run before its second fault was detected (kill@step, then a
    kill into the restore the launcher never saw): no timing of the run or of the second fault
    is the first fault's, and the gate finds nothing to measure for the second."""
    doc = copy_run(TWO, tmp_path / TWO.name)
    doc.truncate_after("logs/launcher.log", "Section(s) ['setup'] were still open")
    doc.remove("logs/train_cycle2.log")
    doc.remove("cycle_infos/cycle_info..0.2")
    doc.path("cycle_infos/cycle_info..current").write_text("cycle_info..0.1")
    doc.set_json("result.json", timed_out=True, exit_code=-9)
    j = judge_run_dir(doc.root)
    assert not j.passed
    first, second = j.recoveries
    assert "failure_to_detected_s" in first.timings()
    assert second.outcome == "not recovered" and second.timings() == {}
    assert set(j.timings) <= RUN_TIMINGS and j.total_downtime_s is None
    out, err = io.StringIO(), io.StringIO()
    verify_main([str(doc.root), "--json", "-"], out, err)
    data = json.loads(out.getvalue())
    assert "failure_to_detected_s" not in data["timings"]
    assert data["recoveries"][1]["timings"] == {} and data["total_downtime_s"] is None
    (line,) = [x for x in err.getvalue().splitlines() if x.startswith("fault 2 of 2")]
    assert line == (
        "fault 2 of 2, kill@restore: downtime —, not recovered: no step committed after the restore"
    )
    failure = _scenario(doc.root, j).downtime_failure(1000.0)
    assert failure is not None and "fault 2 of 2, kill@restore: no measurable downtime" in failure


def test_a_real_run_the_timeout_ended_has_no_timing_for_its_undetected_fault() -> None:
    """The hang struck cycle 1's restore; the run timeout killed the run before anything could
    detect it. The launcher's shutdown recorded a worker's exit after the fault (after its
    ``death signal`` line): no detection, so no timing of the hang's recovery, and none of the
    kill's stands for the run's."""
    j = judge_run_dir(TIMED_OUT)
    assert not j.passed and j.judgeable
    assert "the hang was not detected" in j.verdict("replaced_cycle").reason
    first, second = j.recoveries
    assert (first.outcome, second.outcome) == ("struck", "not recovered")
    assert first.timings()["failure_to_detected_s"] > 0
    # the record of the launcher's own stop is what the fault's timeline found after the fault
    shutdown = second.clock.timeline.detected
    assert shutdown is not None and "failed (exitcode: -15)" in shutdown.ref.text
    assert second.clock.at("detected") is None
    assert second.timings() == {} and second.downtime_s is None
    assert set(j.timings) <= RUN_TIMINGS and j.total_downtime_s is None
    out, err = io.StringIO(), io.StringIO()
    assert verify_main([str(TIMED_OUT), "--json", "-"], out, err) == 1
    data = json.loads(out.getvalue())
    assert "failure_to_detected_s" not in data["timings"]
    assert data["recoveries"][1]["timings"] == {}
    assert "fault 2 of 2, hang@restore: downtime —, not recovered" in err.getvalue()
    props = dict(junit.run_properties(_scenario(TIMED_OUT, j)))
    assert not any(k.startswith("nvrx_fault2_timing_") for k in props)
    assert "nvrx_fault2_downtime_s" not in props and "nvrx_schedule_downtime_s" not in props


# -- the plugin, end to end ---------------------------------------------------------------------


def test_the_plugin_shows_every_recovery(
    pytester: pytest.Pytester, clean_env: None, tmp_path: Path
) -> None:
    """``--nvrx-run-dir`` over the reference's kill@step,kill@restore under the gate: the gate's
    test passes, the closing table shows the total and both faults, the report and JUnit carry
    both recoveries."""
    run = tmp_path / TWO.name
    copy_run(TWO, run)
    html, junit = tmp_path / "report.html", tmp_path / "junit.xml"
    result = pytester.runpytest(
        "--pyargs", "pytest_nvrx.suite", "-p", "no:cacheprovider", "--nvrx-run-dir", str(run),
        "--nvrx-report", str(html), f"--junitxml={junit}", "--nvrx-max-downtime", "600",
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out[-3000:]
    j = judge_run_dir(run)
    first, second = j.recoveries
    result.stdout.fnmatch_lines(
        [
            f"existing-run (2 recoveries)*QUALIFIED*{j.total_downtime_s:.1f}s",
            f"  fault 1 kill@step*{first.downtime_s:.1f}s*",
            "*struck while restoring by fault 2",
            f"  fault 2 kill@restore*{second.downtime_s:.1f}s*",
        ]
    )
    (scenario,) = json.loads((tmp_path / "report.json").read_text())["scenarios"]
    assert [r["outcome"] for r in scenario["recoveries"]] == ["struck", "recovered"]
    cases = {
        case.attrib["name"]: {p.attrib["name"]: p.attrib["value"] for p in case.iter("property")}
        for case in ET.parse(junit).getroot().iter("testcase")
    }
    first_case = cases["test_run_finished[existing-run]"]
    assert first_case["nvrx_fault1_outcome"] == "struck"
    assert first_case["nvrx_fault2_downtime_s"] == str(second.downtime_s)
    gate = cases["test_recovery_downtime[existing-run]"]
    assert gate["nvrx_downtime_s"] == str(j.total_downtime_s)
    assert gate["nvrx_fault1_downtime_s"] == str(first.downtime_s)
    assert gate["nvrx_fault2_downtime_s"] == str(second.downtime_s)
