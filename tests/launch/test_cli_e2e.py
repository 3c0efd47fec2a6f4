"""End to end through the CLI: `run --workload reference --fault F --window W` with a real
ft_launcher for every (F, W) of the default matrix, then `verify` on its run directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_nvrx import cli
from pytest_nvrx.cli import build_parser
from pytest_nvrx.launch.planning import plan_run
from pytest_nvrx.session.scenario_run import scenario_config
from pytest_nvrx.session.scenarios import Scenario, matrix_scenarios, schedule_scenarios
from pytest_nvrx.settings import NvrxSettings, RunConfig, config_from_args
from tests.helpers.spine_trace import report as report_entries
from tests.helpers.spine_trace import trace_entries

DEFAULT_PAIRS = [
    s for s in matrix_scenarios("default", workloads=["reference"]) if s.fault != "none"
]

CRITERIA = [
    "prior_checkpoint", "replaced_cycle", "optimizer_state_load",
    "progress_past_restore", "no_repeat_injection", "training_continuity",
]  # fmt: skip


#: the pair whose run and verify run in this process, under the spine's trace
TRACED = DEFAULT_PAIRS[0].id


@pytest.mark.real_run
@pytest.mark.timeout(600)
@pytest.mark.parametrize("scenario", DEFAULT_PAIRS, ids=lambda s: s.id)
def test_run_each_default_pair_then_verify(
    tmp_path: Path, scenario: Scenario, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a user without a GPU does first, for every (fault, window) of the default matrix:
    ``python -m pytest_nvrx run --workload reference --fault F --window W`` (sized as the
    plugin's reference scenarios: 20 iterations, save every 5, checkpointing deadline 30 s)
    through the real ft_launcher recovers, then ``verify`` on its run directory passes every
    criterion, and the marker proves the fault landed in window W.

    One pair (:data:`TRACED`) runs both commands through ``cli.main`` in this process, under
    the spine's trace (tests/helpers/spine_trace.py): following the CLI's ``run`` from
    ``cli.main`` to ``verify``'s verdict enters each module of ours at most twice. An entry is
    one place in the spine (``cli.py``, ``launch/run.py``, ``verify.py``: the code that
    sequences parse, plan, claim, launch, wait, judge, report) that calls into another module
    of ours; calls within a module, property reads, imports and the leaf utilities every stage
    uses (``printable``, ``write_atomic``, ``write_output``) are not entries. The other pairs
    run the real entry point, ``python -m pytest_nvrx``, in processes of their own."""
    work = tmp_path / "work"
    run_id = f"cli-{scenario.fault}-{scenario.window}"
    plugin = scenario_config(NvrxSettings(), scenario, tmp_path)
    argv = [
        "run",
        "--workload", "reference", "--fault", scenario.fault,
        "--window", str(scenario.window), "--work-dir", str(work), "--run-id", run_id,
        "--train-iters", str(plugin.train_iters),
        "--save-interval", str(plugin.save_interval),
        "--section-timeouts", plugin.section_timeouts.render(),
        "--out-of-section-timeout", str(plugin.out_of_section_timeout),
        "--workload-check-interval", str(plugin.workload_check_interval),
        "--timeout", "400",
    ]  # fmt: skip
    run_dir = work / "runs" / run_id
    report = tmp_path / "verdicts.json"
    verify_argv = ["verify", str(run_dir), "--json", str(report)]
    if scenario.id == TRACED:
        (run_status, verify_status), entries = trace_entries(
            lambda: (cli.main(argv), cli.main(verify_argv))
        )
        out = capsys.readouterr()
        run_out, verify_out = out.out, out.out + out.err
        assert run_status == 0, out.out + out.err
        assert not entries.over(2), "\n".join(report_entries(entries))
    else:
        command = [sys.executable, "-m", "pytest_nvrx"]
        run = subprocess.run([*command, *argv], capture_output=True, text=True, timeout=500)
        assert run.returncode == 0, run.stdout + run.stderr
        run_out = run.stdout
        verify = subprocess.run([*command, *verify_argv], capture_output=True, text=True)
        verify_status, verify_out = verify.returncode, verify.stdout + verify.stderr
    assert "fault injected" in run_out  # progress lines
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["config"]["workload"] == "reference"
    assert (manifest["config"]["fault"], manifest["config"]["window"]) == (
        scenario.fault,
        scenario.window,
    )
    assert manifest["stack"]["nvrx"] and manifest["stack"]["torch"]  # stack recorded
    marker = json.loads((run_dir / "fault_injected.json").read_text())
    assert marker["window"] == scenario.window
    if scenario.window in ("save", "finalize"):
        # save N being prepared or in flight, the tracker still at the save before it
        assert marker["in_flight_iteration"] is not None
        assert marker["tracker_iteration"] < marker["in_flight_iteration"]

    assert verify_status == 0, verify_out
    verdicts = json.loads(report.read_text())
    assert [c["id"] for c in verdicts["criteria"]] == CRITERIA
    failed = [c["id"] for c in verdicts["criteria"] if not c["passed"]]
    assert not failed, verify_out
    continuity = verdicts["criteria"][-1]
    assert not continuity["not_applicable"] and "replayed" in continuity["reason"]
    assert verdicts["stack"]


@pytest.mark.parametrize("scenario", DEFAULT_PAIRS, ids=lambda s: s.id)
def test_the_cli_launches_exactly_what_each_default_scenario_launches(
    tmp_path: Path, scenario: Scenario
) -> None:
    """``run --workload reference --fault F --window W`` with a scenario's settings plans the
    very command the plugin launches for that scenario (CI runs the default matrix through the
    plugin; the CLI is run end to end above): same run config, same ft_launcher and workload
    argv, same environment."""
    plugin = scenario_config(NvrxSettings(), scenario, tmp_path)
    assert (plugin.fault, plugin.window) == (scenario.fault, scenario.window)
    faults = ["--fault", scenario.fault, "--window", str(scenario.window)]
    argv = _same_as_plugin(plugin, tmp_path, faults)
    assert f"--window={scenario.window}" in argv


def _same_as_plugin(plugin: RunConfig, work: Path, faults: list[str]) -> list[str]:
    """``run --workload reference`` with ``faults`` and the plugin scenario's other settings
    plans the plugin's very run: the same RunConfig, ft_launcher argv and environment. Returns
    that argv."""
    argv = [
        "run", "--workload", "reference", *faults, "--work-dir", str(work),
        "--run-id", plugin.run_id, "--gpus-per-node", str(plugin.gpus_per_node),
        "--fault-rank", str(plugin.fault_rank), "--train-iters", str(plugin.train_iters),
        "--save-interval", str(plugin.save_interval),
        "--section-timeouts", plugin.section_timeouts.render(),
        "--out-of-section-timeout", str(plugin.out_of_section_timeout),
        "--workload-check-interval", str(plugin.workload_check_interval),
        "--max-restarts", str(plugin.max_restarts),
    ]  # fmt: skip
    cli_config = config_from_args(build_parser().parse_args(argv), {})
    assert cli_config == plugin
    recipes = [
        plan_run(c, launcher_exe="ft_launcher", port=43210, probe=False).recipe
        for c in (plugin, cli_config)
    ]
    assert recipes[0].argv == recipes[1].argv
    assert recipes[0].env == recipes[1].env
    return recipes[0].argv


@pytest.mark.parametrize("scenario", schedule_scenarios("reference"), ids=lambda s: s.id)
def test_run_schedule_launches_exactly_what_each_schedule_scenario_launches(
    tmp_path: Path, scenario: Scenario
) -> None:
    """``run --workload reference --schedule S [--max-restarts M]`` plans the very command the
    plugin launches for the schedule scenario (CI runs the default schedule matrix through the
    plugin; tests/data/cpu-schedules holds runs of this command): same run config, same
    ft_launcher and injector argv, same environment."""
    plugin = scenario_config(NvrxSettings(), scenario, tmp_path)
    schedule = ",".join(str(e) for e in scenario.schedule)
    argv = _same_as_plugin(plugin, tmp_path, ["--schedule", schedule])
    assert f"--schedule={schedule}" in argv
    assert f"--max-restarts={plugin.max_restarts}" in argv
