"""What of a scenario's run directory outlives the session: the evidence, not the tensors.

The terminal summary and the JUnit property ``nvrx_run_dir`` name a scenario's run directory and
every verdict quotes ``file:line`` inside it, so the directory must still be there when the
session is over. What makes it large is the checkpoint payload (torch DCP shards
``iter_N/__0_0.distcp``, Megatron's legacy ``mp_rank_00/model_optim_rng.pt``); no criterion reads
a payload file. The evidence reads the tracker and, of each checkpoint, its directory and its
metadata (``.metadata``, whose optimizer keys prove optimizer state; ``metadata.json``;
``common.pt``, whose presence is reported), and those are small (0.5 KB to 44 KB a checkpoint).

So :func:`prune_checkpoint_payload` removes, below the checkpoint root, every regular file of a
checkpoint directory (a subdirectory, at any depth) whose name is not metadata, and nothing
else: every directory stays (``iter_N/`` is the evidence that a save of N was written), files
at the checkpoint root stay (the tracker ``latest_checkpointed_iteration.txt``,
``ft_state.json``), logs, cycle records, marker, manifest, result and claim files stay. Links
are neither followed nor removed.

It only ever prunes a tree the caller owns: the checkpoint directory must resolve inside
``owned_root`` (the plugin passes the per-scenario directory it made under pytest's tmp). A
checkpoint directory elsewhere (the CLI's ``--checkpoint-dir``, a link out of the run dir) or
a user's ``--nvrx-work-dir`` is never touched; the plugin does not call this at all for a
user's work dir or with ``--nvrx-keep``. No pytest here: the CLI or a CI step can apply the
same policy.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from pytest_nvrx.evidence.checkpoint import COMMON_PT, DCP_METADATA
from pytest_nvrx.layout import RunLayout

#: Files of a checkpoint directory that are evidence, not payload: torch DCP's metadata pickle,
#: Megatron's ``metadata.json`` (format and versions) and its common state ``common.pt``.
CHECKPOINT_METADATA_NAMES = frozenset({DCP_METADATA, "metadata.json", COMMON_PT})


@dataclass(frozen=True)
class Pruned:
    """What :func:`prune_checkpoint_payload` did: the files it removed (relative to the run
    directory where they lie inside it), the bytes they held, and why it did nothing or
    could not remove some."""

    removed: tuple[str, ...] = ()
    freed_bytes: int = 0
    skipped: str | None = None
    errors: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        if self.skipped is not None:
            return f"checkpoint payload kept: {self.skipped}"
        text = (
            f"removed {len(self.removed)} checkpoint payload files"
            f" ({_size(self.freed_bytes)}); logs, records and checkpoint metadata kept"
        )
        if self.errors:
            text += f"; {len(self.errors)} could not be removed (first: {self.errors[0]})"
        return text


def is_checkpoint_metadata(name: str) -> bool:
    """Whether a file of a checkpoint directory is kept (evidence) rather than pruned."""
    return name in CHECKPOINT_METADATA_NAMES


def prune_checkpoint_payload(layout: RunLayout, owned_root: Path) -> Pruned:
    """Remove the checkpoint payload of a finished run whose directories ``owned_root`` holds.

    Call it only after the run's whole process tree is gone (nothing writes a shard any
    more). Does nothing (``skipped`` says why) when the run or checkpoint directory is not
    inside ``owned_root`` or the checkpoint directory is not a plain directory. An unlink that
    fails is recorded in ``errors``, never raised: evidence kept matters more than bytes freed.
    """
    root = Path(os.path.realpath(owned_root))
    checkpoint_dir = Path(os.path.realpath(layout.checkpoint_dir))
    run_dir = Path(os.path.realpath(layout.run_dir))
    for what, path in (("run", run_dir), ("checkpoint", checkpoint_dir)):
        if not path.is_relative_to(root) or path == root:
            return Pruned(skipped=f"{what} directory {path} is not inside {root}")
    try:
        mode = os.lstat(layout.checkpoint_dir).st_mode
    except FileNotFoundError:
        return Pruned(skipped=f"no checkpoint directory {layout.checkpoint_dir}")
    if not stat.S_ISDIR(mode):
        return Pruned(skipped=f"{layout.checkpoint_dir} is not a directory")

    removed: list[str] = []
    errors: list[str] = []
    freed = 0
    # os.walk does not descend into links to directories (followlinks=False)
    for directory, _subdirs, files in os.walk(checkpoint_dir):
        here = Path(directory)
        if here == checkpoint_dir:
            continue  # the root's files are the checkpoint index: tracker, ft_state.json
        for name in files:
            if is_checkpoint_metadata(name):
                continue
            path = here / name
            try:
                info = os.lstat(path)
                if not stat.S_ISREG(info.st_mode):
                    continue  # a link, FIFO or socket: tiny, and a link is never followed
                path.unlink()
            except OSError as exc:
                errors.append(f"{path}: {exc.strerror or exc}")
                continue
            freed += info.st_size
            removed.append(str(path.relative_to(run_dir) if path.is_relative_to(run_dir) else path))
    return Pruned(tuple(sorted(removed)), freed, None, tuple(errors))


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"
