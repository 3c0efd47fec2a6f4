"""A planted run can never pass for a qualification run (issue #25).

The session's one real self-test of the reference workload (tests/helpers/selftest_runs.py, through
the real launcher and injector) gives the control and the ``rng`` plant judged here. Its planted
run is labelled everywhere it is shown: the marker and run.json name the plant; verify's first
line, its summary and its JSON, the report's row, summary and self-test section, and the JUnit
properties say "planted" first. The report's self-test section shows what a tolerance lets
through: at rtol 0.05 the rng plant is missed. Doctored copies (the originals never edited)
whose run.json, marker and plant records disagree cannot be judged, and each message quotes
both sides.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.evidence.marker import read_marker
from pytest_nvrx.layout import MARKER_NAME, PLANT_RECORDS_DIR, RunLayout
from pytest_nvrx.report import report_main
from pytest_nvrx.session import junit
from pytest_nvrx.session.scenario_run import ScenarioRun
from pytest_nvrx.settings import plants
from pytest_nvrx.verify import verify_main
from pytest_nvrx.worker import injector
from tests.helpers.doctor import KILL_RUN, copy_run
from tests.helpers.selftest_runs import SELFTEST_TEST_TIMEOUT_S
from tests.helpers.selftest_runs import Selftest as SessionSelftest

pytestmark = pytest.mark.timeout(SELFTEST_TEST_TIMEOUT_S)  # the session's self-test: its limit

REPO = Path(__file__).resolve().parents[2]
PLANTED_FIRST = (
    "planted: rng (RNG state not restored): a self-test run with a known recovery bug planted "
    "on purpose, never a qualification"
)
#: a tolerance the rng plant's replay differences stay within (the largest measured: 0.0141),
#: checked against the run's own verdict below
LOOSE_RTOL = 0.05


@dataclass(frozen=True)
class Selftest:
    control: Path
    rng: Path
    doc: dict[str, Any]


@pytest.fixture(scope="module")
def selftest(reference_selftest: SessionSelftest) -> Selftest:
    """The control and the rng plant of the session's one reference self-test
    (tests/helpers/selftest_runs.py; its whole catalogue ran, these two are judged here)."""
    doc = reference_selftest.document
    return Selftest(reference_selftest.run_dir("control"), reference_selftest.run_dir("rng"), doc)


def verify(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = verify_main(list(args), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def report(tmp_path: Path, *args: str) -> tuple[int, str, dict[str, Any], str]:
    html = tmp_path / "report.html"
    out, err = io.StringIO(), io.StringIO()
    code = report_main([*args, "-o", str(html)], stdout=out, stderr=err)
    assert code in (0, 1), err.getvalue()
    doc = json.loads((tmp_path / "report.json").read_text())
    return code, out.getvalue(), doc, html.read_text()


# ----------------------------------------------------------------------------------------------
# The marker names the plant (no run needed)


def test_the_injector_reads_the_catalogues_plant_variable() -> None:
    """injector.py is stdlib-only and repeats the name: the two must be one."""
    assert injector.PLANT_ENV == plants.PLANT_ENV == "PYTEST_NVRX_PLANT"


@pytest.mark.parametrize(("env", "plant"), [({"PYTEST_NVRX_PLANT": "rng"}, "rng"), ({}, None),
                                            ({"PYTEST_NVRX_PLANT": ""}, None)])  # fmt: skip
def test_the_marker_records_the_plant_of_the_environment(
    env: dict[str, str], plant: str | None
) -> None:
    rec = injector.build_marker_record(
        fault="kill",
        rank=1,
        firing=injector.Firing(window="step", trigger="start_section(step)", tracker_iteration=2),
        baseline_iteration=0,
        tracker="/c/t",
        argv=["train.py"],
        env=env,
        pid=5,
        rank_pid=5,
        host="h",
        now=datetime(2026, 1, 2, tzinfo=UTC),
    )
    assert rec["plant"] == plant


def test_a_marker_written_before_plants_names_none() -> None:
    assert "plant" not in json.loads((KILL_RUN / MARKER_NAME).read_text())
    marker = read_marker(KILL_RUN / MARKER_NAME, KILL_RUN)
    assert marker is not None and marker.ok
    assert marker.plant is None


# ----------------------------------------------------------------------------------------------
# The real planted run, labelled everywhere


def test_the_marker_and_run_json_name_the_plant(selftest: Selftest) -> None:
    planted = json.loads((selftest.rng / MARKER_NAME).read_text())
    control = json.loads((selftest.control / MARKER_NAME).read_text())
    assert (planted["plant"], control["plant"]) == ("rng", None)
    assert json.loads((selftest.rng / "run.json").read_text())["config"]["plant"] == "rng"
    assert json.loads((selftest.control / "run.json").read_text())["config"]["plant"] is None
    marker = read_marker(selftest.rng / MARKER_NAME, selftest.rng)
    assert marker is not None and marker.plant == "rng"


def test_verify_says_planted_first(selftest: Selftest) -> None:
    code, out, err = verify(str(selftest.rng))
    assert code == 1, out + err
    lines = out.splitlines()
    assert lines[0] == PLANTED_FIRST
    assert lines[1].startswith(f"verify {selftest.rng}: expected fault kill")
    assert lines[-1] == "verify: planted: rng: FAILED (1 of 6: training_continuity)"
    code, out, err = verify(str(selftest.control))
    assert code == 0, out + err
    assert "planted:" not in out
    assert out.splitlines()[-1] == "verify: PASSED (6 of 6)"


def test_verify_json_names_the_plant_first(selftest: Selftest) -> None:
    code, out, _ = verify(str(selftest.rng), "--json", "-")
    doc = json.loads(out)
    assert code == doc["exit_status"] == 1
    assert list(doc)[:2] == ["schema_version", "planted"] and doc["planted"] == "rng"
    assert doc["summary"].startswith("planted: rng: FAILED")
    _, out, _ = verify(str(selftest.control), "--json", "-")
    assert "planted" not in json.loads(out)


def test_report_has_the_selftest_section(selftest: Selftest, tmp_path: Path) -> None:
    code, out, doc, html = report(tmp_path, str(selftest.control), str(selftest.rng))
    assert code == 1  # the planted run is not qualified
    section = doc["selftest"]
    assert section["continuity_rtol"] == 0
    control, rng = section["rows"]
    assert (control["plant"], control["status"], control["caught_by"]) == (
        "control",
        "qualified",
        [],
    )
    assert (rng["plant"], rng["status"]) == ("rng", "caught")
    assert rng["expected_criterion"] == "training_continuity"
    assert rng["caught_by"] == ["training_continuity"]
    assert rng["run_dir"] == str(selftest.rng) and rng["scenario"] == selftest.rng.name
    scenario = next(s for s in doc["scenarios"] if s["run_dir"] == str(selftest.rng))
    assert next(iter(scenario)) == "planted" and scenario["planted"] == "rng"
    assert scenario["summary"].startswith("planted: rng: FAILED")
    assert scenario["outcome"].startswith("planted: rng: NOT QUALIFIED: training_continuity")
    assert f"{selftest.rng.name}: planted: rng: NOT QUALIFIED" in out
    assert "report: self-test at continuity rtol 0: control qualified, rng caught" in out
    # the page: the matrix row and the scenario's section lead with the plant, and the section
    assert f'<th><b>planted: rng</b> <a href="#s-{selftest.rng.name}">' in html
    assert f"<b>{PLANTED_FIRST}</b>" in html
    assert '<h2 id="selftest">Self-test</h2>' in html
    assert "training_continuity&#x27;s tolerance in force: rtol 0 (exact)" in html


def test_report_at_a_loose_tolerance_shows_the_plant_missed(
    selftest: Selftest, tmp_path: Path
) -> None:
    # the tolerance really admits the rng plant's differences (else "missed" proves nothing);
    # every criterion holds, yet a planted run never exits 0: it is no qualification
    code, out, err = verify(str(selftest.rng), "--continuity-rtol", str(LOOSE_RTOL))
    assert code == 1, out + err
    assert "planted: rng: PASSED (6 of 6)" in out
    assert "never a qualification, so never exit 0" in err
    code, out, doc, html = report(
        tmp_path, str(selftest.control), str(selftest.rng), "--continuity-rtol", str(LOOSE_RTOL)
    )
    assert doc["selftest"]["continuity_rtol"] == LOOSE_RTOL
    statuses = {row["plant"]: row["status"] for row in doc["selftest"]["rows"]}
    assert statuses == {"control": "qualified", "rng": "missed"}
    assert f"at rtol {LOOSE_RTOL:g}" in doc["selftest"]["rows"][1]["reason"]
    assert (
        f"report: self-test at continuity rtol {LOOSE_RTOL:g}: control qualified, rng missed" in out
    )
    # a planted run that passes every criterion is still labelled as planted, never QUALIFIED
    assert f"{selftest.rng.name}: planted: rng: every criterion held, NOT A QUALIFICATION" in out
    assert code == 1, out
    assert f"tolerance in force: rtol {LOOSE_RTOL:g}" in html


def test_report_of_runs_that_are_no_selftest_has_no_section(tmp_path: Path) -> None:
    _, out, doc, html = report(tmp_path, str(KILL_RUN))
    assert "selftest" not in doc and "planted" not in doc["scenarios"][0]
    assert "Self-test" not in html and "self-test" not in out


def test_junit_properties_name_the_plant_first(selftest: Selftest) -> None:
    firsts = {selftest.rng: ("nvrx_planted", "rng"), selftest.control: ("nvrx_run_dir", "")}
    for run_dir, first in firsts.items():
        run = ScenarioRun(run_dir.name, None, RunLayout.for_run(run_dir), judge_run_dir(run_dir))
        props = junit.run_properties(run)
        assert props[0] == (first[0], first[1] or str(run_dir))
        assert ("nvrx_planted" in dict(props)) == (run_dir == selftest.rng)


# ----------------------------------------------------------------------------------------------
# Contradictions: cannot judge, quoting both sides


def _cannot_judge(run_dir: Path) -> str:
    code, out, err = verify(str(run_dir))
    assert code == 2, out + err
    return err


def test_run_json_naming_another_plant_cannot_be_judged(selftest: Selftest, tmp_path: Path) -> None:
    doc = copy_run(selftest.rng, tmp_path / "run")
    doc.replace("run.json", '"plant": "rng"', '"plant": "data"', count=1)
    err = _cannot_judge(doc.root)
    marker_line = doc.line_no(MARKER_NAME, '"plant"')
    json_line = doc.line_no("run.json", '"plant": "data"')
    assert (
        f"fault_injected.json:{marker_line} records plant 'rng', but run.json:{json_line}"
        " (config.plant) names plant 'data'"
    ) in err
    _, out, _ = verify(str(doc.root))
    assert out.splitlines()[0].startswith("planted: data (data position reset, counters right)")
    assert out.splitlines()[-1] == "verify: planted: data: CANNOT JUDGE (see errors)"


def test_a_marker_without_its_plant_cannot_be_judged(selftest: Selftest, tmp_path: Path) -> None:
    doc = copy_run(selftest.rng, tmp_path / "run")
    marker = doc.json(MARKER_NAME)
    del marker["plant"]
    doc.path(MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n")
    err = _cannot_judge(doc.root)
    json_line = doc.line_no("run.json", '"plant": "rng"')
    assert (
        f"fault_injected.json records no plant (no 'plant' key), but run.json:{json_line}"
        " (config.plant) names plant 'rng'"
    ) in err


def test_a_planted_marker_in_an_unplanted_run_cannot_be_judged(
    selftest: Selftest, tmp_path: Path
) -> None:
    doc = copy_run(selftest.control, tmp_path / "run")
    doc.replace(MARKER_NAME, '"plant": null', '"plant": "rng"')
    err = _cannot_judge(doc.root)
    marker_line = doc.line_no(MARKER_NAME, '"plant"')
    json_line = doc.line_no("run.json", '"plant": null')
    assert (
        f"fault_injected.json:{marker_line} records plant 'rng', but run.json:{json_line}"
        " (config.plant) names no plant"
    ) in err
    # whichever names the plant, the run is labelled planted
    assert verify(str(doc.root))[1].startswith("planted: rng (RNG state not restored)")


def test_plant_records_in_an_unplanted_run_cannot_be_judged(
    selftest: Selftest, tmp_path: Path
) -> None:
    records = sorted((selftest.rng / PLANT_RECORDS_DIR).glob("*.json"))
    assert records, f"the rng run left no {PLANT_RECORDS_DIR}/"
    doc = copy_run(selftest.control, tmp_path / "run")
    assert verify(str(doc.root))[0] == 0  # the copy qualifies before the edit
    (doc.root / PLANT_RECORDS_DIR).mkdir()
    (doc.root / PLANT_RECORDS_DIR / records[0].name).write_bytes(records[0].read_bytes())
    err = _cannot_judge(doc.root)
    line = doc.line_no("run.json", '"plant": null')
    action_line = (
        records[0]
        .read_text()
        .splitlines()
        .index(
            next(
                x for x in records[0].read_text().splitlines() if x.lstrip().startswith('"action"')
            )
        )
    )
    shown = f"{PLANT_RECORDS_DIR}/{records[0].name}:{action_line + 1}"
    assert f"{shown} records plant 'rng' (" in err
    assert f"but run.json:{line} (config.plant) names no plant" in err


def test_an_unreadable_plant_record_in_an_unplanted_run_cannot_be_judged(
    selftest: Selftest, tmp_path: Path
) -> None:
    doc = copy_run(selftest.control, tmp_path / "run")
    (doc.root / PLANT_RECORDS_DIR).mkdir()
    (doc.root / PLANT_RECORDS_DIR / "x.json").write_text("{not json")
    err = _cannot_judge(doc.root)
    assert f"plant record {PLANT_RECORDS_DIR}/x.json" in err and "names no plant" in err


def test_a_plant_this_version_does_not_know_cannot_be_judged(
    selftest: Selftest, tmp_path: Path
) -> None:
    doc = copy_run(selftest.rng, tmp_path / "run")
    doc.replace("run.json", '"plant": "rng"', '"plant": "rng-2"', count=1)
    err = _cannot_judge(doc.root)
    assert "'plant' must be one of rng, optimizer-reset" in err and "'rng-2'" in err
