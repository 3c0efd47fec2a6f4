"""``--nvrx-compare REPORT_JSON`` and ``--nvrx-compare-fail SPEC`` in the plugin: the session's
scenarios against an earlier report.json, in the terminal, the HTML report, its
``.compare.json`` and JUnit, and the session failed by the gate after every scenario was judged.

Judged existing runs (``--nvrx-run-dir``): the committed real CPU pair of
tests/data/compare/planted-load-delay (the second's checkpoint load 6.158 s longer)."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_nvrx.report import build_reports, write_report

pytest_plugins = ["pytester"]

PAIR = Path(__file__).parents[1] / "data" / "compare" / "planted-load-delay"
#: a committed real report (the Megatron fault schedules on core_v0.19.0)
SCHEDULES = (
    Path(__file__).parents[1] / "data" / "compare" / "gpu-schedules-core_v0.19.0.report.json"
)
SUITE_ARGS = ["--pyargs", "pytest_nvrx.suite", "-p", "no:cacheprovider"]


def previous_report(tmp_path: Path) -> Path:
    """Last night's report.json: the run without the delay."""
    path = tmp_path / "last-night" / "report.json"
    path.parent.mkdir()
    write_report(build_reports([PAIR / "plain"]), json_path=path)
    return path


def first_case_properties(junit: Path) -> dict[str, str]:
    for case in ET.parse(junit).getroot().iter("testcase"):
        props = {p.attrib["name"]: p.attrib["value"] for p in case.iter("property")}
        if "nvrx_compare_status" in props:
            return props
    raise AssertionError("no testcase carries nvrx_compare_* properties")


def test_the_gate_fails_the_session_after_every_scenario_was_judged(
    pytester: pytest.Pytester, clean_env: None, tmp_path: Path
) -> None:
    run = shutil.copytree(PAIR / "slow", tmp_path / "slow")
    previous = previous_report(tmp_path)
    html, junit = tmp_path / "out" / "qualify.html", tmp_path / "junit.xml"
    result = pytester.runpytest(
        *SUITE_ARGS, "--nvrx-run-dir", str(run), "--nvrx-report", str(html),
        f"--junitxml={junit}", "--nvrx-compare", str(previous),
        "--nvrx-compare-fail", "verdict,phase:load:+3s",
    )  # fmt: skip
    # every test of the scenario passed: the gate alone fails the session
    result.assert_outcomes(passed=7)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert "= nvrx compare =" in out
    assert "REGRESSION: reference kill (step) [12 iterations, 2 ranks]" in out
    assert (
        "pytest-nvrx: --nvrx-compare-fail verdict,phase:checkpoint_load:+3s: reference kill (step)"
        " [12 iterations, 2 ranks]: phase:checkpoint_load:+3s: checkpoint_load 6.738 s → 12.896 s"
        " (+6.158 s, +91.4%), over +3s"
    ) in out
    props = first_case_properties(junit)
    assert props["nvrx_compare_status"] == "regression"
    assert props["nvrx_compare_verdict"] == "QUALIFIED → QUALIFIED"
    assert props["nvrx_compare_checkpoint_load_delta_s"] == "6.158"
    assert props["nvrx_compare_gate"].startswith("phase:checkpoint_load:+3s: checkpoint_load")
    page = html.read_text()
    assert f"Compared with {previous}" in page and "checkpoint_load" in page
    doc = json.loads(html.with_suffix(".compare.json").read_text())
    assert doc["gate"]["failed"] is True and doc["counts"]["regression"] == 1
    # the report it compared with is as it was
    assert json.loads(previous.read_text())["scenarios"][0]["name"] == "plain"


def test_a_looser_gate_passes_and_no_gate_only_shows(
    pytester: pytest.Pytester, clean_env: None, tmp_path: Path
) -> None:
    run = shutil.copytree(PAIR / "slow", tmp_path / "slow")
    previous = previous_report(tmp_path)
    junit = tmp_path / "junit.xml"
    loose = pytester.runpytest(
        *SUITE_ARGS, "--nvrx-run-dir", str(run), f"--junitxml={junit}",
        "--nvrx-compare", str(previous), "--nvrx-compare-fail", "phase:load:+10s",
    )  # fmt: skip
    assert loose.ret == pytest.ExitCode.OK
    assert first_case_properties(junit)["nvrx_compare_gate"] == "passes"
    shown = pytester.runpytest(
        *SUITE_ARGS, "--nvrx-run-dir", str(run), "--nvrx-compare", str(previous)
    )
    assert shown.ret == pytest.ExitCode.OK
    assert "checkpoint_load" not in shown.stdout.str()  # the details with -v
    assert "compare: 0 regressions, 0 improvements, 1 slower" in shown.stdout.str()


#: one hostile number or text each, in a copy of a report.json: (what is replaced, by what)
HOSTILE = {
    "400-digit downtime": ('"total_downtime_s": ', '"total_downtime_s": ' + "9" * 400 + ', "x": '),
    "400-digit timing": ('"timings": {', '"timings": {"x": ' + "9" * 400 + ", "),
    "loss dropped 1e999": ('"dropped": ', '"dropped": 1e999, "y": '),
    "empty fault_window": ('"fault_window": ', '"fault_window": [], "z": '),
    "lone surrogate in the stack": ('"torch": "', '"torch": "\\ud800'),
}


@pytest.mark.parametrize("what", sorted(HOSTILE))
def test_a_hostile_report_to_compare_with_is_a_one_line_usage_error(
    pytester: pytest.Pytester, clean_env: None, tmp_path: Path, what: str
) -> None:
    text = json.dumps(json.loads(SCHEDULES.read_text()))
    old, new = HOSTILE[what]
    assert old in text
    hostile = tmp_path / "hostile.json"
    hostile.write_text(text.replace(old, new, 1), encoding="utf-8")
    result = pytester.runpytest(*SUITE_ARGS, "--collect-only", "--nvrx-compare", str(hostile))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "Traceback" not in err and "INTERNALERROR" not in err
    assert f"pytest-nvrx: --nvrx-compare {hostile}: scenario 1" in err or (
        f"pytest-nvrx: --nvrx-compare {hostile}: a text holds a lone surrogate" in err
    ), err


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--nvrx-compare-fail", "verdict"], "--nvrx-compare-fail gates the comparison"),
        (["--nvrx-compare", "{tmp}/absent.json"], "--nvrx-compare: "),
        (["--nvrx-compare", "{tmp}/bad.json"], "--nvrx-compare {tmp}/bad.json: not JSON"),
        (
            ["--nvrx-compare", "{tmp}/old.json", "--nvrx-compare-fail", "downtime:5%"],
            "--nvrx-compare-fail 'downtime:5%': the limit '5%' is not +Ns or +N%",
        ),
        (
            ["--nvrx-compare", "{tmp}/out/q.json", "--nvrx-report", "{tmp}/out/q.html"],
            "is where --nvrx-report's JSON is written",
        ),
        (
            ["--nvrx-compare", "{tmp}/out/q.compare.json", "--nvrx-report", "{tmp}/out/q.html"],
            "is where --nvrx-report's comparison JSON is written",
        ),
    ],
)
def test_bad_compare_options_are_usage_errors_before_anything_runs(
    pytester: pytest.Pytester, clean_env: None, tmp_path: Path, args: list[str], why: str
) -> None:
    (tmp_path / "bad.json").write_text('{"schema_version": 2, "scen')
    previous = previous_report(tmp_path)
    shutil.copy(previous, tmp_path / "old.json")
    (tmp_path / "out").mkdir()
    for name in ("q.json", "q.compare.json"):
        shutil.copy(previous, tmp_path / "out" / name)
    given = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = pytester.runpytest(*SUITE_ARGS, "--collect-only", *given)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert why.replace("{tmp}", str(tmp_path)) in result.stderr.str()
    assert "Traceback" not in result.stderr.str()


def test_under_xdist_the_controller_compares_and_the_worker_gives_the_properties(
    pytester: pytest.Pytester, clean_env: None, tmp_path: Path
) -> None:
    run = shutil.copytree(PAIR / "slow", tmp_path / "slow")
    previous = previous_report(tmp_path)
    junit = tmp_path / "junit.xml"
    result = pytester.runpytest_subprocess(
        *SUITE_ARGS, "-n", "2", "--nvrx-run-dir", str(run), f"--junitxml={junit}",
        "--nvrx-compare", str(previous), "--nvrx-compare-fail", "phase:load:+3s",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "gate fails: reference kill (step)" in result.stdout.str()
    assert "  checkpoint_load: " not in result.stdout.str()  # each phase only with -v
    assert "pytest-nvrx: --nvrx-compare-fail phase:checkpoint_load:+3s" in result.stdout.str()
    assert first_case_properties(junit)["nvrx_compare_checkpoint_load_delta_s"] == "6.158"
