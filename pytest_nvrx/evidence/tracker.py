"""``latest_checkpointed_iteration.txt``: the iteration of the newest *finalized* checkpoint.

Megatron rewrites it (plain open/write, so a reader can catch it empty) only when an async save
is finalized; after a finished run it holds the last completed checkpoint. ``release`` marks a
release checkpoint. An empty tracker can be a write cut short; any other text (``twenty``,
``-20``) is none that Megatron or the reference workload writes (:attr:`Tracker.junk`: the run
cannot be judged, criteria/consistency.py).

:func:`read_tracker` is the one reader of the core: the evidence of a run, the baseline of a
user's checkpoint directory (run_dir.py) and the reference workload's restore all go through it
and word its :class:`Tracker` for their readers. The stdlib-only injector keeps its own copy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pytest_nvrx.evidence.refs import (
    EvidenceRef,
    FileTooLarge,
    NumberTooLong,
    clip_line,
    display_path,
    file_refusal,
    read_capped,
    read_int,
)
from pytest_nvrx.settings.values import quote

_MAX_BYTES = 4096
#: What str.strip() removes among ASCII: only these surround an iteration. Unicode space (a
#: no-break space before the digits) is text that is no iteration, as the injector reads it
#: (injector.read_tracker; tests/worker/test_tracker_readers_agree.py holds the two equal).
_ASCII_SPACE = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"


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
    # what it holds, stripped (None when it was not read or is not UTF-8 text)
    text: str | None = None


def _refused(file: str, why: str) -> Tracker:
    return Tracker(
        file, exists=True, error=why, ref=EvidenceRef(file, None, f"({why})"), refused=True
    )


def read_tracker(path: Path, run_dir: Path, *, confined: bool = True) -> Tracker:
    """The tracker; only a small regular file is read, and, ``confined`` (a run's evidence),
    only one in the checkpoint directory: a symlink leaving it is refused. A user's own
    checkpoint directory (its baseline) may link its tracker anywhere."""
    file = display_path(path, run_dir)
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return Tracker(file, exists=False, ref=EvidenceRef(file, None, "(absent)"))
    except OSError as exc:  # its directory cannot be searched: absence is not known
        return _refused(file, f"cannot be examined ({exc.strerror or exc})")
    root = path.parent if confined else None
    why = file_refusal(path, root)
    if why is not None:
        return _refused(file, why)
    try:
        raw = read_capped(path, _MAX_BYTES, root, shown=file)
    except FileTooLarge as exc:
        return _refused(file, f"is {exc.size} bytes, over the {exc.limit}-byte cap of a tracker")
    except OSError as exc:  # (its permissions, EIO): what it holds is unknown, not absent
        return _refused(file, f"cannot be read ({exc.strerror or exc})")
    try:
        text = raw.decode("utf-8").strip(_ASCII_SPACE)
    except UnicodeDecodeError as exc:
        shown = raw.decode("utf-8", "replace").strip()
        what = f"not UTF-8 text ({exc.reason} at byte {exc.start})"
        ref = EvidenceRef(file, 1, clip_line(shown.splitlines()[0] if shown else ""))
        return Tracker(file, exists=True, error=what, ref=ref, junk=True)
    ref = EvidenceRef(file, 1, clip_line(text.splitlines()[0] if text else ""))
    if text == "release":
        return Tracker(file, exists=True, release=True, ref=ref, text=text)
    if text.isascii() and text.isdigit():  # not str.isdigit alone: it accepts '²', int() not
        try:
            return Tracker(file, exists=True, iteration=read_int(text), ref=ref, text=text)
        except NumberTooLong as exc:
            return Tracker(
                file, exists=True, error=f"not an iteration: {exc}", ref=ref, junk=True, text=text
            )
    what = "empty" if not text else f"not an iteration: {quote(text)}"
    return Tracker(file, exists=True, error=what, ref=ref, junk=bool(text), text=text)
