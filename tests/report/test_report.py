"""The recovery report (pytest_nvrx.report) over the committed real runs (CPU reference, H200).

How long a report takes is measured by ``benchmarks/`` style scripts, not asserted here (see
docs/report.md: every committed run dir builds in well under 2 s; the slowest ~0.03 s).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_nvrx.report import (
    MILESTONES,
    PHASES,
    SCHEMA_VERSION,
    ScenarioReport,
    render_html,
    report_json,
    report_main,
)
from tests.helpers.recipe_runs import DROPPED, whole

DATA = Path(__file__).parents[1] / "data"
RECIPE = DATA / "gpu-recipe"
REPO = Path(__file__).parents[2]

# every committed run directory (one with logs/), whatever it holds
RUN_DIRS = sorted({p.parent for p in DATA.rglob("logs") if p.is_dir()})


def external_references(html: str) -> list[str]:
    """What a browser would fetch from elsewhere: scripts, stylesheets, images, frames, fonts, CSS
    imports and urls, and links to http(s) (quoted log text may *mention* a URL: that is text)."""
    found: list[str] = []
    found += re.findall(
        r"<(?:script|link|img|iframe|object|embed|video|audio|source)\b[^>]*>", html
    )
    found += re.findall(
        r"""\b(?:src|href|xlink:href|srcset|data)\s*=\s*["']?\s*(?:https?:)?//[^"'\s>]*""", html
    )
    found += re.findall(r"@import[^;]*;", html)
    found += [u for u in re.findall(r"url\(([^)]*)\)", html) if not u.strip("'\" ").startswith("#")]
    return found


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/data/gpu-recipe's suite runs as whole runs: with the result.json the device's
    packer dropped, as their harness printed it (tests/helpers/recipe_runs.py)."""
    dest = tmp_path_factory.mktemp("gpu-recipe")
    for name in DROPPED:
        whole(RECIPE / name, dest)
    return dest


@pytest.fixture(scope="module")
def megatron(recipe: Path) -> list[ScenarioReport]:
    """The H200 matrix of the example report: baseline, kill, hang (Megatron, NVRx 0.7)."""
    names = ("megatron-baseline-40", "megatron-kill-40", "megatron-hang-40")
    return [ScenarioReport.from_run_dir(recipe / name) for name in names]


@pytest.mark.parametrize("run_dir", RUN_DIRS, ids=lambda p: str(p.relative_to(DATA)))
def test_every_committed_run_dir_reports(run_dir: Path) -> None:
    report = ScenarioReport.from_run_dir(run_dir)
    assert report.criteria, "no criterion judged"
    html = render_html([report])
    assert report.name in html
    assert external_references(html) == []
    doc = json.loads(json.dumps(report_json([report])))
    # plain data both ways: what an xdist worker ships to the controller comes back equal
    assert ScenarioReport.from_dict(doc["scenarios"][0]) == report
    if report.baseline:
        assert report.recovery is None and report.downtime_s is None
    for recovery in report.fault_recoveries:  # a schedule's: one per fault
        if recovery.downtime_s is None:
            continue
        known = [p.seconds for p in recovery.phases if p.seconds is not None]
        assert recovery.unattributed_s is not None
        # known phases, the restore the next fault cut short and the time no milestone accounts
        # for make the downtime (ms rounding)
        restoring = recovery.restoring_s or 0.0
        assert sum(known) + restoring + recovery.unattributed_s == pytest.approx(
            recovery.downtime_s, abs=0.007
        )
        if len(known) + len(recovery.unreached) == len(PHASES):
            assert recovery.unattributed_s == 0.0


def test_breakdown_of_a_kill_matches_verify_and_sums_to_the_downtime(
    megatron: list[ScenarioReport],
) -> None:
    kill = megatron[1]
    recovery = kill.recovery
    assert recovery is not None
    seconds = {p.id: p.seconds for p in recovery.phases}
    assert list(seconds) == [p.id for p in PHASES]
    assert all(v is not None and v >= 0 for v in seconds.values()), seconds
    # the numbers verify prints for this run (tests/data/gpu-recipe/README.md)
    assert seconds["detection"] == kill.timings["failure_to_detected_s"] == 0.197
    assert seconds["checkpoint_load"] == kill.timings["replacement_start_to_checkpoint_loaded_s"]
    assert recovery.downtime_s == kill.timings["failure_to_first_iteration_after_restore_s"]
    assert kill.downtime_s == 25.417
    assert sum(v for v in seconds.values() if v is not None) == pytest.approx(25.417, abs=0.006)
    lost = recovery.lost_work
    assert (lost.restored_iteration, lost.last_iteration_before_failure, lost.iterations) == (
        5,
        10,
        5,
    )
    # iteration 5 committed at 12:07:38.07 (train_cycle0.log), the kill came at 12:07:44.736:
    # the first save's ~6.6 s (checkpoint worker start) are work the fault threw away too
    assert lost.discarded_s == 6.664
    assert lost.recomputed_s is not None and lost.recomputed_s > 0
    # every milestone quotes the line that shows it
    assert all(m.ref is not None for m in recovery.milestones), recovery.milestones
    refs = {m.id: m.ref for m in recovery.milestones}
    assert refs["failure"] == "fault_injected.json:46"
    assert refs["detected"] == "logs/launcher.log:40"
    assert refs["workers_terminated"] == "logs/launcher.log:46"


def test_a_phase_the_evidence_lacks_is_missing_not_zero(tmp_path: Path) -> None:
    # Megatron's load line carries no time: without the setup_done milestone after it (the
    # line lost here) the checkpoint-loaded milestone is missing
    run_dir = whole(RECIPE / "megatron-kill-40", tmp_path)
    log = run_dir / "logs" / "train_cycle1.log"
    lines = log.read_text(encoding="utf-8").splitlines(keepends=True)
    setup_done = "[after model, optimizer, and learning rate scheduler are built]"
    log.write_text("".join(line for line in lines if setup_done not in line), encoding="utf-8")
    report = ScenarioReport.from_run_dir(run_dir)
    recovery = report.recovery
    assert recovery is not None and recovery.downtime_s == 25.417
    by_id = {p.id: p for p in recovery.phases}
    for pid in ("checkpoint_load", "first_step"):
        assert by_id[pid].seconds is None
        assert "checkpoint loaded not in the evidence" in (by_id[pid].missing or "")
    assert by_id["detection"].seconds == 0.197 and by_id["detection"].missing is None
    assert recovery.unattributed_s is not None and recovery.unattributed_s > 5
    phase_doc = report_json([report])["scenarios"][0]["recovery"]["phases"]
    assert [p["seconds"] for p in phase_doc if p["id"] == "checkpoint_load"] == [None]
    html = render_html([report])
    assert html.count(">missing</td>") == 2
    assert "not attributed" in html


def test_a_run_that_never_recovered_has_no_downtime(recipe: Path) -> None:
    report = ScenarioReport.from_run_dir(recipe / "megatron-kill-40-distopt")
    assert not report.passed
    assert report.downtime_s is None
    assert report.outcome.startswith("NOT QUALIFIED: optimizer_state_load: cycle 1 died loading")
    # the fault window runs to the end of the evidence: it never closed
    window = report.timeline.fault_window
    assert window is not None and window[1] == report.timeline.end_s
    html = render_html([report])
    assert "not recovered: no step committed after the restore" in html
    assert 'class="FAIL"' in html


def test_loss_curve_pairs_the_baseline_and_marks_replayed_iterations(
    megatron: list[ScenarioReport],
) -> None:
    baseline, kill, hang = megatron
    doc = report_json(megatron)
    assert [s["baseline"] for s in doc["scenarios"]] == [None, baseline.name, baseline.name]
    replayed = [(p.cycle, p.iteration) for p in kill.loss.points if p.replayed]
    assert replayed == [(1, i) for i in range(6, 11)]
    assert [p.iteration for p in hang.loss.points if p.replayed] == list(range(6, 12))
    assert not any(p.replayed for p in baseline.loss.points)
    assert [p.iteration for p in baseline.loss.points] == list(range(1, 41))
    html = render_html(megatron)
    assert "replayed iterations (5)" in html and "replayed iterations (6)" in html
    assert f"baseline ({baseline.name})" in html
    # without the baseline among the inputs there is nothing to draw under the curve
    assert "baseline (" not in render_html([kill])


def test_timeline_has_the_fault_the_milestones_and_the_cycles(
    megatron: list[ScenarioReport],
) -> None:
    hang = megatron[2].timeline
    kinds = {e.kind for e in hang.events}
    assert {
        "fault",
        "failure",
        "detected",
        "workers_terminated",
        "rendezvous",
        "workers_started",
        "checkpoint_loaded",
        "first_step",
        "save_submitted",
        "save_finalized",
        "decision",
    } <= kinds
    fault = next(e for e in hang.events if e.kind == "fault")
    assert fault.rank == 0 and fault.ref == "fault_injected.json:46"
    assert hang.fault_window is not None and hang.fault_window[0] == fault.t_s
    first = next(e for e in hang.events if e.kind == "first_step")
    assert hang.fault_window[1] == first.t_s
    assert [(c.cycle, c.first_iteration, c.last_iteration) for c in hang.cycles] == [
        (0, 1, 11),
        (1, 6, 40),
    ]
    # a hang is detected by the step section's timeout, ~31 s after the stop
    detected = next(e for e in hang.events if e.kind == "detected" and e.t_s > fault.t_s)
    assert 30 < detected.t_s - fault.t_s < 32
    assert [e.t_s for e in hang.events] == sorted(e.t_s for e in hang.events)


def test_report_json_schema_is_stable(megatron: list[ScenarioReport]) -> None:
    doc = json.loads(json.dumps(report_json(megatron)))
    assert doc["schema_version"] == SCHEMA_VERSION == 2
    assert set(doc) == {"schema_version", "tool", "stack", "passed", "scenarios"}
    assert doc["passed"] is True and doc["stack"]["nvrx"] == "0.7.0"
    scenario = doc["scenarios"][1]
    assert set(scenario) == {
        "name",
        "run_dir",
        "workload",
        "fault",
        "window",
        "train_iters",
        "world_size",  # a field added without raising the schema: run.json states it here
        "passed",
        "judgeable",
        "summary",
        "outcome",
        "first_cause",
        "criteria",
        "problems",
        "stack",
        "timings",
        "downtime_s",
        "max_downtime_s",
        "max_phases",
        "gate",
        "gpu_shared_with",
        "recovery",
        "timeline",
        "loss",
        "baseline",
    }
    assert scenario["downtime_s"] == scenario["recovery"]["downtime_s"] == 25.417
    assert scenario["world_size"] == 1
    assert set(scenario["criteria"][0]) == {"id", "status", "reason", "evidence"}
    recovery = scenario["recovery"]
    assert set(recovery) == {"downtime_s", "unattributed_s", "milestones", "phases", "lost_work"}
    assert [m["id"] for m in recovery["milestones"]] == [m for m, _ in MILESTONES]
    assert set(recovery["milestones"][0]) == {"id", "t_s", "ref"}
    assert [p["id"] for p in recovery["phases"]] == [
        "detection",
        "termination",
        "gpu_reclaim",
        "rendezvous",
        "worker_start",
        "checkpoint_load",
        "first_step",
    ]
    assert set(recovery["phases"][0]) == {"id", "label", "seconds", "missing"}
    assert set(recovery["lost_work"]) == {
        "restored_iteration",
        "last_iteration_before_failure",
        "iterations",
        "discarded_s",
        "recomputed_s",
    }
    timeline = scenario["timeline"]
    assert set(timeline) == {"t0", "end_s", "fault_rank", "fault_window", "cycles", "events"}
    assert set(timeline["cycles"][0]) == {
        "cycle",
        "start_s",
        "end_s",
        "ranks",
        "first_iteration",
        "last_iteration",
    }
    assert set(timeline["events"][0]) == {"kind", "t_s", "label", "cycle", "rank", "ref"}
    assert scenario["loss"]["columns"] == ["cycle", "iteration", "loss", "replayed"]
    assert set(scenario["loss"]) == {"columns", "points", "dropped", "window_means"}
    # [cycle, iteration, first iteration of the window the line printed the mean of] (#6237)
    assert scenario["loss"]["window_means"] == [[0, 2, 1], [1, 7, 6]]
    assert doc["scenarios"][0]["recovery"] is None  # the baseline


def test_html_is_self_contained_and_small(megatron: list[ScenarioReport]) -> None:
    html = render_html(megatron)
    assert external_references(html) == []
    assert len(html.encode()) < 2 * 1024 * 1024
    # one chart of each kind per scenario, plus the breakdown of both faulted runs
    assert html.count('aria-label="timeline of ') == 3
    assert html.count('aria-label="loss curve of ') == 3
    assert html.count('aria-label="recovery cost breakdown"') == 1


def test_external_references_finds_what_a_browser_would_fetch() -> None:
    # the check above must be able to fail
    for bad in (
        '<script src="https://cdn.example/plotly.js"></script>',
        '<link rel=stylesheet href="http://x/y.css">',
        "<style>@import 'https://x/y.css';</style>",
        '<div style="background:url(https://x/y.png)"></div>',
        '<a href="//cdn.example/x">x</a>',
    ):
        assert external_references(f"<p>ok</p>{bad}") != [], bad
    text = '<div class="ev">see https://pytorch.org/docs (quoted)</div><rect fill="url(#hatch)"/>'
    assert external_references(text) == []


def test_report_command_writes_html_and_json(recipe: Path, tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    html = tmp_path / "r.html"
    runs = [str(recipe / "megatron-baseline-40"), str(recipe / "megatron-kill-40")]
    assert report_main([*runs, "-o", str(html)], out, err) == 0, err.getvalue()
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [s["name"] for s in doc["scenarios"]] == ["megatron-baseline-40", "megatron-kill-40"]
    assert "megatron-kill-40: QUALIFIED (downtime 25.4 s)" in out.getvalue()
    assert html.read_text().startswith("<!DOCTYPE html>")
    failing = [str(recipe / "megatron-kill-40-distopt"), "--json", str(tmp_path / "x.json")]
    assert report_main([*failing, "-o", str(tmp_path / "x.html")], out, err) == 1
    assert "NOT QUALIFIED: optimizer_state_load" in out.getvalue()
    assert report_main([str(tmp_path / "nope"), "-o", str(tmp_path / "n.html")], out, err) == 2
    assert "report: error:" in err.getvalue()


def test_report_core_does_not_import_pytest() -> None:
    code = (
        "import sys, pytest_nvrx.report as r; "
        "r.ScenarioReport.from_run_dir(sys.argv[1]); "
        "bad = [m for m in ('pytest', '_pytest', 'torch') if m in sys.modules]; "
        "print(', '.join(bad)); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(RECIPE / "megatron-kill-40")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 0, f"imported: {proc.stdout} {proc.stderr}"


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")
def test_screenshot_script_renders_the_page(megatron: list[ScenarioReport], tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(render_html(megatron), encoding="utf-8")
    png = tmp_path / "shot.png"
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "screenshot_report.sh"), str(page), str(png), "1100x1600"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000


def test_the_phase_ids_settings_know_are_the_reports() -> None:
    """settings reads --nvrx-max-phase against layout.PHASE_IDS (it imports no report)."""
    from pytest_nvrx.layout import PHASE_IDS
    from pytest_nvrx.report.model import PHASES

    assert tuple(spec.id for spec in PHASES) == PHASE_IDS
