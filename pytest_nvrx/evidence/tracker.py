"""``latest_checkpointed_iteration.txt``: the iteration of the newest *finalized* checkpoint.

Megatron rewrites it (plain open/write, so a reader can catch it empty) only when an async save
is finalized; after a finished run it holds the last completed checkpoint. ``release`` marks a
release checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_nvrx.evidence.refs import EvidenceRef, display_path, quote

_MAX_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Tracker:
    file: str
    exists: bool
    iteration: int | None = None
    release: bool = False
    error: str | None = None  # set when it exists but holds no iteration
    ref: EvidenceRef | None = None


def read_tracker(path: Path, run_dir: Path) -> Tracker:
    file = display_path(path, run_dir)
    if not path.is_file():
        return Tracker(file, exists=False, ref=EvidenceRef(file, None, "(absent)"))
    try:
        with path.open("rb") as f:
            raw = f.read(_MAX_BYTES)
    except OSError as exc:
        return Tracker(file, exists=True, error=str(exc), ref=EvidenceRef(file, None, str(exc)))
    text = raw.decode("utf-8", "replace").strip()
    ref = EvidenceRef(file, 1, quote(text.splitlines()[0] if text else ""))
    if text == "release":
        return Tracker(file, exists=True, release=True, ref=ref)
    if text.isascii() and text.isdigit():  # not str.isdigit alone: it accepts '²', int() not
        return Tracker(file, exists=True, iteration=int(text), ref=ref)
    what = "empty" if not text else f"not an iteration: {quote(text)!r}"
    return Tracker(file, exists=True, error=what, ref=ref)
