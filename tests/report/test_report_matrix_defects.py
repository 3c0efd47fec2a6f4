"""Report defects seen on the committed reference and H200 matrices (issue #23, item 5).

Each test names the matrix it was seen on; the run dirs are the committed real runs.
"""

from __future__ import annotations

import dataclasses
import io
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.criteria.outcome import run_outcome
from pytest_nvrx.report import ScenarioReport, render_html, report_json, report_main
from pytest_nvrx.report.svg import loss_svg, timeline_svg
from pytest_nvrx.report.svg_shapes import CYCLE_COLORS, WIDTH

DATA = Path(__file__).parents[1] / "data"
WINDOWS_CPU = DATA / "windows" / "cpu"
WINDOWS_GPU = DATA / "windows" / "gpu"
RECIPE = DATA / "gpu-recipe"


def reports_of(folder: Path) -> list[ScenarioReport]:
    return [ScenarioReport.from_run_dir(d) for d in sorted(folder.iterdir()) if d.is_dir()]


@pytest.fixture(scope="module")
def reference_matrix() -> list[ScenarioReport]:
    """8 reference fault scenarios; one records a note the others do not."""
    return reports_of(WINDOWS_CPU)


@pytest.fixture(scope="module")
def gpu_matrix() -> list[ScenarioReport]:
    """17 Megatron scenarios on two H200s, the baseline among them."""
    return reports_of(WINDOWS_GPU)


# 1. the stack


def test_a_note_is_no_difference_of_stack(reference_matrix: list[ScenarioReport]) -> None:
    notes = {tuple(r.stack["notes"]) for r in reference_matrix}
    assert len(notes) == 2  # ckpt-worker-finalize notes its persistent writer
    html = render_html(reference_matrix)
    assert "Stacks differ" not in html
    assert "<b>Stack:</b> Python 3.12.1 · torch 2.15.0+cu132" in html
    doc = report_json(reference_matrix)
    assert doc["stack"] is not None and doc["stack"]["torch"] == "2.15.0+cu132"
    assert "notes" not in doc["stack"]  # not shared: not the common stack's
    assert html.count("<table class=stack>") == 1


def test_a_real_difference_names_the_field_and_the_scenarios(
    reference_matrix: list[ScenarioReport],
) -> None:
    first, *rest = reference_matrix
    other = dataclasses.replace(first, stack={**first.stack, "torch": "2.14.0+cu130"})
    html = render_html([other, *rest])
    line = re.search(r"<p class=small>Stacks differ[^\n]*</p>", html)
    assert line is not None, html[:3000]
    text = line[0]
    assert "torch" in text and "2.14.0+cu130" in text and "2.15.0+cu132" in text
    assert first.name in text and rest[0].name in text
    assert "notes" not in text and "python" not in text.lower()
    assert report_json([other, *rest])["stack"] is None


# 2. the downtime gate


def test_a_scenario_failing_only_the_gate_shows_a_red_cell(
    reference_matrix: list[ScenarioReport],
) -> None:
    kill = next(r for r in reference_matrix if r.name == "ref-kill-step")
    assert all(c.status == "PASS" for c in kill.criteria)
    why = "downtime 7.525 s exceeds the limit 5 s (--nvrx-max-downtime)"
    held = run_outcome(judge_run_dir(Path(kill.run_dir)), limits=why)
    gated = kill.held_to(held, why, max_downtime_s=5.0)
    assert not gated.passed
    html = render_html([gated, reference_matrix[0]])
    matrix = html[html.index("<table class=matrix>") : html.index("</table>")]
    assert "time limits" in matrix
    cell = re.search(r'<td class="FAIL" title="([^"]*)">', matrix)
    assert cell is not None, matrix
    assert why in cell[1]
    assert f'id="{_anchor(gated)}-time-limits"' in html  # the detail the cell links to
    # held to a limit and within it: a green cell saying which; held to none: no verdict
    first = reference_matrix[0]
    kept = first.held_to(run_outcome(judge_run_dir(Path(first.run_dir))), None, max_downtime_s=60.0)
    page = render_html([kept, kill])
    matrix = page[page.index("<table class=matrix>") : page.index("</table>")]
    assert 'class="FAIL"' not in matrix
    assert re.search(r'<td class="PASS" title="within the limits: downtime ≤ 60 s"', matrix)
    assert matrix.count('<td title="not held to a time limit">—</td>') == 1


def _anchor(report: ScenarioReport) -> str:
    return "s-" + re.sub(r"[^\w-]", "-", report.name)


# 3. the reference workload's checkpoint load


def test_the_reference_load_line_is_the_checkpoint_loaded_milestone() -> None:
    report = ScenarioReport.from_run_dir(WINDOWS_CPU / "ref-kill-step")
    recovery = report.recovery
    assert recovery is not None and recovery.downtime_s == 7.525
    by_id = {m.id: m for m in recovery.milestones}
    loaded = by_id["checkpoint_loaded"]
    # 0: [ref] 2026-11-30T16:27:43.108+00:00 rank 0 load checkpoint iteration 5 (...)
    assert loaded.t_s is not None and loaded.ref is not None
    assert re.fullmatch(r"logs/train_cycle1\.log:[56]", loaded.ref), loaded.ref
    assert by_id["workers_started"].t_s is not None
    assert by_id["workers_started"].t_s <= loaded.t_s <= by_id["first_step"].t_s  # type: ignore[operator]
    phases = {p.id: p for p in recovery.phases}
    assert all(p.seconds is not None and p.missing is None for p in phases.values()), phases
    assert recovery.unattributed_s == 0.0
    assert sum(p.seconds or 0.0 for p in phases.values()) == pytest.approx(7.525, abs=0.006)
    assert recovery.lost_work.restored_iteration == 5
    kinds = {e.kind for e in report.timeline.events}
    assert {"checkpoint_loaded", "first_step"} <= kinds


# 4. a run whose fault never landed


def test_a_setup_failure_row_shows_no_python_none() -> None:
    report = ScenarioReport.from_run_dir(DATA / "setup-failure" / "ref-setup-failure")
    assert report.recovery is not None and report.recovery.milestones[0].t_s is None
    # its column in the recovery cost table of a matrix with a recovered scenario
    html = render_html([report, ScenarioReport.from_run_dir(WINDOWS_CPU / "ref-kill-step")])
    cost = html[html.index("<table class=cost>") :]
    cost = cost[: cost.index("</table>")]
    assert "None" not in cost
    assert "no fault landed" in cost


# 5. 17 scenarios on one page


def test_wide_tables_scroll_instead_of_overflowing(gpu_matrix: list[ScenarioReport]) -> None:
    assert len(gpu_matrix) == 17
    html = render_html(gpu_matrix)
    assert re.search(r"\.wide\{[^}]*overflow-x:auto", html)
    for table in ("<table class=matrix>", "<table class=cost>"):
        at = html.index(table)
        assert html[:at].endswith('<div class="wide">'), table


def _labels_past_the_edge(svg: str) -> list[str]:
    """Milestone labels (bold, 11 px) whose text would run past the SVG's right edge, at the
    6.6 px a character the charts reserve."""
    out = []
    for m in re.finditer(
        r'<text x="([\d.]+)" y="[\d.]+" font-size="11" text-anchor="(start|end)"'
        r' fill="(?!#fff)[^"]*" font-weight="bold">([^<]*)</text>',
        svg,
    ):
        x, anchor, text = float(m[1]), m[2], m[3]
        right = x + len(text) * 6.6 if anchor == "start" else x
        if right > WIDTH:
            out.append(text)
    return out


@pytest.mark.parametrize(
    "run_dir", [WINDOWS_CPU / "ref-hang-finalize", WINDOWS_GPU / "g2-exception-save"]
)
def test_timeline_labels_stay_inside_the_chart(run_dir: Path) -> None:
    svg = timeline_svg(ScenarioReport.from_run_dir(run_dir))
    assert "first committed step" in svg
    assert _labels_past_the_edge(svg) == []


# 6. Megatron #6237


def test_a_second_line_mean_is_marked_not_drawn_as_that_iterations_loss() -> None:
    kill = ScenarioReport.from_run_dir(RECIPE / "megatron-kill-40")
    baseline = ScenarioReport.from_run_dir(RECIPE / "megatron-baseline-40")
    means = {(p.cycle, p.iteration): p.mean_from for p in kill.loss.points if p.mean_from}
    # each process's second line: cycle 0's iteration 2, cycle 1's (restored at 5) iteration 7
    assert means == {(0, 2): 1, (1, 7): 6}
    assert ScenarioReport.from_dict(kill.as_dict()) == kill
    svg = loss_svg(kill, baseline)
    assert svg is not None
    assert "#6237 mean, not this iteration&#x27;s loss" in svg
    lines: dict[str, list[int]] = {}
    for m in re.finditer(r'<polyline points="([^"]*)" fill="none" stroke="([^"]*)"', svg):
        lines.setdefault(m[2], []).append(len(m[1].split()))
    dots = Counter(re.findall(r'<circle cx="[^"]*" cy="[^"]*" r="[^"]*" fill="(#[^"]*)"', svg))
    # the line breaks at iteration 7 (no segment 6-8 off cycle 0's line): 6 alone, then 8-40
    cycle1 = [p for p in kill.loss.points if p.cycle == 1]
    assert (lines[CYCLE_COLORS[1]], dots[CYCLE_COLORS[1]]) == ([len(cycle1) - 2], 1)
    assert (lines["#888"], dots["#888"]) == ([len(baseline.loss.points) - 2], 1)  # 1, then 3-40
    # the reference workload prints each iteration's own loss: nothing to mark
    reference = ScenarioReport.from_run_dir(WINDOWS_CPU / "ref-kill-step")
    assert not any(p.mean_from for p in reference.loss.points)


# 7. a file among the RUN_DIRs


def test_a_file_among_the_run_dirs_is_skipped(tmp_path: Path) -> None:
    cpu = DATA / "cpu"
    args = [str(p) for p in sorted(cpu.iterdir())]
    assert str(cpu / "README.md") in args
    done = subprocess.run(
        [sys.executable, "-m", "pytest_nvrx", "report", *args, "-o", str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"report: skipped {cpu / 'README.md'}: not a directory\n" in done.stderr
    assert done.stdout.count(": QUALIFIED") == 3
    # nothing but files: no run dir remains
    out, err = io.StringIO(), io.StringIO()
    only = [str(cpu / "README.md"), "-o", str(tmp_path / "n.html")]
    assert report_main(only, out, err) == 2
    assert "skipped" in err.getvalue() and "report: error: no run directory" in err.getvalue()
    assert not (tmp_path / "n.html").exists()


# 8. ids


def test_ids_are_unique_in_the_page(gpu_matrix: list[ScenarioReport]) -> None:
    html = render_html(gpu_matrix)
    ids = Counter(re.findall(r'\bid="([^"]*)"', html))
    assert [i for i, n in ids.items() if n > 1] == []
    # the hatch the breakdown's unattributed time is filled with is still defined
    for ref in set(re.findall(r"url\(#([^)]*)\)", html)):
        assert ids[ref] == 1, ref
