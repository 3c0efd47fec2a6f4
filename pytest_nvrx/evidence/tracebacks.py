"""Python tracebacks in an application log, assembled line by line into one error event each.

A worker that dies of an exception prints, through NVRx's per-cycle log, something like::

    0: [rank0]: Traceback (most recent call last):
    0: [rank0]:   File "/ckpt/megatron/training/checkpointing.py", line 2311, in load_checkpoint
    0: [rank0]:     load_kwargs['sharded_state_dict'] = generate_state_dict(
    0: [rank0]:                                         ^^^^^^^^^^^^^^^^^^^^
    0: [rank0]:   File "/ckpt/megatron/core/optimizer/distrib_optimizer.py", line 839, in state_dict
    0: [rank0]:     assert len(steps) == 1
    0: [rank0]: AssertionError

Each traceback becomes one :class:`~pytest_nvrx.evidence.workload.WorkloadError` that quotes the
exception line, the innermost frame and its source line, and the outermost frame in checkpoint
loading, so a verdict can say *what* failed *where* instead of "a traceback". This is Python's
format, not a workload's: it serves every adapter.

Lines are keyed by stream (NVRx's rank prefix plus torch's ``[rankN]:`` tag): tracebacks of
several ranks, and other output (warnings of a checkpoint worker), may interleave. Memory is
bounded: per open traceback only its head, frame count, newest frame and first checkpoint-load
frame are kept, at most :data:`MAX_OPEN` tracebacks are open at once, and one that goes
:data:`MAX_IDLE` lines of its stream without a traceback line is closed as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_nvrx.evidence.refs import EvidenceRef, LineCursor, read_int
from pytest_nvrx.evidence.workload import TracebackFrame, WorkloadError

HEAD = "Traceback (most recent call last)"
# Open tracebacks at once (one per stream: ranks x tags); the oldest is closed beyond that.
MAX_OPEN = 64
# Lines of its stream a traceback may go without a frame, source or exception line.
MAX_IDLE = 50

_TAG = re.compile(r"\[rank\d+\]: ?")
_FRAME = re.compile(r'\s+File "(?P<path>[^"]*)", line (?P<line>\d+), in (?P<func>.+?)\s*$')
# The final line: a (dotted) exception class, optionally ": message" (AssertionError,
# KeyError: 'x', torch.distributed.DistBackendError: NCCL error, SystemExit: 1).
_EXCEPTION = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?::(?:\s.*)?)?\s*$")
_MARKS = frozenset("^~ \t")
_SITE_DIRS = ("/site-packages/", "/dist-packages/")


#: What the dynamic loader says of a compiled module it could not load whole: one cut short,
#: as a file still being written (or left cut) is when it is imported.
_HALF_BUILT = re.compile(
    r"ImportError: (?P<path>.+?\.(?:so|pyd)): (?P<why>file too short|invalid ELF header"
    r"|ELF load command past end of file|cannot read file data.*?)\s*$"
)


@dataclass(frozen=True, slots=True)
class HalfBuilt:
    """An ImportError of a compiled module the loader found incomplete."""

    path: str
    #: the loader's words: ``file too short``, ``invalid ELF header``, ...
    why: str

    @property
    def name(self) -> str:
        return self.path.replace("\\", "/").rsplit("/", 1)[-1]


def half_built(exception: str | None) -> HalfBuilt | None:
    """The module an exception line says was imported half built, else None:
    ``ImportError: /m/megatron/core/datasets/helpers_cpp.cpython-312-x86_64-linux-gnu.so: file
    too short``."""
    if exception is None:
        return None
    match = _HALF_BUILT.match(exception)
    return HalfBuilt(match["path"], match["why"]) if match is not None else None


def short_path(path: str, roots: tuple[str, ...] = ()) -> str:
    """A frame's path as a verdict shows it; absolute paths point to another machine.

    After the last ``site-packages/``; else from the last directory named in ``roots`` (the
    adapter's package, e.g. ``megatron``); else as printed.
    """
    posix = path.replace("\\", "/")
    for site in _SITE_DIRS:
        at = posix.rfind(site)
        if at >= 0:
            return posix[at + len(site) :]
    if roots:
        parts = posix.split("/")
        for i in range(len(parts) - 2, -1, -1):
            if parts[i] in roots:
                return "/".join(parts[i:])
    return path


def is_checkpoint_load(path: str, function: str) -> bool:
    """Whether a frame is loading a checkpoint: a ``load`` function (``load_checkpoint``,
    ``_load_base_checkpoint``, dist_checkpointing's ``load``, torch DCP's ``load_state_dict``)
    of a checkpoint module, or named for checkpoints itself."""
    words = function.lower().strip("_").split("_")
    if "load" not in words:
        return False
    return "checkpoint" in function.lower() or "checkpoint" in path.lower()


def split_tag(body: str) -> tuple[str, str]:
    """torch's per-rank stderr tag (``[rank0]: ``) and the line Python printed."""
    if body.startswith("[rank"):
        m = _TAG.match(body)
        if m is not None:
            return body[: m.end()].rstrip(), body[m.end() :]
    return "", body


@dataclass(slots=True)
class _Frame:
    path: str
    line: int
    function: str
    ref: EvidenceRef
    load: bool
    source: EvidenceRef | None = None
    code: str | None = None


@dataclass(slots=True)
class _Open:
    head: EvidenceRef
    frames: int = 0
    last: _Frame | None = None
    load: _Frame | None = None
    idle: int = 0


class TracebackAssembler:
    """Feeds on a log's lines (after the rank prefix is split off); returns finished tracebacks.

    ``feed`` needs calling only while :attr:`active` or for a line containing :data:`HEAD`: the
    hot loop of a multi-gigabyte log pays one substring test per line.
    """

    __slots__ = ("_open", "roots")

    def __init__(self, roots: tuple[str, ...] = ()) -> None:
        self.roots = roots
        self._open: dict[str, _Open] = {}

    @property
    def active(self) -> bool:
        return bool(self._open)

    def feed(self, rank: str, body: str, at: LineCursor) -> tuple[bool, list[WorkloadError]]:
        """Offer one line; ``(consumed, finished)``.

        A consumed line belongs to a traceback (head, frame, source, caret marks, exception) and
        is not for the workload adapter; ``finished`` holds the tracebacks this line closed.
        """
        tag, text = split_tag(body)
        stream = f"{rank}|{tag}"
        done: list[WorkloadError] = []
        if text.startswith(HEAD):
            previous = self._open.pop(stream, None)
            if previous is not None:
                done.append(self._close(previous, None, None))
            if len(self._open) >= MAX_OPEN:
                oldest = next(iter(self._open))
                done.append(self._close(self._open.pop(oldest), None, None))
            self._open[stream] = _Open(at.ref())
            return True, done
        tb = self._open.get(stream)
        if tb is None:
            return False, done
        if text.lstrip().startswith('File "'):
            m = _FRAME.match(text)
            if m is not None:
                path, func = m["path"], m["func"]
                frame = _Frame(
                    path, read_int(m["line"]), func, at.ref(), is_checkpoint_load(path, func)
                )
                if tb.load is None and frame.load:
                    tb.load = frame
                tb.last = frame
                tb.frames += 1
                tb.idle = 0
                return True, done
        stripped = text.strip()
        if not stripped or (tb.frames and set(stripped) <= _MARKS):
            return True, done  # blank lines and the ^^^^ / ~~~~ marks under a source line
        if text.startswith("    ") and tb.last is not None:
            # the frame's source; Python >= 3.13 may print more lines of a long statement
            if tb.last.source is None:
                tb.last.source, tb.last.code = at.ref(), stripped
            tb.idle = 0
            return True, done
        if _EXCEPTION.match(text) is not None:
            del self._open[stream]
            done.append(self._close(tb, at.ref(), stripped))
            return True, done
        tb.idle += 1
        if tb.idle > MAX_IDLE:
            del self._open[stream]
            done.append(self._close(tb, None, None))
        return False, done

    def finish(self) -> list[WorkloadError]:
        """Close what is still open at the end of the log (a writer killed mid-traceback)."""
        done = [self._close(tb, None, None) for tb in self._open.values()]
        self._open.clear()
        return done

    def _frame(self, frame: _Frame | None) -> TracebackFrame | None:
        if frame is None:
            return None
        return TracebackFrame(
            path=frame.path,
            short_path=short_path(frame.path, self.roots),
            line=frame.line,
            function=frame.function,
            ref=frame.ref,
            source=frame.source,
            code=frame.code,
        )

    def _close(self, tb: _Open, ref: EvidenceRef | None, exception: str | None) -> WorkloadError:
        return WorkloadError(
            ref=ref if ref is not None else tb.head,
            exception=exception,
            traceback=tb.head,
            innermost=self._frame(tb.last),
            load_frame=self._frame(tb.load),
            frames=tb.frames,
        )
