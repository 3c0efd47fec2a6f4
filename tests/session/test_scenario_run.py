"""pytest_nvrx.session.scenario_run without a launch: it imports no pytest, refuses bad settings
before
anything is written, and judges an existing run into a typed ScenarioRun. Its launches are
tested for real by tests/launch/test_cli_e2e.py (the CLI) and the plugin's suite (the fixture)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_nvrx.criteria import CRITERIA_IDS
from pytest_nvrx.session import junit
from pytest_nvrx.session.scenario_run import EXISTING_RUN, judge_existing, run_scenario
from pytest_nvrx.session.scenarios import Scenario
from pytest_nvrx.settings import ConfigError, NvrxSettings, PartialRunConfig

GPU_KILL = Path(__file__).parents[1] / "data" / "gpu" / "gpu-kill-100"


def modules_after_import(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_scenario_run_imports_no_pytest() -> None:
    loaded = modules_after_import("pytest_nvrx.session.scenario_run")
    assert "pytest_nvrx.session.scenario_run" in loaded  # the probe sees what it imported
    assert "pytest" not in loaded and "_pytest" not in loaded


def test_fixtures_do_not_import_the_plugin() -> None:
    """No plugin <-> fixtures loop: the hooks import the fixtures' module, not the reverse."""
    loaded = modules_after_import("pytest_nvrx.fixtures")
    assert "pytest_nvrx.fixtures" in loaded
    assert "pytest_nvrx.plugin" not in loaded
    assert "pytest_nvrx.fixtures" in modules_after_import("pytest_nvrx.plugin")


def test_bad_settings_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    lines: list[str] = []
    # 3 divides neither 2 ranks nor 8 heads
    settings = NvrxSettings(overrides=PartialRunConfig(tp=3))
    with pytest.raises(ConfigError, match="divisible by TP x PP = 3"):
        run_scenario(
            settings,
            Scenario("reference", "kill", "save"),
            tmp_path,
            baselines={},
            write=lines.append,
        )
    assert lines == [] and list(tmp_path.iterdir()) == []


def test_existing_run_is_judged_into_a_scenario_run() -> None:
    lines: list[str] = []
    run = judge_existing(GPU_KILL, NvrxSettings(), lines.append)
    assert run.key == EXISTING_RUN and run.scenario is None and run.result is None
    assert run.layout.run_dir == GPU_KILL
    assert run.judgement.passed, [v.headline() for v in run.judgement.verdicts]
    assert lines == []  # no first cause to report
    summary = run.summary_lines()
    assert summary[0] == f"{EXISTING_RUN}: {GPU_KILL}"
    assert [line.split(":")[0] for line in summary[1:]] == [f"  PASS {c}" for c in CRITERIA_IDS]
    props = dict(junit.run_properties(run))
    assert props["nvrx_run_dir"] == str(GPU_KILL)
    assert "nvrx_exit_code" not in props  # nothing was launched
    assert any(key.startswith("nvrx_stack_") for key in props)
