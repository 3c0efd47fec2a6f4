"""A run's least time against its run timeout (settings/feasibility.py): the arithmetic, the one
line each entry point shows, the estimates held below every committed run, and every default
scenario accepted. The refusals through the CLI and the plugin: tests/settings/test_bad_inputs.py
and tests/session/test_plugin.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx import cli
from pytest_nvrx.evidence.refs import seconds_between
from pytest_nvrx.evidence.rundir import load_run
from pytest_nvrx.evidence.timeline import recovery_clock
from pytest_nvrx.layout import FAULT_WINDOWS, INJECTED_FAULTS, windows_of
from pytest_nvrx.session.scenario_run import scenario_config, scenario_timeout
from pytest_nvrx.session.scenarios import ALL_SCENARIOS, DEFAULT_SCHEDULES
from pytest_nvrx.settings import (
    RESTART_S,
    STARTUP_S,
    ConfigError,
    NvrxSettings,
    RunConfig,
    SectionTimeouts,
    check_run_timeout,
    config_from_args,
    least_time,
    parse_schedule,
)
from tests.helpers.recorded_runs import recorded_config

DATA = Path(__file__).parents[1] / "data"
#: every committed run that ended by itself (the run timeout stopped none of them)
ENDED = sorted(
    run_json.parent
    for run_json in DATA.rglob("run.json")
    if (run_json.parent / "result.json").is_file()
    and not json.loads((run_json.parent / "result.json").read_text())["timed_out"]
)
WORK = Path("/nonexistent-work")


def config(**values: Any) -> RunConfig:
    values.setdefault("workload", "megatron")
    values.setdefault("gpus_per_node", 1)
    values.setdefault("fault_rank", 0)
    schedule = values.pop("schedule", None)
    if schedule is not None:
        values["schedule"] = parse_schedule(schedule, "schedule")
        first = values["schedule"][0]
        values.update(fault=first.fault, window=first.window)
    return RunConfig(work_dir=WORK, run_id="r", **values)


def refusal(run: RunConfig, timeout: float) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        check_run_timeout(run, timeout)
    return info.value


# --- the arithmetic ------------------------------------------------------------------------------


def test_the_issues_schedule_is_refused_with_the_arithmetic_in_each_entry_points_spelling() -> None:
    run = config(schedule="kill@step,hang@restore", section_timeouts=SectionTimeouts(900, 30, 30))
    # cycle 0 starts and is killed, the restart; cycle 1's setup deadline, the restart; cycle 2
    assert least_time(run).seconds == 10 + 1 + 900 + 1 + 10
    error = refusal(run, 500)
    assert error.message_for("cli") == (
        "hang@restore (fault 2 of 2) is detected only by the setup section's timeout (900 s); the"
        " run timeout 500 s cannot fit it: raise --timeout above ~922 s or lower setup in"
        " --section-timeouts (a lower-bound estimate: 2 start-ups of ~10 s, 2 restarts of ~1 s,"
        " hang@restore's detection 900 s)"
    )
    plugin = error.message_for("plugin")
    assert "raise --nvrx-run-timeout (ini nvrx_run_timeout) above ~922 s" in plugin
    assert "lower setup in --nvrx-section-timeouts (ini nvrx_section_timeouts)" in plugin
    assert "\n" not in plugin
    # the same schedule with setup:150 (it qualified on the GPU) fits
    check_run_timeout(dataclasses.replace(run, section_timeouts=SectionTimeouts(150, 30, 30)), 500)


@pytest.mark.parametrize(
    ("window", "section"),
    [("step", "step"), ("save", "checkpointing"), ("finalize", "checkpointing")],
)
def test_a_hang_waits_for_the_deadline_of_the_section_it_stopped_in(
    window: str, section: str
) -> None:
    run = config(fault="hang", window=window, section_timeouts=SectionTimeouts(900, 200, 300))
    deadline = getattr(run.section_timeouts, section)
    assert least_time(run).seconds == 10 + deadline + 1 + 10
    assert f"is detected only by the {section} section's timeout ({deadline:.0f} s)" in str(
        refusal(run, deadline)
    )


@pytest.mark.parametrize("fault", [f for f in INJECTED_FAULTS if f != "hang"])
def test_a_fault_whose_process_exits_waits_for_no_deadline(fault: str) -> None:
    """Whatever the deadlines, a process that exits is seen at once: two start-ups, a restart."""
    huge = SectionTimeouts(5000, 5000, 5000)
    for window in windows_of(fault):
        run = config(fault=fault, window=window, section_timeouts=huge)
        assert least_time(run).seconds == 2 * STARTUP_S["megatron"] + RESTART_S
        assert "section's timeout" not in str(refusal(run, 5))


def test_a_restore_fault_strikes_during_the_start_up_it_would_add() -> None:
    run = config(schedule="kill@step,kill@restore,kill@restore")
    assert least_time(run).seconds == 10 + 1 + 0 + 1 + 0 + 1 + 10


def test_faults_the_restart_budget_leaves_undue_cost_nothing() -> None:
    """max-restarts 1: the second fault ends the run (no restart, no last start-up), the third
    is never due; a hang there would not count either."""
    slow = SectionTimeouts(900, 30, 30)
    run = config(schedule="kill@step,kill@restore,hang@restore", max_restarts=1)
    assert least_time(dataclasses.replace(run, section_timeouts=slow)).seconds == 10 + 1
    check_run_timeout(dataclasses.replace(run, section_timeouts=slow), 20)
    due = config(schedule="kill@step,hang@restore", max_restarts=1, section_timeouts=slow)
    assert least_time(due).seconds == 10 + 1 + 900  # the hang's detection ends the run


def test_nvrx_no_progress_stop_ends_the_run_at_the_third_restore_fault() -> None:
    run = config(schedule="kill@step,kill@restore,kill@restore,kill@restore,hang@step")
    # three restore faults in a row: NVRx stops before restarting; the hang is never due
    assert least_time(run).seconds == 10 + 1 + 1 + 1 + 0


def test_a_peer_waiting_in_a_collective_ends_a_hang_at_its_timeout_when_sooner() -> None:
    """Two ranks: the stopped rank's peer fails at the collective timeout (10 minutes unless the
    workload's arguments say otherwise), which the launcher sees as an exit."""
    slow = SectionTimeouts(900, 30, 30)
    two = config(schedule="kill@step,hang@restore", gpus_per_node=2, section_timeouts=slow)
    assert least_time(two).seconds == 10 + 1 + 600 + 1 + 10
    assert "or, sooner, by the other ranks' collective timeout (600 s" in str(refusal(two, 500))
    args = ("--distributed-timeout-minutes", "2")
    assert least_time(dataclasses.replace(two, extra_args=args)).seconds == 10 + 1 + 120 + 1 + 10
    equals = ("--distributed-timeout-minutes=3",)
    assert least_time(dataclasses.replace(two, extra_args=equals)).seconds == 202
    # Megatron's lower timeout after the first iteration counts for a step hang, not in restore
    after = ("--distributed-timeout-seconds-after-init", "45")
    assert least_time(dataclasses.replace(two, extra_args=after)).seconds == 622
    step = config(fault="hang", window="step", gpus_per_node=2, extra_args=after)
    step = dataclasses.replace(step, section_timeouts=SectionTimeouts(900, 300, 30))
    assert least_time(step).seconds == 10 + 45 + 1 + 10
    assert "(45 s: the workload's --distributed-timeout-seconds-after-init)" in str(
        refusal(step, 50)
    )


def test_a_baseline_needs_its_start_up() -> None:
    run = config(fault="none", window=None)
    assert least_time(run).seconds == STARTUP_S["megatron"]
    assert str(refusal(run, 5)).startswith(
        "the run timeout 5 s cannot fit the baseline: the megatron workload's start-up alone"
        " needs ~10 s; raise --timeout above ~10 s"
    )


# --- the estimates are lower bounds --------------------------------------------------------------


@pytest.mark.parametrize("run_dir", ENDED, ids=lambda p: str(p.relative_to(DATA)))
def test_every_committed_run_took_longer_than_its_least_time(run_dir: Path) -> None:
    """What the refusal would have computed for each committed run (Megatron on H200s, the
    reference here) is below the wall time it took: none of them would have been refused."""
    wall = json.loads((run_dir / "result.json").read_text())["wall_s"]
    assert least_time(recorded_config(run_dir)).seconds <= wall


def test_the_start_up_and_restart_estimates_are_below_every_committed_cycle() -> None:
    """Each cycle's start (its cycle record) to its first iteration, and each detection to the
    replacement's start, in every committed run, is above the estimate the refusal adds."""
    startups: dict[str, list[float]] = {"reference": [], "megatron": []}
    restarts: list[float] = []
    for run_dir in ENDED:
        workload = json.loads((run_dir / "run.json").read_text())["config"]["workload"]
        run = load_run(run_dir, None)
        for log in run.cycle_logs:
            record, first = run.cycle_infos.by_cycle(log.cycle), log.first_iteration
            took = seconds_between(record.start if record else None, first.time if first else None)
            if took is not None:
                startups[workload].append(took)
        clock = recovery_clock(run)
        restart = seconds_between(clock.at("detected"), clock.replacement_start)
        if restart is not None:
            restarts.append(restart)
    for workload, seen in startups.items():
        assert len(seen) > 20, workload
        assert min(seen) > STARTUP_S[workload], (workload, min(seen))  # type: ignore[index]
    assert len(restarts) > 50 and min(restarts) > RESTART_S


# --- the defaults are never refused --------------------------------------------------------------


@pytest.mark.parametrize("scenario", ALL_SCENARIOS, ids=lambda s: s.id)
def test_every_scenario_fits_its_default_run_timeout(scenario: Any, megatron_stub: Path) -> None:
    settings = NvrxSettings(megatron_path=megatron_stub)
    run = scenario_config(settings, scenario, WORK, environ={})
    check_run_timeout(run, scenario_timeout(settings, scenario))


@pytest.mark.parametrize("workload", ["megatron", "reference"])
def test_every_cli_fault_and_default_schedule_fits_the_default_timeout(
    workload: str, megatron_stub: Path
) -> None:
    """``python -m pytest_nvrx run`` with only a fault and window (or a default schedule): the
    walkthrough's deadlines on Megatron, the scenarios' on the reference, --timeout 3600."""
    parser = cli.build_parser()
    env = {"MEGATRON_PATH": str(megatron_stub), "NVRX_WORK_DIR": "/w", "NVRX_RUN_ID": "r"}
    runs = [["--fault", f, "--window", w] for f in INJECTED_FAULTS for w in FAULT_WINDOWS]
    runs = [r for r in runs if r[3] in windows_of(r[1])] + [["--fault", "none"]]
    runs += [["--schedule", text] for text, _ in DEFAULT_SCHEDULES]
    for argv in runs:
        args = parser.parse_args(["run", "--workload", workload, *argv])
        check_run_timeout(config_from_args(args, env), args.timeout)


def test_a_hang_under_no_ft_is_timed_by_the_peers_collective_timeout_alone() -> None:
    """Under -- --no-ft no NVRx section watches the reference's ranks: the step section's 10 s
    counts for nothing, only the other rank's 600 s collective timeout detects the hang."""
    run = config(
        workload="reference", gpus_per_node=2, fault_rank=1, train_iters=20, save_interval=5,
        fault="hang", window="step", extra_args=("--no-ft",),
        section_timeouts=SectionTimeouts(setup=120, step=10, checkpointing=15),
    )  # fmt: skip
    assert least_time(run).faults[0].detection_s == 600.0
    text = refusal(run, 60.0).message_for("cli")
    assert "seen by no NVRx section" in text and "collective timeout (600 s" in text, text
    assert "--timeout above" in text, text
    check_run_timeout(run, 700.0)  # time enough for the peer's timeout


def test_a_hang_under_no_ft_on_one_rank_is_refused_whatever_the_run_timeout() -> None:
    """One rank, no NVRx section, no peer: nothing ever detects the hang."""
    run = config(
        workload="reference", gpus_per_node=1, fault_rank=0, train_iters=20, save_interval=5,
        fault="hang", window="step", extra_args=("--no-ft",),
    )  # fmt: skip
    text = refusal(run, 1e9).message_for("plugin")
    assert "on one rank" in text and "drop --no-ft" in text, text
    assert "\n" not in text
