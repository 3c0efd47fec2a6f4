"""``latest_checkpointed_iteration.txt``: the iteration of the newest *finalized* checkpoint.

Megatron rewrites it (plain open/write, so a reader can catch it empty) only when an async save
is finalized; after a finished run it holds the last completed checkpoint. ``release`` marks a
release checkpoint. An empty tracker can be a write cut short; any other text (``twenty``,
``-20``) is none that Megatron or the reference workload writes (:attr:`Tracker.junk`: the run
cannot be judged, criteria/consistency.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_nvrx.evidence.refs import (
    EvidenceRef,
    FileTooLarge,
    display_path,
    excerpt,
    file_refusal,
    quote,
    read_capped,
)

_MAX_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Tracker:
    file: str
    exists: bool
    iteration: int | None = None
    release: bool = False
    error: str | None = None  # set when it exists but holds no iteration
    ref: EvidenceRef | None = None
    # not read at all: not a regular file, a link out of its directory, or over the size cap
    refused: bool = False
    # read, and holds text that is neither an iteration (a non-negative integer) nor "release"
    junk: bool = False


def _refused(file: str, why: str) -> Tracker:
    return Tracker(
        file, exists=True, error=why, ref=EvidenceRef(file, None, f"({why})"), refused=True
    )


def read_tracker(path: Path, run_dir: Path) -> Tracker:
    """The tracker; only a small regular file in the checkpoint directory is read."""
    file = display_path(path, run_dir)
    if not path.exists() and not path.is_symlink():
        return Tracker(file, exists=False, ref=EvidenceRef(file, None, "(absent)"))
    why = file_refusal(path, path.parent)
    if why is not None:
        return _refused(file, why)
    try:
        raw = read_capped(path, _MAX_BYTES, path.parent, shown=file)
    except FileTooLarge as exc:
        return _refused(file, f"is {exc.size} bytes, over the {exc.limit}-byte cap of a tracker")
    except OSError as exc:
        return Tracker(file, exists=True, error=str(exc), ref=EvidenceRef(file, None, str(exc)))
    text = raw.decode("utf-8", "replace").strip()
    ref = EvidenceRef(file, 1, quote(text.splitlines()[0] if text else ""))
    if text == "release":
        return Tracker(file, exists=True, release=True, ref=ref)
    if text.isascii() and text.isdigit():  # not str.isdigit alone: it accepts '²', int() not
        return Tracker(file, exists=True, iteration=int(text), ref=ref)
    what = "empty" if not text else f"not an iteration: {excerpt(text)}"
    return Tracker(file, exists=True, error=what, ref=ref, junk=bool(text))
