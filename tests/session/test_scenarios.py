"""Scenarios: the matrices, ids and markers; defaults per workload, user overrides, one GPU,
multinode run IDs."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_nvrx.launch.run_dir_setup import validate_run as validate
from pytest_nvrx.layout import FAULT_WINDOWS, INJECTED_FAULTS, window_allowed
from pytest_nvrx.session.scenario_run import scenario_config
from pytest_nvrx.session.scenarios import (
    ALL_SCENARIOS,
    DEFAULT_PAIRS,
    DEFAULT_SCHEDULES,
    FULL_PAIRS,
    SCENARIOS,
    Scenario,
    fault_pairs,
    matrix_scenarios,
)
from pytest_nvrx.settings import (
    ConfigError,
    NvrxSettings,
    PartialRunConfig,
    parse_matrix,
    parse_windows,
)
from tests.helpers.sessions import DEFAULT_IDS


def test_default_matrix_ids_and_markers() -> None:
    ids = [s.id for s in SCENARIOS]
    assert ids == [f"{w}-{i}" for w in ("reference", "megatron") for i in DEFAULT_IDS]
    assert Scenario("megatron", "hang", "finalize").markers == ("gpu", "hang", "finalize")
    assert Scenario("reference", "ckpt-worker", "finalize").markers == ("ckpt-worker", "finalize")
    assert Scenario("reference", "none").markers == ("baseline",)
    assert Scenario("megatron", "none").markers == ("gpu", "baseline")
    assert Scenario("megatron", "none").id == "megatron-baseline"


def test_default_matrix_covers_every_fault_and_every_window() -> None:
    assert {fault for fault, _ in DEFAULT_PAIRS} == set(INJECTED_FAULTS)
    assert {window for _, window in DEFAULT_PAIRS} == set(FAULT_WINDOWS)
    # each fault once: no GPU time spent twice on one fault
    assert len(DEFAULT_PAIRS) == len(INJECTED_FAULTS)


def test_full_matrix_is_every_valid_pair() -> None:
    want = {(f, w) for f in INJECTED_FAULTS for w in FAULT_WINDOWS if window_allowed(f, w)}
    assert set(FULL_PAIRS) == want and len(FULL_PAIRS) == len(want) == 16
    assert ("ckpt-worker", "step") not in want and ("ckpt-worker", "save") not in want
    # per workload: the baseline, the 16 pairs and the default schedules
    assert len(ALL_SCENARIOS) == 2 * (1 + 16 + len(DEFAULT_SCHEDULES))
    assert set(SCENARIOS) <= set(ALL_SCENARIOS)
    assert len({s.id for s in ALL_SCENARIOS}) == len(ALL_SCENARIOS)


def test_windows_select_every_fault_in_them() -> None:
    save = fault_pairs("default", ["save"])
    assert save == tuple((f, "save") for f in INJECTED_FAULTS if f != "ckpt-worker")
    assert fault_pairs("full", ["save"]) == save
    both = fault_pairs("default", ["step", "finalize"])
    assert {w for _, w in both} == {"step", "finalize"} and len(both) == 11
    # the baselines stay, first per workload; --nvrx-workload limits to one workload
    scenarios = matrix_scenarios("default", ["finalize"], ["reference"])
    assert [s.id for s in scenarios] == [
        "reference-baseline",
        *(f"reference-{f}-finalize" for f in INJECTED_FAULTS),
    ]


def test_each_workload_starts_with_its_baseline() -> None:
    for scenarios in (SCENARIOS, ALL_SCENARIOS):
        for workload in ("reference", "megatron"):
            own = [s for s in scenarios if s.workload == workload]
            assert own[0].fault == "none" and all(s.fault != "none" for s in own[1:])


@pytest.mark.parametrize(
    ("fault", "window"),
    [("none", "step"), ("kill", None), ("ckpt-worker", "step"), ("ckpt-worker", "save")],
)
def test_inconsistent_scenarios_cannot_exist(fault: str, window: str | None) -> None:
    with pytest.raises(ValueError):
        Scenario("reference", fault, window)  # type: ignore[arg-type]


def test_parse_windows_and_matrix() -> None:
    assert parse_windows("finalize", "X") == ("finalize",)
    assert parse_windows(" save , step,save", "X") == ("save", "step")
    assert parse_matrix(" full ", "X") == "full"
    for raw in ("", ",", "save,", "during", "save,during", "STEP"):
        with pytest.raises(ConfigError, match="X must be one or more of step, save, finalize"):
            parse_windows(raw, "X")
    with pytest.raises(ConfigError, match="X must be one of default, full"):
        parse_matrix("all", "X")
    with pytest.raises(ConfigError, match="matrix must be one of"):
        fault_pairs("everything")


def test_every_scenario_validates(tmp_path: Path, megatron_stub: Path) -> None:
    """The workload defaults fit every window (save/finalize need two saves)."""
    settings = NvrxSettings(megatron_path=megatron_stub)
    for scenario in ALL_SCENARIOS:
        c = scenario_config(settings, scenario, tmp_path / scenario.id)
        assert (c.fault, c.window, c.fault_window) == (
            scenario.fault,
            scenario.window,
            scenario.window,
        )
        validate(c)


def test_reference_defaults(tmp_path: Path) -> None:
    c = scenario_config(NvrxSettings(), Scenario("reference", "kill", "save"), tmp_path)
    assert (c.gpus_per_node, c.fault_rank, c.train_iters) == (2, 1, 20)
    # checkpointing 30 s: a hang in the save/finalize window is detected by it
    assert c.section_timeouts.render() == "setup:120,step:10,checkpointing:15"
    validate(c)


def test_megatron_defaults_one_gpu(tmp_path: Path, megatron_stub: Path) -> None:
    settings = NvrxSettings(megatron_path=megatron_stub)
    c = scenario_config(settings, Scenario("megatron", "hang", "finalize"), tmp_path)
    assert (c.gpus_per_node, c.fault_rank, c.train_iters, c.save_interval) == (1, 0, 100, 5)
    assert c.section_timeouts.render() == "setup:900,step:30,checkpointing:30"
    assert c.window == "finalize"
    assert c.distributed_optimizer is True
    validate(c)


@pytest.mark.parametrize(
    ("overrides", "rank"),
    [
        ({"gpus_per_node": 1, "nnodes": 2, "launcher": "slurm"}, 1),  # a rank of node 2
        ({"gpus_per_node": 1, "nnodes": 2, "launcher": "slurm", "fault_rank": 0}, 0),
    ],
)
def test_the_faulted_rank_is_the_walkthroughs_rank_1_where_it_exists(
    tmp_path: Path, overrides: dict[str, object], rank: int
) -> None:
    settings = NvrxSettings(overrides=PartialRunConfig.of(overrides))
    c = scenario_config(settings, Scenario("reference", "kill", "save"), tmp_path)
    assert c.fault_rank == rank
    validate(c)
    # (one rank in all, a one-GPU Megatron scenario: rank 0, test_megatron_defaults_one_gpu)


def test_user_overrides_win(tmp_path: Path, megatron_stub: Path) -> None:
    settings = NvrxSettings(
        megatron_path=megatron_stub,
        overrides=PartialRunConfig(
            gpus_per_node=8, fault_rank=3, tp=2, distributed_optimizer=False
        ),
    )
    c = scenario_config(settings, Scenario("megatron", "kill", "save"), tmp_path)
    assert (c.gpus_per_node, c.fault_rank, c.tp, c.distributed_optimizer) == (8, 3, 2, False)


def test_multinode_shares_the_run_id(
    tmp_path: Path, megatron_stub: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = NvrxSettings(
        megatron_path=megatron_stub,
        overrides=PartialRunConfig(nnodes=2, gpus_per_node=4, tp=2, pp=2, rdzv_endpoint="n0:29400"),
    )
    monkeypatch.delenv("NVRX_RUN_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ConfigError, match="same run ID on all nodes"):
        scenario_config(settings, Scenario("megatron", "kill", "save"), tmp_path)
    # one session per node inside a job step (srun pytest ...): they share the job's ID
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    c = scenario_config(settings, Scenario("megatron", "kill", "save"), tmp_path)
    assert c.run_id == "777-megatron-kill-save" and c.world_size == 8
    assert c.launcher == "local"
    validate(c)
    # in the allocation but outside a step, the slurm launcher starts every node from this one
    # session: its own ID, as on one node
    monkeypatch.delenv("SLURM_STEP_ID")
    c = scenario_config(settings, Scenario("megatron", "kill", "save"), tmp_path)
    assert c.launcher == "slurm" and c.run_id.startswith("megatron-kill-save-")
