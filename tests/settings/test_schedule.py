"""Fault schedules (issue #26) from the command line to the injector's argv and back: the syntax,
the random draw, RunConfig, the recipe, run.json and the markers' names and keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_nvrx.evidence.manifest import ManifestError, read_manifest
from pytest_nvrx.evidence.marker import read_marker
from pytest_nvrx.launch.recipe import injector_argv, reference_args
from pytest_nvrx.layout import (
    LATER_MARKER_PATTERN,
    MARKER_NAME,
    SCHEDULE_WINDOWS,
    RunLayout,
    marker_name,
)
from pytest_nvrx.session.scenario_run import scenario_config
from pytest_nvrx.session.scenarios import Scenario, matrix_scenarios, schedule_scenarios
from pytest_nvrx.settings import (
    ConfigError,
    NvrxSettings,
    PartialRunConfig,
    RunConfig,
    ScheduledFault,
    draw_schedule,
    parse_schedule,
    reference_iterations_needed,
    render_schedule,
    validate,
    windows_at,
)
from pytest_nvrx.settings.table import parse_schedules
from pytest_nvrx.worker import injector


def _config(tmp_path: Path, **values: object) -> RunConfig:
    given = {"workload": "reference", "gpus_per_node": 2, "train_iters": 20, "save_interval": 5}
    return PartialRunConfig.of({**given, **values}).config(tmp_path, "sched")


def test_the_injector_and_the_layout_name_the_markers_alike(tmp_path: Path) -> None:
    first = str(tmp_path / MARKER_NAME)
    for position in range(1, 12):
        assert injector.scheduled_marker_path(first, position) == str(
            tmp_path / marker_name(position)
        )
        assert (LATER_MARKER_PATTERN.fullmatch(marker_name(position)) is None) == (position == 1)
    assert injector.SCHEDULE_WINDOWS == SCHEDULE_WINDOWS
    assert RunLayout.for_run(tmp_path).marker_at(1) == RunLayout.for_run(tmp_path).marker
    with pytest.raises(ValueError):
        marker_name(0)


def test_a_schedule_parses_in_order() -> None:
    assert parse_schedule("kill@step, hang@finalize,kill@restore", "--schedule") == (
        ScheduledFault("kill", "step"),
        ScheduledFault("hang", "finalize"),
        ScheduledFault("kill", "restore"),
    )
    assert render_schedule(parse_schedule("ckpt-worker@finalize,exception@restore", "x")) == (
        "ckpt-worker@finalize,exception@restore"
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("", "give one or more FAULT@WINDOW"),
        ("kill", "entry 1 'kill' is not FAULT@WINDOW"),
        ("kill@step,none@step", "entry 2 'none@step' is not FAULT@WINDOW"),
        ("kill@nowhere", "entry 1 'kill@nowhere' is not FAULT@WINDOW"),
        ("kill@restore", "needs a fault before it"),
        ("kill@step,ckpt-worker@step", "fault ckpt-worker is injected only in window finalize"),
        ("kill@step,ckpt-worker@restore", "fault ckpt-worker is injected only in window finalize"),
        ("kill@step,,kill@step", "entry 2 '' is not FAULT@WINDOW"),
        ("random:3", "the random form is random:COUNT,seed=SEED"),
        ("random:0,seed=1", "draw 1 to 32 faults"),
        ("random:x,seed=1", "the random form"),
    ],
)
def test_a_bad_schedule_is_one_line_naming_the_entry(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^--schedule: ") as info:
        parse_schedule(raw, "--schedule")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_random_schedule_is_the_seed_s_and_only_allowed_windows() -> None:
    first = parse_schedule("random:12,seed=7", "x")
    assert first == parse_schedule("random:12,seed=7", "x") == draw_schedule(12, 7)
    assert first != draw_schedule(12, 8)
    for seed in range(200):
        drawn = draw_schedule(4, seed)
        assert drawn[0].window not in SCHEDULE_WINDOWS
        for position, entry in enumerate(drawn, start=1):
            assert entry.window in windows_at(entry.fault, position)
    seen = {str(e) for seed in range(200) for e in draw_schedule(4, seed)}
    assert {"kill@restore", "ckpt-worker@finalize", "hang@save", "exception@step"} <= seen


def test_a_schedule_s_run_is_its_first_fault_s(tmp_path: Path) -> None:
    schedule = parse_schedule("hang@finalize,kill@restore", "x")
    config = _config(tmp_path, schedule=schedule)
    assert (config.fault, config.fault_window, config.schedule) == ("hang", "finalize", schedule)
    validate(config)
    assert config.as_dict()["schedule"] == ["hang@finalize", "kill@restore"]
    assert _config(tmp_path).as_dict()["schedule"] == []
    with pytest.raises(ConfigError, match="fault kill was given with the fault schedule"):
        _config(tmp_path, schedule=schedule, fault="kill")
    with pytest.raises(ConfigError, match="window step was given with the fault schedule"):
        _config(tmp_path, schedule=schedule, window="step")
    # the same fault given twice is no contradiction
    assert _config(tmp_path, schedule=schedule, fault="hang").fault == "hang"


def test_a_run_config_built_in_code_is_held_to_the_schedule(tmp_path: Path) -> None:
    bad = RunConfig(
        work_dir=tmp_path,
        run_id="x",
        workload="reference",
        schedule=(ScheduledFault("hang", "step"), ScheduledFault("kill", "restore")),
    )
    with pytest.raises(ConfigError, match="is not the fault schedule's first, hang@step"):
        validate(bad)
    first_restore = RunConfig(
        work_dir=tmp_path,
        run_id="x",
        workload="reference",
        fault="kill",
        window="step",
        schedule=(ScheduledFault("kill", "step"), ScheduledFault("ckpt-worker", "restore")),
    )
    with pytest.raises(ConfigError, match="entry 2 ckpt-worker@restore cannot be injected"):
        validate(first_restore)


def test_the_injector_gets_the_schedule_and_a_ckpt_worker_its_process(tmp_path: Path) -> None:
    config = _config(tmp_path, schedule=parse_schedule("kill@step,ckpt-worker@finalize", "x"))
    argv = injector_argv(config, config.layout)
    assert "--schedule=kill@step,ckpt-worker@finalize" in argv
    assert not [a for a in argv if a.startswith(("--fault=", "--window="))]
    assert f"--fault-marker={config.layout.marker}" in argv
    assert "--async-writer=process" in reference_args(config, config.layout)
    one = _config(tmp_path, fault="kill")
    assert not [a for a in injector_argv(one, one.layout) if a.startswith("--schedule")]
    assert "--async-writer=process" not in reference_args(one, one.layout)


def _write_manifest(run_dir: Path, **config: object) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "run.json"
    path.write_text(json.dumps({"schema": 1, "config": {"fault": "kill", **config}}, indent=2))
    return path


def test_run_json_records_the_schedule_and_the_budget(tmp_path: Path) -> None:
    path = _write_manifest(tmp_path, schedule=["kill@step", "kill@restore"], max_restarts=3)
    manifest = read_manifest(path, tmp_path)
    assert manifest is not None
    assert manifest.scheduled_faults == parse_schedule("kill@step,kill@restore", "x")
    assert manifest.max_restarts is not None and manifest.max_restarts.value == 3
    one = read_manifest(_write_manifest(tmp_path / "one", schedule=[]), tmp_path / "one")
    assert one is not None and one.scheduled_faults == ()
    with pytest.raises(ManifestError, match="needs a fault before it"):
        read_manifest(_write_manifest(tmp_path / "bad", schedule=["kill@restore"]), tmp_path)


def _marker(tmp_path: Path, name: str, **extra: object) -> Path:
    record = {
        "schema_version": 2,
        "fault": "kill",
        "rank": 1,
        "time": "2026-12-02T14:13:54.797773+00:00",
        "window": "restore",
        "trigger": "checkpoint load",
        "section": "setup",
        "tracker_iteration": 5,
        "schedule": ["kill@step", "kill@restore"],
        "schedule_position": 2,
        "load_iteration": 5,
        # what the injector writes into every schema-2 marker (marker.SCHEMA_2_REQUIRED)
        "run_id": "ks1",
        "argv": ["--script", "workload.py"],
        "world_size": 2,
        "host": "vm",
        "tracker": "/tmp/w/ckpt/latest_checkpointed_iteration.txt",
        "pid": 4242,
        "restart_count": 1,
        **extra,
    }
    path = tmp_path / name
    path.write_text(json.dumps({k: v for k, v in record.items() if v is not None}, indent=2))
    return path


def test_a_restore_marker_reads_as_a_schedule_s_second_fault(tmp_path: Path) -> None:
    marker = read_marker(_marker(tmp_path, marker_name(2)), tmp_path)
    assert marker is not None and marker.ok, marker
    assert (marker.window, marker.schedule_position, marker.load_iteration) == ("restore", 2, 5)
    assert marker.schedule == ("kill@step", "kill@restore")


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ({"schedule_position": 1}, "cannot be injected in window 'restore' as fault 1"),
        ({"schedule_position": None}, "'schedule' without its pair"),
        ({"schedule": None}, "'schedule_position' without its pair"),
        ({"schedule_position": 3}, "'schedule_position' 3 is beyond its 2 faults"),
        ({"fault": "ckpt-worker"}, "'ckpt-worker' cannot be injected in window 'restore'"),
        ({"schedule": None, "schedule_position": None}, "cannot be injected in window 'restore'"),
    ],
)
def test_a_restore_marker_out_of_its_schedule_is_unusable(
    tmp_path: Path, extra: dict[str, object], problem: str
) -> None:
    marker = read_marker(_marker(tmp_path, marker_name(2), **extra), tmp_path)
    assert marker is not None and not marker.ok
    assert problem in (marker.error or "")


def test_the_default_schedule_matrix_scenarios(tmp_path: Path) -> None:
    scenarios = schedule_scenarios("reference")
    assert [s.id for s in scenarios] == [
        "reference-schedule-kill-step_kill-restore",
        "reference-schedule-hang-finalize_ckpt-worker-finalize",
        "reference-schedule-kill-step_kill-restore_kill-restore-restarts1",
    ]
    # every fault and window of a schedule marks it, so -m kill selects the kill schedules
    assert [s.markers for s in scenarios] == [
        ("schedule", "kill", "step", "restore"),
        ("schedule", "hang", "ckpt-worker", "finalize"),
        ("schedule", "kill", "step", "restore"),
    ]
    assert schedule_scenarios("megatron")[1].markers == (
        "gpu",
        "schedule",
        "hang",
        "ckpt-worker",
        "finalize",
    )
    budget = scenario_config(NvrxSettings(), scenarios[2], tmp_path)
    assert budget.max_restarts == 1
    assert [str(e) for e in budget.schedule] == ["kill@step", "kill@restore", "kill@restore"]
    assert (budget.fault, budget.fault_window) == ("kill", "step")
    validate(budget)
    # the run ID is the scenario's id: a run ID's characters only
    assert budget.run_id.startswith(scenarios[2].id)
    plain = scenario_config(NvrxSettings(), scenarios[0], tmp_path)
    assert plain.max_restarts == RunConfig.max_restarts


def test_the_plugin_s_schedules_setting() -> None:
    assert parse_schedules("default", "--nvrx-schedules") == "default"
    assert parse_schedules(" none ", "--nvrx-schedules") == "none"
    given = parse_schedules("kill@step,term@restore", "--nvrx-schedules")
    assert matrix_scenarios("default", workloads=["reference"], schedules=given)[-1].id == (
        "reference-schedule-kill-step_term-restore"
    )
    assert len(matrix_scenarios("default", workloads=["reference"], schedules="none")) == 7
    assert len(matrix_scenarios("default", workloads=["reference"], schedules="default")) == 10
    with pytest.raises(ConfigError, match=r"^--nvrx-schedules: entry 1 'kill@restore'"):
        parse_schedules("kill@restore", "--nvrx-schedules")
    with pytest.raises(ValueError, match="a schedule's scenario is its first fault's"):
        Scenario("reference", "hang", "step", schedule=parse_schedule("kill@step", "x"))


def test_the_reference_schedule_must_fit_its_iterations(tmp_path: Path) -> None:
    """Each fault's replacement resumes one save interval later, so a schedule of windows
    needs iterations: refused before launch, naming the fault and the iterations it needs."""
    three = parse_schedule("kill@step,kill@step,kill@step", "x")
    with pytest.raises(ConfigError) as info:
        validate(_config(tmp_path, schedule=three))
    assert str(info.value).startswith(
        "fault schedule kill@step,kill@step,kill@step on the reference workload: fault 3"
        " (kill@step) opens its window only at iteration 21"
    )
    assert "--train-iters 21" in str(info.value)
    assert "--nvrx-train-iters 21" in info.value.message_for("plugin")
    validate(_config(tmp_path, schedule=three, train_iters=21))
    # the faults a spent budget leaves undue need no iterations
    validate(_config(tmp_path, schedule=three, max_restarts=1))
    # the recorded runs' schedules fit the defaults (20 iterations, save every 5)
    for text in (
        "kill@step,kill@restore",
        "hang@finalize,ckpt-worker@finalize",
        "kill@step,term@restore,segv@restore",
        "kill@step,kill@restore,kill@restore,kill@restore,kill@step",
    ):
        validate(_config(tmp_path, schedule=parse_schedule(text, "x"), max_restarts=5))
    needed = reference_iterations_needed(parse_schedule("hang@finalize,kill@save", "x"), 5)
    assert needed == [15, 15]  # finalize: 3 intervals from 0; save: 2 from the restored 5
