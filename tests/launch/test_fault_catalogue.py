"""The term (SIGTERM) and segv (SIGSEGV) faults, wired from the CLI to the criteria: settings and
run.json accept them, the marker records them, the criteria expect the signal's exit code, and
the real reference runs recorded with them (tests/data/cpu-faults) pass all six criteria."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_nvrx.criteria import CRITERIA_IDS, FAULT_CHOICES, judge_run_dir
from pytest_nvrx.layout import INJECTED_FAULTS, MARKER_NAME
from pytest_nvrx.settings import FAULT_KINDS
from pytest_nvrx.worker import injector
from tests.helpers.doctor import copy_run

DATA = Path(__file__).parents[1] / "data" / "cpu-faults"
SIGNALS = {"term": ("SIGTERM", -15), "segv": ("SIGSEGV", -11)}


def test_one_list_of_faults_everywhere() -> None:
    assert set(injector.FAULTS) == {"none", *INJECTED_FAULTS}
    assert set(FAULT_KINDS) == {"none", *INJECTED_FAULTS}
    assert set(FAULT_CHOICES) == {"none", *INJECTED_FAULTS}


@pytest.mark.parametrize("fault", sorted(SIGNALS))
def test_real_run_recovers_and_passes_all_six(fault: str) -> None:
    run = DATA / f"ref-{fault}"
    j = judge_run_dir(run)
    assert j.expected.kind == fault and j.expected.source == "run.json"
    assert [(v.id, v.status) for v in j.verdicts] == [(c, "PASS") for c in CRITERIA_IDS]
    name, code = SIGNALS[fault]
    marker = json.loads((run / MARKER_NAME).read_text())
    assert (marker["fault"], marker["signal"]) == (fault, name)
    c2 = j.verdict("replaced_cycle")
    assert f"rank 1 failed with exit code {code} in cycle 0" in c2.reason
    c6 = j.verdict("training_continuity")
    assert c6.reason.startswith("cycle 1 vs cycle 0: iterations 5..8 replayed, 4/4 equal")


def test_a_term_run_whose_rank_died_otherwise_fails(tmp_path: Path) -> None:
    """The launcher saw exit code -9, not SIGTERM's -15: the rank did not die of the fault."""
    doc = copy_run(DATA / "ref-term", tmp_path / "run")
    doc.replace("logs/launcher.log", "(exitcode: -15)", "(exitcode: -9)")
    c2 = judge_run_dir(doc.root).verdict("replaced_cycle")
    assert not c2.passed
    assert "failed with exit code -9, not the -15 that SIGTERM gives" in c2.reason


def test_expecting_another_fault_fails(tmp_path: Path) -> None:
    j = judge_run_dir(DATA / "ref-segv", expect_fault="term")
    c1 = j.verdict("prior_checkpoint")
    assert not c1.passed and "marker records fault 'segv' but 'term' was expected" in c1.reason


@pytest.mark.parametrize("fault", sorted(SIGNALS))
def test_cli_dry_run_passes_the_fault_to_the_injector(
    fault: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_nvrx.cli import main

    code = main(
        ["run", "--workload", "reference", "--work-dir", str(tmp_path), "--fault", fault,
         "--dry-run"]
    )  # fmt: skip
    assert code == 0
    assert f"--fault={fault}" in capsys.readouterr().out


GPU = Path(__file__).parents[1] / "data" / "gpu-faults"
GPU_BASELINE = Path(__file__).parents[1] / "data" / "gpu-continuity" / "g2-baseline-30"


@pytest.mark.parametrize("fault", sorted(SIGNALS))
def test_real_megatron_run_recovers_and_matches_the_baseline(fault: str) -> None:
    """2x H200, Megatron core_v0.19.0: SIGTERM/SIGSEGV of rank 1 recover like a kill; the
    replacement matches a baseline made in another device session bitwise."""
    j = judge_run_dir(GPU / f"g2-{fault}-30", baseline=GPU_BASELINE)
    assert [(v.id, v.status) for v in j.verdicts] == [(c, "PASS") for c in CRITERIA_IDS]
    assert f"exit code {SIGNALS[fault][1]} in cycle 0" in j.verdict("replaced_cycle").reason
    c6 = j.verdict("training_continuity")
    assert "iterations 6..10 replayed, 5/5 equal (7 printed as the mean of 6 and 7)" in c6.reason
    assert "iterations 6..30 compared, 25/25 equal" in c6.reason
