"""Every validation rule of the walkthrough: refused with a clear message, nothing written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.recipe import prepare_run_dir
from pytest_nvrx.settings import (
    ConfigError,
    RunConfig,
    SectionTimeouts,
    read_baseline,
    resolve,
    validate,
)
from tests.conftest import snapshot


def make(tmp_path: Path, megatron: Path, **kw: Any) -> RunConfig:
    base: dict[str, Any] = {
        "work_dir": tmp_path / "work",
        "run_id": "r1",
        "megatron_path": megatron,
    }
    base.update(kw)
    return RunConfig(**base)


def test_defaults_are_the_walkthroughs(tmp_path: Path, megatron_stub: Path) -> None:
    c = make(tmp_path, megatron_stub)
    assert (c.nnodes, c.gpus_per_node, c.tp, c.pp) == (1, 2, 1, 1)
    assert (c.train_iters, c.save_interval, c.fault, c.fault_rank) == (100, 5, "kill", 1)
    assert c.section_timeouts.render() == "setup:900,step:120,checkpointing:600"
    assert c.out_of_section_timeout == 180 and c.max_restarts == 3
    assert c.rdzv_endpoint == "localhost:0"
    assert c.layout.checkpoint_dir == tmp_path / "work" / "runs" / "r1" / "checkpoints"
    validate(c)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"nnodes": 0}, "nnodes must be a positive integer"),
        ({"gpus_per_node": -1}, "gpus_per_node must be a positive integer"),
        ({"tp": 0}, "tp must be a positive integer"),
        ({"pp": 0}, "pp must be a positive integer"),
        ({"train_iters": 0}, "train_iters must be a positive integer"),
        ({"save_interval": 0}, "save_interval must be a positive integer"),
        ({"gpus_per_node": 3, "tp": 2}, "must be divisible by TP x PP = 2"),
        ({"gpus_per_node": 3, "pp": 3}, "PP=3 must divide the model's 4 layers"),
        ({"gpus_per_node": 3, "tp": 3}, "TP=3 must divide the model's 8 attention heads"),
        ({"work_dir": Path("relative/work")}, "work dir must be an absolute path"),
        ({"checkpoint_dir": Path("ckpt")}, "checkpoint dir must be an absolute path"),
        ({"run_id": "bad id"}, "use only letters, digits, underscores or hyphens"),
        ({"run_id": "../escape"}, "use only letters, digits, underscores or hyphens"),
        ({"run_id": ""}, "use only letters, digits, underscores or hyphens"),
        ({"nnodes": 2}, "needs a rendezvous endpoint"),
        ({"fault_rank": 2}, "fault rank 2 is not a rank of a world of size 2"),
        ({"gpus_per_node": 1}, "on one GPU set the fault rank to 0"),
        ({"megatron_path": None}, "needs a Megatron-LM checkout"),
        ({"fault": "crash"}, "fault must be one of none, kill, hang"),
        ({"workload": "bert"}, "workload must be one of megatron, reference"),
        ({"workload": "reference", "gpus_per_node": 1, "fault": "none"}, "at least 2 ranks"),
        ({"out_of_section_timeout": 0.0}, "out-of-section timeout"),
        ({"max_restarts": -1}, "max_restarts must be >= 0"),
    ],
)
def test_bad_settings_are_refused_without_writing(
    tmp_path: Path, megatron_stub: Path, changes: dict[str, Any], message: str
) -> None:
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        prepare_run_dir(make(tmp_path, megatron_stub, **changes))
    assert snapshot(tmp_path) == before


def test_baseline_ignores_fault_rank(tmp_path: Path, megatron_stub: Path) -> None:
    validate(make(tmp_path, megatron_stub, gpus_per_node=1, fault="none"))


def test_megatron_path_without_pretrain_gpt(tmp_path: Path) -> None:
    empty = tmp_path / "not-megatron"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"pretrain_gpt.py not found"):
        validate(make(tmp_path, empty))


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "work" / "runs" / "r1"
    (run / "checkpoints").mkdir(parents=True)
    return run


def test_existing_marker_refused(tmp_path: Path, megatron_stub: Path) -> None:
    run = _run_dir(tmp_path)
    (run / "fault_injected.json").write_text("{}")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match="already has an injection marker"):
        prepare_run_dir(make(tmp_path, megatron_stub))
    assert snapshot(tmp_path) == before


def test_dangling_marker_symlink_refused(tmp_path: Path, megatron_stub: Path) -> None:
    run = _run_dir(tmp_path)
    (run / "fault_injected.json").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="already has an injection marker"):
        validate(make(tmp_path, megatron_stub))


def test_ft_state_refused(tmp_path: Path, megatron_stub: Path) -> None:
    run = _run_dir(tmp_path)
    (run / "checkpoints" / "ft_state.json").write_text("{}")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match=r"ft_state\.json"):
        prepare_run_dir(make(tmp_path, megatron_stub))
    assert snapshot(tmp_path) == before


def test_ft_state_in_user_checkpoint_dir_refused(tmp_path: Path, megatron_stub: Path) -> None:
    user_ckpt = tmp_path / "existing-ckpt"
    user_ckpt.mkdir()
    (user_ckpt / "ft_state.json").write_text("{}")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match=r"ft_state\.json"):
        prepare_run_dir(make(tmp_path, megatron_stub, checkpoint_dir=user_ckpt))
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "is empty"),
        ("   \n", "is empty"),
        ("five\n", "does not hold an integer"),
        ("-3", "does not hold an integer"),
        ("5.0", "does not hold an integer"),
        (b"\xff\xfe", "unreadable"),
    ],
)
def test_bad_existing_tracker_refused(
    tmp_path: Path, megatron_stub: Path, content: str | bytes, message: str
) -> None:
    user_ckpt = tmp_path / "existing-ckpt"
    user_ckpt.mkdir()
    tracker = user_ckpt / "latest_checkpointed_iteration.txt"
    if isinstance(content, bytes):
        tracker.write_bytes(content)
    else:
        tracker.write_text(content)
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match=message):
        prepare_run_dir(make(tmp_path, megatron_stub, checkpoint_dir=user_ckpt))
    assert snapshot(tmp_path) == before


def test_unreadable_tracker_refused(tmp_path: Path, megatron_stub: Path) -> None:
    user_ckpt = tmp_path / "existing-ckpt"
    (user_ckpt / "latest_checkpointed_iteration.txt").mkdir(parents=True)  # EISDIR on read
    with pytest.raises(ConfigError, match="unreadable"):
        validate(make(tmp_path, megatron_stub, checkpoint_dir=user_ckpt))


def test_existing_tracker_gives_baseline(tmp_path: Path) -> None:
    tracker = tmp_path / "latest_checkpointed_iteration.txt"
    assert read_baseline(tracker) == 0
    tracker.write_text("15\n")
    assert read_baseline(tracker) == 15


def test_existing_checkpoint_dir_is_not_modified(tmp_path: Path, megatron_stub: Path) -> None:
    user_ckpt = tmp_path / "existing-ckpt"
    user_ckpt.mkdir()
    (user_ckpt / "latest_checkpointed_iteration.txt").write_text("10")
    (user_ckpt / "iter_0000010").mkdir()
    before = snapshot(user_ckpt)
    layout = prepare_run_dir(make(tmp_path, megatron_stub, checkpoint_dir=user_ckpt))
    assert layout.checkpoint_dir == user_ckpt
    assert snapshot(user_ckpt) == before


def test_reused_run_dir_refused(tmp_path: Path, megatron_stub: Path) -> None:
    run = _run_dir(tmp_path)
    (run / "logs").mkdir()
    (run / "logs" / "train_cycle0.log").write_text("old run\n")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match="was used before"):
        prepare_run_dir(make(tmp_path, megatron_stub))
    assert snapshot(tmp_path) == before


def test_dry_run_dirs_can_be_reused(tmp_path: Path, megatron_stub: Path) -> None:
    config = make(tmp_path, megatron_stub)
    prepare_run_dir(config)
    prepare_run_dir(config)  # empty artifact dirs from a dry run are fine


# --- resolution -------------------------------------------------------------------------------


def test_env_is_read_and_explicit_wins(tmp_path: Path, megatron_stub: Path) -> None:
    env = {
        "MEGATRON_PATH": str(megatron_stub),
        "NVRX_WORK_DIR": str(tmp_path),
        "NVRX_RUN_ID": "from-env",
        "NNODES": "1",
        "GPUS_PER_NODE": "4",
        "TP": "2",
        "PP": "2",
        "TRAIN_ITERS": "40",
        "SAVE_INTERVAL": "10",
        "NVRX_DEMO_FAULT": "hang",
        "NVRX_FAULT_RANK": "3",
        "NVRX_CHECKPOINT_DIR": str(tmp_path / "ck"),
        "RDZV_ENDPOINT": "host:29400",
    }
    c = resolve({"tp": 1, "run_id": "explicit"}, env)
    assert c.run_id == "explicit" and c.tp == 1
    assert (c.gpus_per_node, c.pp, c.train_iters, c.save_interval) == (4, 2, 40, 10)
    assert (c.fault, c.fault_rank, c.rdzv_endpoint) == ("hang", 3, "host:29400")
    assert c.checkpoint_dir == tmp_path / "ck" and c.megatron_path == megatron_stub


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("TP", "0", "environment variable TP must be a positive integer"),
        ("TRAIN_ITERS", "ten", "environment variable TRAIN_ITERS must be a positive integer"),
        ("NNODES", "1.5", "environment variable NNODES must be a positive integer"),
        ("NVRX_DEMO_FAULT", "segv", "NVRX_DEMO_FAULT must be one of none, kill, hang"),
        ("NVRX_FAULT_RANK", "-1", "NVRX_FAULT_RANK must be a non-negative integer"),
    ],
)
def test_bad_env_values_name_the_variable(
    tmp_path: Path, var: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve({}, {"NVRX_WORK_DIR": str(tmp_path), var: value})


def test_work_dir_required() -> None:
    with pytest.raises(ConfigError, match="NVRX_WORK_DIR"):
        resolve({}, {})


def test_default_run_id_single_node(tmp_path: Path) -> None:
    c = resolve({}, {"NVRX_WORK_DIR": str(tmp_path)})
    assert c.run_id.endswith(f"-{os.getpid()}")
    assert len(c.run_id.split("-")[0]) == len("20261129T120000")


def test_multinode_needs_shared_run_id(tmp_path: Path) -> None:
    env = {"NVRX_WORK_DIR": str(tmp_path), "NNODES": "2", "RDZV_ENDPOINT": "h:1"}
    with pytest.raises(ConfigError, match="same run ID on all nodes"):
        resolve({}, env)
    assert resolve({}, {**env, "SLURM_JOB_ID": "4242"}).run_id == "4242"


@pytest.mark.parametrize(
    "text",
    [
        "setup:900,step:120",
        "setup:900,step:120,checkpointing:0",
        "setup:900,step:x,checkpointing:600",
        "init:900,step:120,checkpointing:600",
        "setup:900,setup:900,step:1,checkpointing:1",
        "setup=900",
    ],
)
def test_bad_section_timeouts(text: str) -> None:
    with pytest.raises(ConfigError):
        SectionTimeouts.parse(text)


def test_section_timeouts_round_trip() -> None:
    t = SectionTimeouts.parse("step:30,setup:600,checkpointing:300.5")
    assert t.render() == "setup:600,step:30,checkpointing:300.5"
