"""The plugin's ``--nvrx-selftest`` (#25): the self-test's runs as tests of the shipped suite.

Collection is checked without launching anything; one session runs the self-test for real, of
the control and one plant (``-k``), and is read for its tests, console, JUnit XML, report and
retention.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_nvrx.criteria.selftest_outcome import PlantOutcome
from pytest_nvrx.session.console import selftest_label
from pytest_nvrx.settings.plants import PLANTS, plant_named
from tests.helpers.sessions import SUITE_ARGS

pytest_plugins = ["pytester"]

#: The self-test's tests of the reference workload, in the catalogue's order.
REFERENCE_IDS = [
    "reference-selftest-control",
    *(f"reference-selftest-{p.name}" for p in PLANTS),
]


def collected(result: pytest.RunResult) -> list[str]:
    """The ids of the collected test_plant_caught tests, in order."""
    return [
        line.split("[", 1)[1].rstrip("]")
        for line in result.stdout.lines
        if "test_plant_caught[" in line
    ]


@pytest.mark.usefixtures("clean_env")
def test_not_collected_without_the_option(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(*SUITE_ARGS, "--collect-only", "-q")
    assert result.ret == 0
    assert "test_plant_caught" not in result.stdout.str()
    assert "selftest" not in result.stdout.str()
    # not "deselected" either: -m selftest without the option selects nothing at all
    result = pytester.runpytest(*SUITE_ARGS, "--collect-only", "-q", "-m", "selftest")
    assert "test_plant_caught" not in result.stdout.str()
    assert "0 selected" in result.stdout.str() or "deselected" in result.stdout.str()


@pytest.mark.usefixtures("clean_env")
def test_one_test_per_run_in_catalogue_order_marked_selftest(pytester: pytest.Pytester) -> None:
    args = [*SUITE_ARGS, "--collect-only", "-q", "--strict-markers", "--nvrx-selftest"]
    result = pytester.runpytest(*args, "-m", "selftest", "--nvrx-workload", "reference")
    assert result.ret == 0, result.stdout.str()
    assert collected(result) == REFERENCE_IDS
    assert len(REFERENCE_IDS) == 9  # the control and the catalogue's 8 plants
    # the scenarios are still there without -m; "not selftest" leaves the self-test out
    result = pytester.runpytest(*args, "--nvrx-workload", "reference")
    assert collected(result) == REFERENCE_IDS
    assert "test_run_finished[reference-baseline]" in result.stdout.str()
    result = pytester.runpytest(*args, "-m", "not selftest", "--nvrx-workload", "reference")
    assert collected(result) == []
    # megatron's carry gpu as well (skipped at setup without a checkout, as its scenarios)
    result = pytester.runpytest(*args, "-m", "selftest and gpu")
    assert collected(result) == [i.replace("reference", "megatron") for i in REFERENCE_IDS]
    # the ini mirror
    pytester.makeini("[pytest]\nnvrx_selftest = true\n")
    result = pytester.runpytest(*SUITE_ARGS, "--collect-only", "-q", "-m", "selftest and not gpu")
    assert collected(result) == REFERENCE_IDS


@pytest.mark.usefixtures("clean_env")
def test_refused_with_an_existing_run(pytester: pytest.Pytester, tmp_path: Path) -> None:
    result = pytester.runpytest(*SUITE_ARGS, "--nvrx-selftest", "--nvrx-run-dir", str(tmp_path))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--nvrx-selftest*incompatible with --nvrx-run-dir*"])


def test_labels_name_the_plant_never_qualified() -> None:
    rng = plant_named("rng")
    caught = PlantOutcome(rng, "caught", "caught by training_continuity: iteration 6 differs")
    assert selftest_label(caught) == (
        "planted: rng: caught by training_continuity: iteration 6 differs"
    )
    missed = PlantOutcome(rng, "missed", "on this stack, at rtol 0, ... would be QUALIFIED")
    assert selftest_label(missed) == (
        "planted: rng: missed: on this stack, at rtol 0, ... would be QUALIFIED"
    )
    control = PlantOutcome(None, "qualified", "the unplanted control qualified")
    assert selftest_label(control) == "control: qualified: the unplanted control qualified"


def junit_cases(junit: Path) -> dict[str, list[tuple[str, str]]]:
    """testcase name -> its properties, in order."""
    return {
        case.attrib["name"]: [(p.attrib["name"], p.attrib["value"]) for p in case.iter("property")]
        for case in ET.parse(junit).getroot().iter("testcase")
    }


@pytest.mark.real_run
@pytest.mark.timeout(400)
@pytest.mark.usefixtures("clean_env")
def test_control_and_one_plant_for_real(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """``-k "control or rng"``: the self-test runs the control and the rng plant only (two run
    dirs), each test passes, the console says ``planted: rng``, the rng testcase's first JUnit
    property is ``nvrx_planted``, the report has its self-test rows, and the payload of both
    runs is removed after the session (the control's checkpoint was there for the plants)."""
    basetemp, junit, html = tmp_path / "t", tmp_path / "junit.xml", tmp_path / "r" / "report.html"
    result = pytester.runpytest_subprocess(
        *SUITE_ARGS, "--nvrx-selftest", "-m", "selftest", "-k", "control or rng",
        "--nvrx-workload", "reference", f"--basetemp={basetemp}", f"--junitxml={junit}",
        "--nvrx-report", str(html),
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == 0, out
    assert result.parseoutcomes() == {"passed": 2, "deselected": 77}, out
    result.stdout.fnmatch_lines(
        ["nvrx reference-selftest-rng: planted: rng: caught by training_continuity: *"]
    )
    result.stdout.fnmatch_lines(
        ["reference-selftest-control *QUALIFIED *", "reference-selftest-rng *CAUGHT *"]
    )
    made = basetemp / "nvrx-reference-selftest0" / "runs"  # one work dir for the self-test
    runs = sorted(p.name.rsplit("-", 2)[0] for p in made.iterdir())
    assert runs == ["reference-selftest-control", "reference-selftest-rng"], runs
    for key in runs:
        assert f"nvrx {key}: removed " in out
    cases = junit_cases(junit)
    rng = cases["test_plant_caught[reference-selftest-rng]"]
    assert rng[0] == ("nvrx_planted", "rng"), rng
    assert ("nvrx_selftest_status", "caught") in rng
    assert ("nvrx_selftest_expected", "training_continuity") in rng
    control = dict(cases["test_plant_caught[reference-selftest-control]"])
    assert "nvrx_planted" not in control and control["nvrx_selftest_status"] == "qualified"
    doc = json.loads(html.with_suffix(".json").read_text())
    rows = {r["scenario"]: r["status"] for r in doc["selftest"]["rows"]}
    assert rows == {"reference-selftest-control": "qualified", "reference-selftest-rng": "caught"}
