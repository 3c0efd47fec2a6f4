"""Scenario settings: defaults per workload, user overrides, one GPU, multinode run IDs."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_nvrx.fixtures import scenario_config
from pytest_nvrx.plugin import NvrxSettings
from pytest_nvrx.scenarios import SCENARIOS, Scenario
from pytest_nvrx.settings import ConfigError, validate


def test_scenarios_and_markers() -> None:
    ids = [s.id for s in SCENARIOS]
    assert ids == [
        "reference-baseline",
        "reference-kill",
        "reference-hang",
        "megatron-baseline",
        "megatron-kill",
        "megatron-hang",
    ]
    assert Scenario("megatron", "hang").markers == ("gpu", "hang")
    assert Scenario("reference", "none").markers == ("baseline",)


def test_reference_defaults(tmp_path: Path) -> None:
    c = scenario_config(NvrxSettings(), Scenario("reference", "kill"), tmp_path)
    assert (c.gpus_per_node, c.fault_rank, c.train_iters) == (2, 1, 30)
    assert c.section_timeouts.render() == "setup:120,step:10,checkpointing:60"
    validate(c)


def test_megatron_defaults_one_gpu(tmp_path: Path, megatron_stub: Path) -> None:
    settings = NvrxSettings(megatron_path=megatron_stub)
    c = scenario_config(settings, Scenario("megatron", "hang"), tmp_path)
    assert (c.gpus_per_node, c.fault_rank, c.train_iters, c.save_interval) == (1, 0, 100, 5)
    assert c.section_timeouts.step == 30
    assert c.distributed_optimizer is True
    validate(c)


def test_user_overrides_win(tmp_path: Path, megatron_stub: Path) -> None:
    settings = NvrxSettings(
        megatron_path=megatron_stub,
        overrides={"gpus_per_node": 8, "fault_rank": 3, "tp": 2, "distributed_optimizer": False},
    )
    c = scenario_config(settings, Scenario("megatron", "kill"), tmp_path)
    assert (c.gpus_per_node, c.fault_rank, c.tp, c.distributed_optimizer) == (8, 3, 2, False)


def test_multinode_shares_the_run_id(
    tmp_path: Path, megatron_stub: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = NvrxSettings(
        megatron_path=megatron_stub,
        overrides={"nnodes": 2, "gpus_per_node": 4, "tp": 2, "pp": 2, "rdzv_endpoint": "n0:29400"},
    )
    monkeypatch.delenv("NVRX_RUN_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ConfigError, match="same run ID on all nodes"):
        scenario_config(settings, Scenario("megatron", "kill"), tmp_path)
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    c = scenario_config(settings, Scenario("megatron", "kill"), tmp_path)
    assert c.run_id == "777-megatron-kill" and c.world_size == 8
    validate(c)
