"""Checkpoint metadata: real torch DCP checkpoints, written here (imports torch: a few seconds)."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.evidence.checkpoint import OptimizerState, read_checkpoint_metadata
from tests.helpers.doctor import KILL_RUN, copy_run


@pytest.fixture(scope="module")
def dcp_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny torch DCP checkpoints in Megatron's key style: with and without optimizer,
    each saved as iteration 5's (DCP's metadata names the directory it was saved to)."""
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
        path = root / name / "iter_0000005"
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


# ---- untrusted metadata (issue #9 item 1): nothing in a judged run is executed ------------------

RECORDED_METADATA = sorted(
    (Path(__file__).parents[1] / "data").rglob("checkpoints/iter_*/.metadata")
)


def _touching_pickles(target: Path) -> dict[str, bytes]:
    """Three ways a pickle can name a callable (each runs ``touch target`` when unpickled)."""
    command = f"touch {target}".encode()
    return {
        # protocol 0/2 GLOBAL + REDUCE
        "global-reduce": b"cposix\nsystem\n(V" + command + b"\ntR.",
        # protocol 4 STACK_GLOBAL + REDUCE
        "stack-global": b"\x80\x04\x8c\x05posix\x8c\x06system\x93\x8c"
        + bytes([len(command)])
        + command
        + b"\x85R.",
        # protocol 0 INST (calls the class with the marked arguments)
        "inst": b"(V" + command + b"\niposix\nsystem\n.",
    }


@pytest.mark.parametrize("shape", ["global-reduce", "stack-global", "inst"])
def test_malicious_metadata_is_refused_not_run(tmp_path: Path, shape: str) -> None:
    proof = tmp_path / "code-ran"
    directory = tmp_path / "iter_0000005"
    directory.mkdir()
    (directory / ".metadata").write_bytes(_touching_pickles(proof)[shape])
    meta = read_checkpoint_metadata(directory, 5, tmp_path)
    assert not proof.exists(), "reading the metadata executed a command"
    assert meta.state is OptimizerState.UNREADABLE
    assert "refused global 'posix.system'" in meta.detail


@pytest.mark.parametrize("path", RECORDED_METADATA, ids=lambda p: str(p.parent.parent.parent.name))
def test_recorded_metadata_reads_as_torch_reads_it(path: Path) -> None:
    """The restricted reader sees the same keys torch's own reader sees (our recorded runs)."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    expected = [
        str(k) for k in dcp.FileSystemReader(str(path.parent)).read_metadata().state_dict_metadata
    ]
    meta = read_checkpoint_metadata(path.parent, 5, path.parent.parent)
    optimizer = [k for k in expected if k.startswith("optimizer.")]
    assert (meta.keys, meta.optimizer_keys) == (len(expected), len(optimizer))
    assert meta.state is (OptimizerState.PRESENT if optimizer else OptimizerState.MISSING)


def test_recorded_metadata_counts() -> None:
    """Today's figures of one recorded run (what verify prints for megatron-kill-40)."""
    directory = (
        Path(__file__).parents[1] / "data/gpu-recipe/megatron-kill-40/checkpoints/iter_0000005"
    )
    meta = read_checkpoint_metadata(directory, 5, directory.parent.parent)
    assert (meta.state, meta.optimizer_keys, meta.keys) == (OptimizerState.PRESENT, 48, 83)
    assert meta.example == "optimizer.state.exp_avg.decoder.final_layernorm.bias"


def test_metadata_fifo_is_not_evidence(tmp_path: Path) -> None:
    directory = tmp_path / "iter_0000005"
    directory.mkdir()
    os.mkfifo(directory / ".metadata")
    meta = read_checkpoint_metadata(directory, 5, tmp_path)
    assert meta.state is OptimizerState.UNREADABLE
    assert meta.not_evidence is not None and "is a FIFO" in meta.not_evidence


def test_checkpoint_iteration_dir_that_is_a_file_is_not_evidence(tmp_path: Path) -> None:
    (tmp_path / "iter_0000005").write_text("not a directory")
    meta = read_checkpoint_metadata(tmp_path / "iter_0000005", 5, tmp_path)
    assert meta.state is OptimizerState.UNREADABLE
    assert meta.not_evidence is not None and "not a directory" in meta.not_evidence


def test_oversized_metadata_is_not_read(tmp_path: Path) -> None:
    from pytest_nvrx.evidence.checkpoint import MAX_METADATA_BYTES

    directory = tmp_path / "iter_0000005"
    directory.mkdir()
    with (directory / ".metadata").open("wb") as f:
        f.truncate(MAX_METADATA_BYTES + 1)  # sparse: no disk used
    meta = read_checkpoint_metadata(directory, 5, tmp_path)
    # what it says went unread: the load it proves cannot be judged (#36 item 4), never the
    # "pruned, judged from the logs" of a checkpoint without metadata
    assert meta.state is OptimizerState.TOO_LARGE
    assert meta.detail == (
        f"torch DCP metadata not read: iter_0000005/.metadata is {MAX_METADATA_BYTES + 1} bytes,"
        f" over the {MAX_METADATA_BYTES}-byte read cap"
    )
