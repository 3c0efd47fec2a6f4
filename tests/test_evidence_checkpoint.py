"""Checkpoint metadata: real torch DCP checkpoints, written here (imports torch: a few seconds)."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.evidence.checkpoint import OptimizerState, read_checkpoint_metadata
from tests.doctor import KILL_RUN, copy_run


@pytest.fixture(scope="module")
def dcp_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny torch DCP checkpoints in Megatron's key style: with and without optimizer."""
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    root = tmp_path_factory.mktemp("dcp")
    states = {
        "with_optimizer": {
            "decoder": {"weight": torch.zeros(4)},
            "optimizer": {"state": {"exp_avg": {"decoder.weight": torch.zeros(4)}}},
        },
        "model_only": {"decoder": {"weight": torch.zeros(4)}},
    }
    out = {}
    for name, state in states.items():
        path = root / name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "no process group: saving non-distributed"
            dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path)))
        out[name] = path
    return out


def _run_with_checkpoint(tmp_path: Path, source: Path | None) -> Path:
    run = copy_run(KILL_RUN, tmp_path / "run")
    target = run.path("checkpoints/iter_0000005")
    if source is not None:
        shutil.copytree(source, target)
    return run.root


def test_metadata_with_optimizer_state(dcp_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    meta = read_checkpoint_metadata(dcp_checkpoints["with_optimizer"], 5, tmp_path)
    assert meta.state is OptimizerState.PRESENT
    assert (meta.optimizer_keys, meta.keys) == (1, 2)
    assert meta.example == "optimizer.state.exp_avg.decoder.weight"


def test_optimizer_state_confirmed_from_checkpoint(
    dcp_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    root = _run_with_checkpoint(tmp_path, dcp_checkpoints["with_optimizer"])
    v = judge_run_dir(root).verdict("optimizer_state_load")
    assert v.passed and "optimizer state confirmed in the checkpoint (1/2 keys)" in v.reason
    assert "checkpoints/iter_0000005/.metadata" in [r.location for r in v.evidence]


def test_checkpoint_without_optimizer_state_fails(
    dcp_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    root = _run_with_checkpoint(tmp_path, dcp_checkpoints["model_only"])
    v = judge_run_dir(root).verdict("optimizer_state_load")
    assert not v.passed
    assert "checkpoint 5 on disk: torch DCP metadata: none of 1 keys is optimizer state" in v.reason
    assert v.evidence[0].location == "checkpoints/iter_0000005/.metadata"


def test_corrupt_metadata_fails(tmp_path: Path) -> None:
    root = _run_with_checkpoint(tmp_path, None)
    target = root / "checkpoints/iter_0000005"
    target.mkdir()
    (target / ".metadata").write_bytes(b"\x80\x04 not a pickle")
    v = judge_run_dir(root).verdict("optimizer_state_load")
    assert not v.passed and "metadata unreadable" in v.reason


def test_common_pt_only_falls_back_to_logs(tmp_path: Path) -> None:
    root = _run_with_checkpoint(tmp_path, None)
    target = root / "checkpoints/iter_0000005"
    target.mkdir()
    (target / "common.pt").write_bytes(b"never unpickled")
    v = judge_run_dir(root).verdict("optimizer_state_load")
    assert v.passed and "judged from logs" in v.reason
    assert "cannot tell optimizer state: common.pt only" in v.render()


def test_checkpoint_dir_elsewhere(dcp_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    root = _run_with_checkpoint(tmp_path, None)
    elsewhere = tmp_path / "shared-ckpts"
    shutil.copytree(dcp_checkpoints["model_only"], elsewhere / "iter_0000005")
    v = judge_run_dir(root, elsewhere).verdict("optimizer_state_load")
    assert not v.passed
    assert v.evidence[0].location == f"{elsewhere}/iter_0000005/.metadata"
