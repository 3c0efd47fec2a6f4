"""``python -m pytest_nvrx report`` and the CLI's reference sizing (issue #13, parts 1 and 5)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_nvrx.cli import build_parser
from pytest_nvrx.session.scenario_run import scenario_config
from pytest_nvrx.session.scenarios import Scenario, matrix_scenarios
from pytest_nvrx.settings import NvrxSettings, RunConfig, SectionTimeouts, config_from_args

DATA = Path(__file__).parents[1] / "data"
CPU = DATA / "cpu"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_nvrx", *args], capture_output=True, text=True, timeout=120
    )


def test_report_command_writes_the_page_and_the_json(tmp_path: Path) -> None:
    html = tmp_path / "out" / "r.html"
    html.parent.mkdir()
    done = run_cli("report", str(CPU / "reference-kill"), str(CPU / "reference-baseline"),
                   "-o", str(html))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reference-kill: QUALIFIED (downtime " in done.stdout
    assert "reference-baseline: QUALIFIED" in done.stdout
    doc = json.loads((html.parent / "r.json").read_text())
    assert [s["name"] for s in doc["scenarios"]] == ["reference-kill", "reference-baseline"]
    assert doc["scenarios"][0]["downtime_s"] > 0
    assert doc["scenarios"][0]["baseline"] == "reference-baseline"
    assert html.read_text().startswith("<!DOCTYPE html>")
    explicit = tmp_path / "elsewhere.json"
    done = run_cli("report", str(CPU / "reference-kill"), "-o", str(html), "--json", str(explicit))
    assert done.returncode == 0, done.stderr
    assert json.loads(explicit.read_text())["passed"] is True


def test_a_second_report_beside_the_first_keeps_the_first_ones_json(tmp_path: Path) -> None:
    """-o out/a.html then -o out/b.html: each page's JSON is named after it; the second report
    wrote out/report.json over the first one's before."""
    out = tmp_path / "out"
    out.mkdir()
    first = run_cli("report", str(CPU / "reference-kill"), "-o", str(out / "a.html"))
    assert first.returncode == 0, first.stderr
    assert f"wrote {out / 'a.html'} and {out / 'a.json'}" in first.stdout
    a_json = (out / "a.json").read_bytes()
    second = run_cli("report", str(CPU / "reference-baseline"), "-o", str(out / "b.html"))
    assert second.returncode == 0, second.stderr
    assert (out / "a.json").read_bytes() == a_json  # untouched by the second report
    assert [s["name"] for s in json.loads(a_json)["scenarios"]] == ["reference-kill"]
    b_doc = json.loads((out / "b.json").read_text())
    assert [s["name"] for s in b_doc["scenarios"]] == ["reference-baseline"]
    assert not (out / "report.json").exists()
    # a page named *.json would be its own JSON: refused before anything is written
    clash = run_cli("report", str(CPU / "reference-kill"), "-o", str(out / "c.json"))
    assert clash.returncode == 2 and "report: error" in clash.stderr, clash.stderr
    assert not (out / "c.json").exists()


def test_report_command_exit_status(tmp_path: Path) -> None:
    missing = run_cli("report", str(tmp_path / "nope"), "-o", str(tmp_path / "x.html"))
    assert missing.returncode == 2 and "report: error" in missing.stderr
    assert not (tmp_path / "x.html").exists()
    assert run_cli("report").returncode == 2  # a RUN_DIR is required
    top = run_cli("--help")
    assert top.returncode == 0 and "report" in top.stdout
    usage = run_cli("report", "--help")
    assert usage.returncode == 0 and "RUN_DIR" in usage.stdout and "--json" in usage.stdout


FAULTED = [s for s in matrix_scenarios("default", workloads=["reference"]) if s.fault != "none"]


@pytest.mark.parametrize("scenario", FAULTED, ids=lambda s: s.id)
def test_a_reference_run_is_sized_like_the_plugins_scenario(
    tmp_path: Path, scenario: Scenario
) -> None:
    """``run --workload reference --fault F --window W`` with nothing else given plans the
    plugin's reference scenario (a 15 s checkpointing deadline, not the walkthrough's 600 s:
    a hang in the finalize window took 646 s before)."""
    plugin = scenario_config(NvrxSettings(), scenario, tmp_path)
    argv = ["run", "--workload", "reference", "--fault", scenario.fault,
            "--window", str(scenario.window), "--work-dir", str(tmp_path),
            "--run-id", plugin.run_id]  # fmt: skip
    cli = config_from_args(build_parser().parse_args(argv), {})
    assert cli == plugin
    assert cli.section_timeouts.checkpointing == 15
    assert (cli.train_iters, cli.out_of_section_timeout) == (20, 60.0)


def cli_config(*extra: str, environ: dict[str, str] | None = None) -> RunConfig:
    argv = ["run", "--work-dir", "/tmp/nvrx-cli-test", "--run-id", "x", *extra]
    return config_from_args(build_parser().parse_args(argv), environ or {})


def test_options_and_variables_win_over_the_reference_sizing() -> None:
    given = cli_config("--workload", "reference", "--train-iters", "40",
                       "--section-timeouts", "setup:100,step:20,checkpointing:600")  # fmt: skip
    assert given.train_iters == 40
    assert given.section_timeouts == SectionTimeouts(setup=100, step=20, checkpointing=600)
    assert given.save_interval == 5 and given.out_of_section_timeout == 60.0
    env = cli_config("--workload", "reference", environ={"TRAIN_ITERS": "30"})
    assert env.train_iters == 30
    assert env.section_timeouts.checkpointing == 15


def test_a_megatron_run_keeps_the_walkthroughs_values() -> None:
    walkthrough = RunConfig(work_dir=Path("/tmp/nvrx-cli-test"), run_id="x")
    for config in (cli_config(), cli_config("--workload", "megatron")):
        assert config.train_iters == walkthrough.train_iters == 100
        assert config.section_timeouts == walkthrough.section_timeouts
        assert config.out_of_section_timeout == walkthrough.out_of_section_timeout == 180.0


def test_help_shows_both_defaults() -> None:
    text = run_cli("run", "--help").stdout
    flat = " ".join(text.split())
    assert "training iterations [TRAIN_ITERS, 100; reference: 20]" in flat
    assert "setup:900,step:120,checkpointing:600; reference: setup:120,step:10,checkpointing:15" \
        in flat  # fmt: skip
    assert "a Megatron run keeps the walkthrough's" in flat
