"""The plugin's report (issue #13): ``--nvrx-report PATH`` with and without pytest-xdist, the
downtime gate ``--nvrx-max-downtime S``, the outcome line per scenario and JUnit properties that
a person can read (each criterion's testcase with its own verdict).

Judged existing runs (``--nvrx-run-dir``, fast) for the wiring; one real reference kill run
(under /tmp/nvrx-heavy.lock where the suite's runner holds it) for the gate end to end."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_nvrx.criteria import CRITERIA_IDS
from tests.helpers.recipe_runs import whole

pytest_plugins = ["pytester"]

DATA = Path(__file__).parents[1] / "data"
GPU_KILL = DATA / "gpu-recipe" / "megatron-kill-40"
GPU_BASELINE = DATA / "gpu-recipe" / "megatron-baseline-40"
NEVER_RECOVERED = DATA / "gpu-recipe" / "megatron-kill-40-distopt"
SUITE_ARGS = ["--pyargs", "pytest_nvrx.suite", "-p", "no:cacheprovider"]
#: verify's failure_to_first_iteration_after_restore_s of GPU_KILL (report.json's downtime_s)
GPU_KILL_DOWNTIME = 25.417


def copy_run(source: Path, tmp_path: Path) -> Path:
    """A copy to judge: the suite runs with the result.json the device packer dropped
    (tests/helpers/recipe_runs.py)."""
    return whole(source, tmp_path)


def junit_cases(junit: Path) -> dict[str, dict[str, str]]:
    """testcase name -> its properties."""
    return {
        case.attrib["name"]: {p.attrib["name"]: p.attrib["value"] for p in case.iter("property")}
        for case in ET.parse(junit).getroot().iter("testcase")
    }


def check_report(html: Path, downtime: float = GPU_KILL_DOWNTIME) -> dict[str, object]:
    assert html.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    doc = json.loads(html.with_suffix(".json").read_text())
    (scenario,) = doc["scenarios"]
    assert scenario["name"] == "existing-run"
    assert scenario["downtime_s"] == pytest.approx(downtime, abs=0.002)
    assert [c["id"] for c in scenario["criteria"]] == list(CRITERIA_IDS)
    assert scenario["recovery"]["phases"], scenario["recovery"]
    return scenario  # type: ignore[no-any-return]


def test_report_and_outcome_without_xdist(
    pytester: pytest.Pytester, clean_env: None, tmp_path: Path
) -> None:
    run = copy_run(GPU_KILL, tmp_path)
    html = tmp_path / "out" / "qualify.html"  # its directory is made
    junit = tmp_path / "junit.xml"
    result = pytester.runpytest(
        *SUITE_ARGS, "--nvrx-run-dir", str(run), "--nvrx-report", str(html), f"--junitxml={junit}"
    )
    result.assert_outcomes(passed=1 + len(CRITERIA_IDS))  # no downtime test without a limit
    scenario = check_report(html)
    assert scenario["passed"] is True and scenario["outcome"] == "QUALIFIED"
    assert scenario["max_downtime_s"] is None and scenario["gate"] is None
    out = result.stdout.str()
    # the outcome once the run is judged, and leading its block in the summary
    result.stdout.fnmatch_lines(
        [
            "nvrx existing-run: QUALIFIED",
            "*= nvrx verdicts =*",
            "nvrx existing-run: QUALIFIED",
            f"existing-run: {run}",
            "  PASS prior_checkpoint: *",
            f"nvrx report: {html} and {html.with_suffix('.json')} (1 scenario)*",
        ]
    )
    assert "test_recovery_downtime" not in out

    cases = junit_cases(junit)
    first = cases["test_run_finished[existing-run]"]
    assert first["nvrx_run_dir"] == str(run)
    assert first["nvrx_timing_failure_to_first_iteration_after_restore_s"] == str(GPU_KILL_DOWNTIME)
    assert first["nvrx_stack_cuda_available"] == "true"
    assert "nvrx_stack_transformer_engine" not in first  # None: left out, not "None"
    # a list joined, a dict one property per key
    assert first["nvrx_stack_notes"].count(" | ") == 2
    assert first["nvrx_stack_megatron_flags_async_strategy_choices"] == "nvrx | mcore"
    for criterion in CRITERIA_IDS:
        props = cases[f"test_recovery_criterion[existing-run-{criterion}]"]
        # its own verdict, not the run's 30 properties again
        assert props["nvrx_criterion"] == criterion and props["nvrx_status"] == "PASS"
        assert props["nvrx_reason"] and ":" in props["nvrx_evidence"]
        assert props["nvrx_run_dir"] == str(run)
        assert not any(name.startswith("nvrx_stack_") for name in props)
    reasons = {p["nvrx_reason"] for name, p in cases.items() if "criterion" in name}
    assert len(reasons) == len(CRITERIA_IDS)
    for props in cases.values():
        for name, value in props.items():
            assert value not in ("None", "True", "False", "[]", "{}"), (name, value)
            assert not re.match(r"^[\[{(]'", value), (name, value)


def test_a_second_report_beside_the_first_keeps_the_first_ones_json(
    pytester: pytest.Pytester, clean_env: None, tmp_path: Path
) -> None:
    """--nvrx-report out/a.html then out/b.html: each page's JSON is named after it (as
    ``report -o`` names it); both sessions wrote out/report.json before, the second over the
    first one's."""
    out = tmp_path / "out"
    kill, baseline = copy_run(GPU_KILL, tmp_path), copy_run(GPU_BASELINE, tmp_path)
    first = pytester.runpytest(*SUITE_ARGS, "--nvrx-run-dir", str(kill),
                               "--nvrx-report", str(out / "a.html"))  # fmt: skip
    assert first.ret == pytest.ExitCode.OK, first.stdout.str()[-3000:]
    first.stdout.fnmatch_lines([f"nvrx report: {out / 'a.html'} and {out / 'a.json'} (1 *"])
    a_json = (out / "a.json").read_bytes()
    second = pytester.runpytest(*SUITE_ARGS, "--nvrx-run-dir", str(baseline),
                                "--nvrx-report", str(out / "b.html"))  # fmt: skip
    assert second.ret == pytest.ExitCode.OK, second.stdout.str()[-3000:]
    assert (out / "a.json").read_bytes() == a_json  # untouched by the second session
    assert json.loads(a_json)["scenarios"][0]["run_dir"] == str(kill)
    assert json.loads((out / "b.json").read_text())["scenarios"][0]["run_dir"] == str(baseline)
    assert not (out / "report.json").exists()
    # a page named *.json would be its own JSON: refused before anything is judged
    clash = pytester.runpytest(*SUITE_ARGS, "--nvrx-run-dir", str(kill),
                               "--nvrx-report", str(out / "c.json"))  # fmt: skip
    assert clash.ret == pytest.ExitCode.USAGE_ERROR
    assert "--nvrx-report" in clash.stderr.str() and not (out / "c.json").exists()


def test_report_under_xdist(pytester: pytest.Pytester, clean_env: None, tmp_path: Path) -> None:
    """-n 2: the worker that judged the run ships its entry in the test report; the controller
    writes the report and prints the outcome and the verdicts."""
    pytest.importorskip("xdist")
    run = copy_run(GPU_KILL, tmp_path)
    html = tmp_path / "report.html"
    result = pytester.runpytest_subprocess(
        *SUITE_ARGS, "-n", "2", "--nvrx-run-dir", str(run), "--nvrx-report", str(html),
        "--nvrx-max-downtime", "600",
    )  # fmt: skip
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.OK, out[-3000:]
    result.assert_outcomes(passed=2 + len(CRITERIA_IDS))  # the downtime test is collected
    scenario = check_report(html)
    assert scenario["passed"] is True and scenario["max_downtime_s"] == 600
    result.stdout.fnmatch_lines(
        [
            "*= nvrx verdicts =*",
            "nvrx existing-run: QUALIFIED",
            f"existing-run: {run}",
            f"nvrx report: {html} and {tmp_path / 'report.json'} (1 scenario)*",
        ]
    )
    # the worker says the outcome at the end of the run, tagged with itself
    assert re.search(r"^\[gw\d\] nvrx existing-run: QUALIFIED$", out, re.M), out[-3000:]


def test_downtime_over_the_limit_fails_the_gate(
    pytester: pytest.Pytester, clean_env: None, tmp_path: Path
) -> None:
    run = copy_run(GPU_KILL, tmp_path)
    html = tmp_path / "report.html"
    junit = tmp_path / "junit.xml"
    result = pytester.runpytest(
        *SUITE_ARGS, "--nvrx-run-dir", str(run), "--nvrx-max-downtime", "10",
        "--nvrx-report", str(html), f"--junitxml={junit}",
    )  # fmt: skip
    result.assert_outcomes(passed=1 + len(CRITERIA_IDS), failed=1)
    message = (
        f"downtime {GPU_KILL_DOWNTIME:.3f} s exceeds the limit 10 s (--nvrx-max-downtime): "
        "fault to first step committed after the restore (detected after 0.2 s, replacement "
        "started 4.4 s later (of which 2 s waiting for GPU memory), checkpoint loaded 19.5 s"
        " later, first step 1.4 s later)"
    )
    result.stdout.fnmatch_lines(["*_ test_recovery_downtime[[]existing-run[]] _*", message])
    # the timings are the gate's evidence: no log tails under it (~65 lines each before)
    assert "nvrx: tail of" not in result.stdout.str()
    result.stdout.fnmatch_lines([f"nvrx existing-run: NOT QUALIFIED: {message}"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    scenario = check_report(html)
    assert scenario["passed"] is False and scenario["max_downtime_s"] == 10
    assert str(scenario["outcome"]).startswith("NOT QUALIFIED: downtime 25.417 s exceeds")
    html_text = html.read_text(encoding="utf-8")
    assert "NOT QUALIFIED</span>: downtime 25.417 s exceeds the limit 10 s" in html_text
    props = junit_cases(junit)["test_recovery_downtime[existing-run]"]
    assert props["nvrx_downtime_s"] == str(GPU_KILL_DOWNTIME)
    assert props["nvrx_max_downtime_s"] == "10.0"


def test_a_limit_with_nothing_to_measure_fails_and_a_baseline_skips(
    pytester: pytest.Pytester, clean_env: None, tmp_path: Path
) -> None:
    never = copy_run(NEVER_RECOVERED, tmp_path)
    result = pytester.runpytest(
        *SUITE_ARGS, "--nvrx-run-dir", str(never), "--nvrx-max-downtime", "600",
        "-k", "downtime",
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["no measurable downtime, limit 600 s (--nvrx-max-downtime): the evidence shows no *"]
    )
    baseline = copy_run(GPU_BASELINE, tmp_path)
    result = pytester.runpytest(
        *SUITE_ARGS, "--nvrx-run-dir", str(baseline), "--nvrx-max-downtime", "600",
        "-k", "downtime", "-rs",
    )  # fmt: skip
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*baseline scenario: no fault, no downtime*"])


def test_the_gate_is_collected_only_with_a_limit(
    pytester: pytest.Pytester, clean_env: None
) -> None:
    plain = pytester.runpytest(*SUITE_ARGS, "--collect-only", "-q", "-m", "not gpu")
    gated = pytester.runpytest(
        *SUITE_ARGS, "--collect-only", "-q", "-m", "not gpu", "--nvrx-max-downtime", "30"
    )
    plain_ids = [line for line in plain.stdout.lines if "::" in line]
    gated_ids = [line for line in gated.stdout.lines if "::" in line]
    scenarios = [line for line in plain_ids if "test_run_finished[" in line]
    downtime = [line for line in gated_ids if "test_recovery_downtime[" in line]
    assert len(scenarios) >= 2 and len(downtime) == len(scenarios)
    assert sorted(gated_ids) == sorted(plain_ids + downtime)
    assert f"{len(plain_ids)}/" in plain.stdout.str()  # the collected count has no gate tests
    assert "test_recovery_downtime" not in plain.stdout.str()
    bad = pytester.runpytest(*SUITE_ARGS, "--collect-only", "--nvrx-max-downtime", "-1")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "--nvrx-max-downtime" in bad.stderr.str()


REFERENCE_KILL = "reference-kill-save"


@pytest.mark.real_run
@pytest.mark.timeout(600)
def test_a_real_reference_kill_against_two_limits(
    pytester: pytest.Pytester, clean_env: None, tmp_path: Path
) -> None:
    """One real reference kill run held to 0.001 s fails the gate with its measured downtime;
    the same run dir judged again under 600 s passes it."""
    work = tmp_path / "work"
    html = tmp_path / "report.html"
    result = pytester.runpytest_subprocess(
        *SUITE_ARGS, "-k", REFERENCE_KILL, "--nvrx-work-dir", str(work),
        "--nvrx-max-downtime", "0.001", "--nvrx-report", str(html),
    )  # fmt: skip
    out = result.stdout.str()
    result.assert_outcomes(passed=1 + len(CRITERIA_IDS), failed=1)
    found = re.search(
        r"^downtime (\d+\.\d{3}) s exceeds the limit 0\.001 s \(--nvrx-max-downtime\)", out, re.M
    )
    assert found is not None, out[-4000:]
    measured = float(found[1])
    assert 0.5 < measured < 120
    scenario = json.loads((tmp_path / "report.json").read_text())["scenarios"][0]
    assert scenario["name"] == REFERENCE_KILL and scenario["passed"] is False
    assert scenario["downtime_s"] == pytest.approx(measured, abs=0.001)
    (run_dir,) = (work / "runs").iterdir()
    again = pytester.runpytest(
        *SUITE_ARGS, "--nvrx-run-dir", str(run_dir), "--nvrx-max-downtime", "600"
    )
    again.assert_outcomes(passed=2 + len(CRITERIA_IDS))
    again.stdout.fnmatch_lines(["nvrx existing-run: QUALIFIED"])


def test_phase_limits(pytester: pytest.Pytester, clean_env: None, tmp_path: Path) -> None:
    """--nvrx-max-phase: a phase over its limit fails with its seconds, one the evidence cannot
    measure fails saying why, one within its limit says nothing; the report holds the limits."""
    kill = copy_run(GPU_KILL, tmp_path)
    html = tmp_path / "report.html"
    result = pytester.runpytest(
        *SUITE_ARGS, "--nvrx-run-dir", str(kill), "-k", "downtime", "--nvrx-report", str(html),
        "--nvrx-max-phase", "checkpoint_load=5,detection=1",
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "phase checkpoint_load (started → checkpoint loaded) 19.489 s exceeds the limit 5 s"
            " (--nvrx-max-phase checkpoint_load=5)"
        ]
    )
    assert "phase detection" not in out  # 0.197 s: within its limit
    scenario = check_report(html)
    assert scenario["max_phases"] == {"checkpoint_load": 5.0, "detection": 1.0}
    assert scenario["passed"] is False and "phase checkpoint_load" in str(scenario["gate"])

    # the replacement's "model, optimizer ... built" milestone gone: nothing dates the load
    unmeasured = copy_run(GPU_KILL, tmp_path / "no-setup-done")
    log = unmeasured / "logs" / "train_cycle1.log"
    log.write_text(
        "".join(
            line
            for line in log.read_text().splitlines(keepends=True)
            if "after model, optimizer, and learning rate scheduler are built" not in line
        )
    )
    result = pytester.runpytest(
        *SUITE_ARGS, "--nvrx-run-dir", str(unmeasured), "-k", "downtime",
        "--nvrx-max-phase", "detection=600,checkpoint_load=600", "--nvrx-max-downtime", "600",
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "phase checkpoint_load (started → checkpoint loaded) not measurable, limit 600 s"
            " (--nvrx-max-phase checkpoint_load=600): checkpoint loaded not in the evidence"
        ]
    )
    assert "exceeds the limit" not in result.stdout.str()  # downtime 25 s, detection 0.2 s
    reference = copy_run(DATA / "cpu" / "reference-kill", tmp_path)
    measured = pytester.runpytest(
        *SUITE_ARGS, "--nvrx-run-dir", str(reference), "-k", "downtime",
        "--nvrx-max-phase", "detection=600,checkpoint_load=600", "--nvrx-max-downtime", "600",
    )  # fmt: skip
    measured.assert_outcomes(passed=1)  # the reference load line dates its own load
    ok = pytester.runpytest(
        *SUITE_ARGS, "--nvrx-run-dir", str(reference), "-k", "downtime",
        "--nvrx-max-phase", "detection=600,rendezvous=600",
    )  # fmt: skip
    ok.assert_outcomes(passed=1)
    bad = pytester.runpytest(*SUITE_ARGS, "--collect-only", "--nvrx-max-phase", "restore=5")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "PHASE one of detection, termination, gpu_reclaim, rendezvous" in bad.stderr.str()
    assert "got 'restore=5'" in bad.stderr.str()
