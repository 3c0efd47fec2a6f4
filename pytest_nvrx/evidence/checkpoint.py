"""Checkpoint metadata: does the restored checkpoint hold optimizer state?

Megatron prints no positive "optimizer loaded" line, so where the checkpoint is still on disk its
torch DCP metadata (``iter_0000005/.metadata``) is the positive proof: optimizer state is stored
under ``optimizer.*`` keys (``optimizer.state.exp_avg.*`` for Adam). Shards are often pruned after
a run (tests/data/gpu kept only the tracker); the criteria then judge from logs and tracker.

``.metadata`` is a pickle, and a run directory is untrusted: torch's own reader
(``FileSystemReader.read_metadata``) would run whatever the pickle names. :func:`read_dcp_metadata`
unpickles it with a restricted unpickler instead: the few globals DCP metadata names (its own
classes, ``torch.Size``, dtypes, layouts) become inert stand-ins that only record what the pickle
passes them, and any other global is refused, so nothing from the file is ever called, and torch
is not even imported.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import ClassVar

from pytest_nvrx.evidence.refs import (
    EvidenceRef,
    FileTooLarge,
    display_path,
    file_refusal,
    read_capped,
)
from pytest_nvrx.layout import iteration_of_dir_name
from pytest_nvrx.settings.values import quote

DCP_METADATA = ".metadata"
COMMON_PT = "common.pt"
OPTIMIZER_PREFIX = "optimizer."
#: A larger .metadata is not read (TOO_LARGE: what it would prove about the restore cannot be
#: judged). Real ones are ~0.5 KB per key (42 KB for the recorded 83-key GPT) and grow with the
#: number of shards. A crafted pickle expands in memory (measured: 32 MiB of "empty dict,
#: append" opcodes peaks at 1.2 GB RSS, 64 MiB at 2.4 GB), so the cap is also the memory bound.
MAX_METADATA_BYTES = 32 << 20
_METADATA_CLASS = "torch.distributed.checkpoint.metadata.Metadata"
#: At most this many entries of a checkpoint directory are listed (a run saves every few
#: iterations: 100 000 checkpoints is no run of ours); past it the listing is not evidence.
MAX_CHECKPOINT_ENTRIES = 100_000


class OptimizerState(StrEnum):
    ABSENT_DIR = "absent"  # checkpoint directory not there (pruned or never written)
    PRESENT = "present"  # metadata lists optimizer keys
    MISSING = "missing"  # metadata readable and lists no optimizer keys
    UNREADABLE = "unreadable"  # metadata file exists but cannot be read
    UNKNOWN = "unknown"  # directory exists but nothing here can tell
    # metadata file exists but is over the read cap: it says something that went unread
    TOO_LARGE = "too large"


@dataclass(frozen=True, slots=True)
class CheckpointMetadata:
    iteration: int
    dir: str
    state: OptimizerState
    keys: int = 0
    optimizer_keys: int = 0
    example: str | None = None
    detail: str = ""
    # set when what is on disk is no checkpoint at all (a file as the iteration directory, a
    # FIFO as .metadata, a .metadata naming another checkpoint): the run cannot be judged
    not_evidence: str | None = None
    # the state-dict keys that are not optimizer state (the model's, RNG, ...): one run's
    # checkpoints all hold the same (None: not read)
    model_keys: frozenset[str] | None = None

    @property
    def ref(self) -> EvidenceRef:
        name = {
            OptimizerState.ABSENT_DIR: self.dir,
            OptimizerState.UNKNOWN: self.dir,
        }.get(self.state, f"{self.dir}/{DCP_METADATA}")
        return EvidenceRef(name, None, self.detail)


class MetadataRefused(pickle.UnpicklingError):
    """The metadata pickle names something DCP metadata never needs."""


class _Inert:
    """Stand-in for an admitted global: records what the pickle passes it, runs nothing."""

    __slots__ = ("args", "state")
    qualname: ClassVar[str] = ""
    args: tuple[object, ...]
    state: object

    def __new__(cls, *args: object) -> _Inert:
        # NEWOBJ calls __new__ only, REDUCE the class: both leave a complete stand-in
        self = super().__new__(cls)
        self.args = args
        self.state = None
        return self

    def __init__(self, *args: object) -> None:
        pass

    def __setstate__(self, state: object) -> None:
        self.state = state


# What real .metadata files name (torch 2.x, checked on every recorded run in tests/data):
# torch.distributed.checkpoint.{metadata,filesystem} classes, torch.Size, dtypes, and the
# layout helper torch.serialization._get_layout; torch's own dcp.save adds the checkpoint's
# path (StorageMeta.checkpoint_id, a pathlib path). torch.distributed._shard held some of these
# classes in older torch.
_ADMITTED_PACKAGES = ("torch.distributed.checkpoint.", "torch.distributed._shard.")
_ADMITTED_TORCH = re.compile(
    r"Size|bool|half|double|long|short|int|cfloat|cdouble|chalf|strided|sparse_\w+"
    r"|(?:b?float|u?int|q?u?int|complex|bits)\w*"
    r"|contiguous_format|channels_last(?:_3d)?|preserve_format"
)
_PATH_MODULES = ("pathlib", "pathlib._local")  # pathlib._local: Python 3.13+
_PATH_CLASSES = ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _admitted(module: str, name: str) -> bool:
    if not _IDENTIFIER.fullmatch(name):
        return False  # dotted names reach attributes of attributes
    if module.startswith(_ADMITTED_PACKAGES):
        return all(_IDENTIFIER.fullmatch(part) for part in module.split("."))
    if module == "torch":
        return _ADMITTED_TORCH.fullmatch(name) is not None
    if module in _PATH_MODULES:
        return name in _PATH_CLASSES
    return (module, name) == ("torch.serialization", "_get_layout")


class _RestrictedUnpickler(pickle.Unpickler):
    """Every global of the pickle goes through :meth:`find_class` (GLOBAL, STACK_GLOBAL, INST,
    OBJ, EXT*); persistent ids are refused by the base class."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self._stand_ins: dict[str, type[_Inert]] = {}

    def find_class(self, module: str, name: str) -> type[_Inert]:
        qualname = f"{module}.{name}"
        if not _admitted(module, name):
            raise MetadataRefused(
                f"refused global {quote(qualname)}: DCP metadata names only"
                " torch.distributed.checkpoint classes, torch.Size, dtypes and paths"
            )
        cls = self._stand_ins.get(qualname)
        if cls is None:
            cls = type(name, (_Inert,), {"__slots__": (), "qualname": qualname})
            self._stand_ins[qualname] = cls
        return cls


def _fields(obj: _Inert) -> dict[object, object]:
    """A dataclass stand-in's fields: BUILD state (dict, or (dict, slots) for slots classes)."""
    state = obj.state
    if isinstance(state, tuple) and len(state) == 2:
        merged: dict[object, object] = {}
        for part in state:
            if isinstance(part, dict):
                merged.update(part)
        return merged
    return state if isinstance(state, dict) else {}


def read_dcp_metadata(data: bytes) -> tuple[list[str], str | None]:
    """The state-dict keys of a torch DCP ``.metadata`` pickle and the checkpoint path it says
    it was saved to (``storage_meta.checkpoint_id``; None: it names none), without running any
    of it.

    Raises :class:`MetadataRefused` for a global DCP metadata never names, ``ValueError`` for
    a pickle that is not DCP metadata, and whatever a corrupt pickle makes the unpickler raise.
    """
    root = _RestrictedUnpickler(data).load()
    if not isinstance(root, _Inert) or root.qualname != _METADATA_CLASS:
        what = root.qualname if isinstance(root, _Inert) else type(root).__name__
        raise ValueError(f"the pickle holds {quote(what)}, not {_METADATA_CLASS}")
    fields = _fields(root)
    entries = fields.get("state_dict_metadata", root.args[0] if root.args else None)
    if not isinstance(entries, dict) or not all(isinstance(k, str) for k in entries):
        raise ValueError("its state_dict_metadata is not a mapping of key names")
    return list(entries), _checkpoint_id(fields.get("storage_meta"))


def _checkpoint_id(storage_meta: object) -> str | None:
    """``StorageMeta.checkpoint_id`` as a ``/`` path: a str (Megatron's writer) or a pathlib
    path (torch's ``dcp.save``: its parts); None when absent or anything else."""
    if not isinstance(storage_meta, _Inert):
        return None
    value = _fields(storage_meta).get(
        "checkpoint_id", storage_meta.args[0] if storage_meta.args else None
    )
    if isinstance(value, str):
        return value
    if isinstance(value, _Inert) and value.args and all(isinstance(a, str) for a in value.args):
        return "/".join(str(a) for a in value.args).replace("//", "/")
    return None


def _why_unreadable(exc: BaseException) -> str:
    """The error, its text quoted (:func:`quote`: a parse error can echo the file)."""
    if isinstance(exc, MetadataRefused):
        return str(exc)  # our own text; the global's name in it is already quoted
    return f"{type(exc).__name__}: {quote(str(exc))}"


def read_checkpoint_metadata(directory: Path, iteration: int, run_dir: Path) -> CheckpointMetadata:
    """What the checkpoint directory of ``iteration`` says about optimizer state.

    A checkpoint directory that is not a directory, or a ``.metadata`` that is not a regular
    file (or links out of its directory), is reported in ``not_evidence``: the run cannot be
    judged. A pickle that names anything DCP metadata does not is UNREADABLE.
    """
    shown = display_path(directory, run_dir)
    why = file_refusal(directory, directory.parent, want_dir=True)
    if why is not None:
        return CheckpointMetadata(
            iteration,
            shown,
            OptimizerState.UNREADABLE,
            detail=f"{shown} {why}",
            not_evidence=f"{shown} {why}",
        )
    if not directory.is_dir():
        return CheckpointMetadata(
            iteration,
            shown,
            OptimizerState.ABSENT_DIR,
            detail="(absent: shards pruned or never written)",
        )
    meta = directory / DCP_METADATA
    meta_shown = f"{shown}/{DCP_METADATA}"
    why = file_refusal(meta, directory)
    if why is not None:
        return CheckpointMetadata(
            iteration,
            shown,
            OptimizerState.UNREADABLE,
            detail=f"torch DCP metadata unreadable: {meta_shown} {why}",
            not_evidence=f"{meta_shown} {why}",
        )
    if meta.is_file():
        try:
            keys, saved_to = read_dcp_metadata(read_capped(meta, MAX_METADATA_BYTES, directory))
        except FileTooLarge as exc:
            return CheckpointMetadata(
                iteration,
                shown,
                OptimizerState.TOO_LARGE,
                detail=f"torch DCP metadata not read: {meta_shown} is {exc.size} bytes, over"
                f" the {exc.limit}-byte read cap",
            )
        except Exception as exc:  # a corrupt pickle can raise anything
            return CheckpointMetadata(
                iteration,
                shown,
                OptimizerState.UNREADABLE,
                detail=f"torch DCP metadata unreadable: {_why_unreadable(exc)}",
            )
        named = saved_to.rstrip("/").rsplit("/", 1)[-1] if saved_to is not None else None
        if saved_to is not None and named is not None and named != directory.name:
            # torch DCP writes the directory it saved into: this is another checkpoint's file
            why = (
                f"{meta_shown} says it was saved to {quote(named)}"
                f" (storage_meta.checkpoint_id {quote(saved_to)}), not to"
                f" {quote(directory.name)}: it is another checkpoint's metadata"
            )
            return CheckpointMetadata(
                iteration, shown, OptimizerState.UNREADABLE, detail=why, not_evidence=why
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
        model = frozenset(k for k in keys if not k.startswith(OPTIMIZER_PREFIX))
        return CheckpointMetadata(
            iteration, shown, state, len(keys), len(optimizer), example, detail, None, model
        )
    what = (
        "common.pt only (not unpickled: it may hold code)"
        if (directory / COMMON_PT).is_file()
        else "no .metadata"
    )
    return CheckpointMetadata(
        iteration, shown, OptimizerState.UNKNOWN, detail=f"cannot tell optimizer state: {what}"
    )


def list_checkpoint_iterations(checkpoint_dir: Path) -> tuple[int, ...] | None:
    """The iterations of the checkpoint directories (``iter_N/``, Megatron's names, the reference
    workload's too) under ``checkpoint_dir``, sorted; None when it cannot be listed (absent, not
    a directory, unreadable, more than MAX_CHECKPOINT_ENTRIES entries). A link is no checkpoint
    directory: it is not followed, and not listed."""
    found: list[int] = []
    try:
        with os.scandir(checkpoint_dir) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_CHECKPOINT_ENTRIES:
                    return None
                iteration = iteration_of_dir_name(entry.name)
                if iteration is not None and entry.is_dir(follow_symlinks=False):
                    found.append(iteration)
    except OSError:
        return None
    return tuple(sorted(found))
