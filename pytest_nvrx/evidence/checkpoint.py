"""Checkpoint metadata: does the restored checkpoint hold optimizer state?

Megatron prints no positive "optimizer loaded" line, so where the checkpoint is still on disk its
torch DCP metadata (``iter_0000005/.metadata``) is the positive proof: optimizer state is stored
under ``optimizer.*`` keys (``optimizer.state.exp_avg.*`` for Adam). torch is imported only when
such a file exists (it takes seconds). Shards are often pruned after a run (tests/data/gpu kept
only the tracker); the criteria then judge from logs and tracker.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from pytest_nvrx.evidence.refs import EvidenceRef, display_path

DCP_METADATA = ".metadata"
COMMON_PT = "common.pt"
OPTIMIZER_PREFIX = "optimizer."


class OptimizerState(StrEnum):
    ABSENT_DIR = "absent"  # checkpoint directory not there (pruned or never written)
    PRESENT = "present"  # metadata lists optimizer keys
    MISSING = "missing"  # metadata readable and lists no optimizer keys
    UNREADABLE = "unreadable"  # metadata file exists but cannot be read
    UNKNOWN = "unknown"  # directory exists but nothing here can tell


@dataclass(frozen=True, slots=True)
class CheckpointMetadata:
    iteration: int
    dir: str
    state: OptimizerState
    keys: int = 0
    optimizer_keys: int = 0
    example: str | None = None
    detail: str = ""

    @property
    def ref(self) -> EvidenceRef:
        name = {
            OptimizerState.ABSENT_DIR: self.dir,
            OptimizerState.UNKNOWN: self.dir,
        }.get(self.state, f"{self.dir}/{DCP_METADATA}")
        return EvidenceRef(name, None, self.detail)


def _dcp_keys(directory: Path) -> list[str]:
    # slow import (seconds): only when a checkpoint is on disk
    from torch.distributed.checkpoint import FileSystemReader  # type: ignore[attr-defined]

    metadata: Any = FileSystemReader(str(directory)).read_metadata()
    return [str(k) for k in metadata.state_dict_metadata]


def read_checkpoint_metadata(directory: Path, iteration: int, run_dir: Path) -> CheckpointMetadata:
    """What the checkpoint directory of ``iteration`` says about optimizer state."""
    shown = display_path(directory, run_dir)
    if not directory.is_dir():
        return CheckpointMetadata(
            iteration,
            shown,
            OptimizerState.ABSENT_DIR,
            detail="(absent: shards pruned or never written)",
        )
    meta = directory / DCP_METADATA
    if meta.is_file():
        try:
            keys = _dcp_keys(directory)
        except Exception as exc:  # a corrupt pickle can raise anything
            return CheckpointMetadata(
                iteration,
                shown,
                OptimizerState.UNREADABLE,
                detail=f"torch DCP metadata unreadable: {type(exc).__name__}: {exc}",
            )
        optimizer = sorted(k for k in keys if k.startswith(OPTIMIZER_PREFIX))
        example = next(
            (k for k in optimizer if ".exp_avg" in k), optimizer[0] if optimizer else None
        )
        if optimizer:
            detail = (
                f"torch DCP metadata: {len(optimizer)} of {len(keys)} keys are optimizer state"
                f" (e.g. {example})"
            )
            state = OptimizerState.PRESENT
        else:
            detail = (
                f"torch DCP metadata: none of {len(keys)} keys is optimizer state"
                f" ({OPTIMIZER_PREFIX}*)"
            )
            state = OptimizerState.MISSING
        return CheckpointMetadata(
            iteration, shown, state, len(keys), len(optimizer), example, detail
        )
    what = (
        "common.pt only (not unpickled: it may hold code)"
        if (directory / COMMON_PT).is_file()
        else "no .metadata"
    )
    return CheckpointMetadata(
        iteration, shown, OptimizerState.UNKNOWN, detail=f"cannot tell optimizer state: {what}"
    )
