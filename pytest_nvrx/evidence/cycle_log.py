"""The application log of one launcher cycle (``logs/train_cycle<N>.log``), streamed.

NVRx's per-cycle log aggregation prefixes each worker line with its rank (``"0: "``); lines can
also arrive unprefixed. The workload adapter sees the line without the prefix; the reference
keeps the raw line. Memory stays bounded however long the run: iteration lines are summarized
(first, last, highest, count); of the save events only the first and last :data:`SAVES_KEPT`
of each kind are kept (the criteria need the saves just before a failure and just after a
restore); of errors the first :data:`MAX_ERRORS`; of iteration lines the first and last
:data:`ITERATIONS_KEPT` (a replay comparison needs the iterations just before a failure and just
after a restore; a baseline comparison all it can get). What is dropped is counted. Python
tracebacks are assembled into one error event each (:mod:`pytest_nvrx.evidence.tracebacks`)
before the adapter sees a line; their lines are not offered to it. Nor are the fault injector's
own lines (:mod:`pytest_nvrx.evidence.injector_log`, kept in :attr:`CycleLog.injector`).

A log of :data:`PARALLEL_MIN_BYTES` or more is cut into byte ranges on line boundaries, parsed
by one worker process per CPU and merged in file order: the per-line work is Python's and one
core reads ~50-70 MiB/s, so a gigabyte log needs several (docs/performance.md). The merge gives
the same :class:`CycleLog` as one pass; where it could not (a traceback still open at the end of
a range, a worker that failed) the log is parsed again in one pass.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import UTC, tzinfo
from pathlib import Path
from typing import IO, BinaryIO, cast

from pytest_nvrx.evidence.injector_log import (
    MAX_INJECTOR_LINES,
    InjectorLine,
    parse_injector_line,
)
from pytest_nvrx.evidence.injector_log import TAG as INJECTOR_TAG
from pytest_nvrx.evidence.refs import (
    EvidenceRef,
    ForeignDigits,
    LineCursor,
    UnreadableNumber,
    clip_line,
    iter_raw_line_batches,
    open_regular,
)
from pytest_nvrx.evidence.tracebacks import HEAD, TracebackAssembler
from pytest_nvrx.evidence.workload import (
    IterationCommitted,
    SaveCompleted,
    SaveScheduled,
    SettingReported,
    WorkloadError,
    WorkloadEvent,
    WorkloadLogAdapter,
    get_adapter,
    source_roots,
)

MAX_ERRORS = 50
SAVES_KEPT = 64
ITERATIONS_KEPT = 10_000
# A log at least this large is parsed in byte ranges by worker processes (one per CPU) ...
PARALLEL_MIN_BYTES = 128 << 20
# ... each range at least this large: a worker's start (interpreter, imports) costs ~0.1 s.
MIN_RANGE_BYTES = 32 << 20


@dataclass(frozen=True, slots=True)
class CycleLog:
    """What one cycle's application log shows."""

    cycle: int
    file: str
    exists: bool
    line_count: int = 0
    first_line: EvidenceRef | None = None
    last_line: EvidenceRef | None = None
    ranks: tuple[int, ...] = ()
    unprefixed_lines: int = 0
    first_iteration: IterationCommitted | None = None
    last_iteration: IterationCommitted | None = None
    max_iteration: IterationCommitted | None = None
    iteration_lines: int = 0
    # every kept iteration line, in line order (the first and last ITERATIONS_KEPT)
    iterations: tuple[IterationCommitted, ...] = ()
    iterations_not_kept: int = 0
    events: tuple[WorkloadEvent, ...] = ()
    # the settings the workload printed at start (Megatron's argument dump: hundreds), kept apart
    # from ``events`` so that the criteria's passes over those stay short; ``of_type`` gives both
    settings: tuple[SettingReported, ...] = ()
    errors_not_kept: int = 0
    saves_not_kept: int = 0
    read_error: str | None = None
    # the fault injector's own lines (start, fire, skip), at most MAX_INJECTOR_LINES
    injector: tuple[InjectorLine, ...] = ()
    # the first line parsed whose stamp is no time (refs.LineCursor.bad_stamp)
    bad_stamp: EvidenceRef | None = None
    # the first line recognised but unread for a number past refs.MAX_DIGITS (its event dropped)
    bad_number: EvidenceRef | None = None

    def of_type[E](self, kind: type[E]) -> tuple[E, ...]:
        if kind is SettingReported:
            return cast(tuple[E, ...], self.settings)
        return tuple(e for e in self.events if isinstance(e, kind))


# An iteration line kept for later: (line number, line text, where the body starts in the text).
_Kept = tuple[int, str, int]
_SAVE_KINDS: tuple[type, ...] = (SaveScheduled, SaveCompleted)
# A save past the head: (line number, text, where the body starts, its event if made).
_PendingSave = tuple[int, str, int, WorkloadEvent | None]


@dataclass(slots=True)
class _Part:
    """What one byte range of a log shows; parts merge in file order (:class:`_Merge`).

    ``events`` are in the order the lines were processed, errors and saves already capped as a
    whole log would cap them were this range all of it; what a part drops a merge would drop too
    (an error past this range's MAX_ERRORS has MAX_ERRORS before it; a save past its head has
    SAVES_KEPT before it and, if not in its tail, SAVES_KEPT after it).
    """

    lines: int = 0
    first_line: EvidenceRef | None = None
    last_text: str = ""
    ranks: set[str] = field(default_factory=set)
    unprefixed: int = 0
    events: list[WorkloadEvent] = field(default_factory=list)
    errors_dropped: int = 0
    saves_tail: dict[type, deque[WorkloadEvent]] = field(
        default_factory=lambda: {kind: deque(maxlen=SAVES_KEPT) for kind in _SAVE_KINDS}
    )
    saves_seen: int = 0
    injector: list[InjectorLine] = field(default_factory=list)
    iterations: int = 0
    first_it: _Kept | None = None
    last_it: _Kept | None = None
    max_it: _Kept | None = None
    max_no: int = -1
    its_head: list[_Kept] = field(default_factory=list)
    its_tail: deque[_Kept] = field(default_factory=lambda: deque(maxlen=ITERATIONS_KEPT))
    # kept iteration lines already made events in a worker process, by line number, as
    # _flat_iteration tuples: pickle restores a slots dataclass ~10x slower than it builds one
    built: dict[int, tuple[object, ...] | None] = field(default_factory=dict)
    # a traceback still open at the range's end: the next range's lines may belong to it
    open_tracebacks: bool = False
    read_error: str | None = None
    bad_stamp: EvidenceRef | None = None
    bad_number: EvidenceRef | None = None


def _scan(
    f: BinaryIO, name: str, adapter: WorkloadLogAdapter, tz: tzinfo, first_lineno: int, last: bool
) -> _Part:
    """Parse the lines ``f`` yields, the first of them line ``first_lineno`` of the log; ``last``:
    they end the log (tracebacks still open are closed). An OSError is recorded, not raised."""
    part = _Part()
    cursor = LineCursor(name, tz)
    parse = adapter.parse_line
    iteration_of = adapter.iteration_of
    event_kind = _event_kind(adapter)
    tracebacks = TracebackAssembler(source_roots(adapter))
    rank_texts = part.ranks
    unprefixed = 0
    events = part.events
    errors_kept = 0

    def keep_error(event: WorkloadError) -> None:
        nonlocal errors_kept
        if errors_kept >= MAX_ERRORS:
            part.errors_dropped += 1
        else:
            errors_kept += 1
            events.append(event)

    saves_head = dict.fromkeys(_SAVE_KINDS, 0)
    # saves past the head: only the last SAVES_KEPT of each kind become events, at the end
    # (the event itself where it was made anyway: an adapter without event_kind)
    saves_tail: dict[type, deque[_PendingSave]] = {
        kind: deque(maxlen=SAVES_KEPT) for kind in _SAVE_KINDS
    }
    saves_seen = 0
    injector = part.injector
    # Iteration lines are the bulk of a log: only their number is read in the loop; the kept
    # ones become events at the end, from (line number, text, where the body starts).
    first_it: _Kept | None = None
    last_it: _Kept | None = None
    max_it: _Kept | None = None
    max_no = -1
    n_iterations = 0
    its_head = part.its_head
    its_tail = part.its_tail
    lineno = first_lineno - 1
    text = ""
    # The last rank prefix seen, ": " included ("\n": none yet, no line holds one). A line that
    # starts with it has that rank: the prefix holds no ": " before its own, so split_rank_prefix
    # would find the same one. Most lines of a log share one prefix.
    prefix = "\n"
    prefix_rank = ""
    skip = 0
    try:
        for batch in iter_raw_line_batches(f):
            for raw in batch:
                lineno += 1
                try:
                    text = raw.decode("utf-8", "replace")
                    if text[-1:] == "\r":
                        text = text[:-1]
                    if text.startswith(prefix):
                        head = prefix_rank
                        body = text[skip:]
                        at = skip
                    else:
                        # NVRx's rank prefix ("0: ", "12: "); inlined split_rank_prefix (hot loop)
                        colon = text.find(": ", 0, 8)
                        head = text[:colon].strip() if colon > 0 else ""
                        if head.isdigit():
                            if not head.isascii():  # no prefix NVRx writes
                                raise ForeignDigits(head)
                            rank_texts.add(head)
                            skip = colon + 2
                            prefix, prefix_rank = text[:skip], head
                            body = text[skip:]
                            at = skip
                        else:
                            unprefixed += 1
                            body = text
                            at = 0
                    number = iteration_of(body)
                    if number is not None:
                        n_iterations += 1
                        kept = (lineno, text, at)
                        if first_it is None:
                            first_it = kept
                        last_it = kept
                        if number > max_no:
                            max_no, max_it = number, kept
                        if len(its_head) < ITERATIONS_KEPT:
                            its_head.append(kept)
                        else:
                            its_tail.append(kept)
                        continue
                    cursor.lineno = lineno
                    cursor.raw = text
                    if lineno == 1:
                        part.first_line = cursor.ref()
                    if tracebacks.active or HEAD in body:
                        consumed, finished = tracebacks.feed(head, body, cursor)
                        for error in finished:
                            keep_error(error)
                        if consumed:
                            continue
                    if body[:1] == "[" and INJECTOR_TAG in body[:40]:
                        line = parse_injector_line(body, cursor)
                        if line is not None:
                            if len(injector) < MAX_INJECTOR_LINES:
                                injector.append(line)
                            continue
                    if event_kind is not None:
                        kind = event_kind(body)
                        if kind is None:
                            continue
                        if (kind is SaveCompleted or kind is SaveScheduled) and saves_head[
                            kind
                        ] >= SAVES_KEPT:
                            saves_seen += 1
                            saves_tail[kind].append((lineno, text, at, None))
                            continue
                    event = parse(body, cursor)
                    if event is None:
                        continue
                    kind = type(event)
                    if kind is SaveCompleted or kind is SaveScheduled:
                        saves_seen += 1
                        if saves_head[kind] < SAVES_KEPT:
                            saves_head[kind] += 1
                            events.append(event)
                        else:
                            saves_tail[kind].append((lineno, text, at, event))
                        continue
                    if isinstance(event, WorkloadError):
                        keep_error(event)
                        continue
                    events.append(event)
                except UnreadableNumber:
                    # a line of evidence that cannot be read: the run cannot be judged by it
                    cursor.lineno, cursor.raw = lineno, text
                    cursor.unreadable_number()
    except OSError as exc:
        part.read_error = str(exc)
    if last:
        for error in tracebacks.finish():
            keep_error(error)
    part.open_tracebacks = tracebacks.active
    for kind, tail in saves_tail.items():
        for lineno_, text_, at_, made in tail:
            if made is None:
                cursor.lineno, cursor.raw = lineno_, text_
                try:
                    made = parse(text_[at_:], cursor)
                except UnreadableNumber:
                    cursor.unreadable_number()
            if made is not None:
                part.saves_tail[kind].append(made)
    part.lines = lineno - first_lineno + 1
    part.last_text = text
    part.unprefixed = unprefixed
    part.saves_seen = saves_seen
    part.iterations = n_iterations
    part.first_it, part.last_it, part.max_it, part.max_no = first_it, last_it, max_it, max_no
    part.bad_stamp = cursor.bad_stamp
    part.bad_number = cursor.bad_number
    return part


def _first_ref(a: EvidenceRef | None, b: EvidenceRef | None) -> EvidenceRef | None:
    """The earlier of two references to lines of one file (None: neither)."""
    if a is None or b is None:
        return a or b
    return a if (a.line or 0) <= (b.line or 0) else b


class _Merge:
    """Parts of one log, added in file order, as the :class:`CycleLog` one pass would give."""

    def __init__(self, cycle: int, name: str, adapter: WorkloadLogAdapter, tz: tzinfo) -> None:
        self.cycle, self.name, self.adapter, self.tz = cycle, name, adapter, tz
        self.lines = 0
        self.first_line: EvidenceRef | None = None
        self.last_text = ""
        self.ranks: set[str] = set()
        self.unprefixed = 0
        self.events: list[WorkloadEvent] = []
        self.errors_kept = 0
        self.errors_dropped = 0
        self.saves_head = dict.fromkeys(_SAVE_KINDS, 0)
        self.saves_tail: dict[type, deque[WorkloadEvent]] = {
            kind: deque(maxlen=SAVES_KEPT) for kind in _SAVE_KINDS
        }
        self.saves_seen = 0
        self.injector: list[InjectorLine] = []
        self.iterations = 0
        self.first_it: _Kept | None = None
        self.last_it: _Kept | None = None
        self.max_it: _Kept | None = None
        self.max_no = -1
        self.its_head: list[_Kept] = []
        self.its_tail: deque[_Kept] = deque(maxlen=ITERATIONS_KEPT)
        self.built: dict[int, IterationCommitted | None] = {}
        self.bad_stamp: EvidenceRef | None = None
        self.bad_number: EvidenceRef | None = None

    def add(self, part: _Part) -> None:
        self.bad_stamp = _first_ref(self.bad_stamp, part.bad_stamp)
        self.bad_number = _first_ref(self.bad_number, part.bad_number)
        if self.lines == 0 and part.first_line is not None:
            self.first_line = part.first_line
        self.lines += part.lines
        if part.lines:
            self.last_text = part.last_text
        self.ranks |= part.ranks
        self.unprefixed += part.unprefixed
        for event in part.events:
            kind = type(event)
            if kind is SaveCompleted or kind is SaveScheduled:
                if self.saves_head[kind] < SAVES_KEPT:
                    self.saves_head[kind] += 1
                    self.events.append(event)
                else:
                    self.saves_tail[kind].append(event)
            elif isinstance(event, WorkloadError):
                if self.errors_kept >= MAX_ERRORS:
                    self.errors_dropped += 1
                else:
                    self.errors_kept += 1
                    self.events.append(event)
            else:
                self.events.append(event)
        for kind, tail in part.saves_tail.items():
            self.saves_tail[kind].extend(tail)
        self.saves_seen += part.saves_seen
        self.errors_dropped += part.errors_dropped
        room = MAX_INJECTOR_LINES - len(self.injector)
        self.injector.extend(part.injector[: max(room, 0)])
        if part.iterations:
            if self.first_it is None:
                self.first_it = part.first_it
            self.last_it = part.last_it
            if part.max_no > self.max_no:
                self.max_no, self.max_it = part.max_no, part.max_it
            room = ITERATIONS_KEPT - len(self.its_head)
            self.its_head.extend(part.its_head[:room])
            self.its_tail.extend(part.its_head[room:])
            self.its_tail.extend(part.its_tail)
            self.iterations += part.iterations
            for lineno, flat in part.built.items():
                self.built[lineno] = _unflat_iteration(flat)

    def result(self) -> CycleLog:
        name, lines = self.name, self.lines
        first_line = self.first_line
        first_it = self.first_it
        if lines >= 1 and first_line is None and first_it is not None and first_it[0] == 1:
            first_line = EvidenceRef(name, 1, clip_line(first_it[1]))
        cursor = LineCursor(name, self.tz)
        built = self.built

        def iteration_event(kept: _Kept | None) -> IterationCommitted | None:
            if kept is None:
                return None
            if kept[0] in built:
                return built[kept[0]]
            return _iteration_event(kept, self.adapter, cursor)

        iterations = tuple(
            e
            for e in (iteration_event(k) for k in (*self.its_head, *self.its_tail))
            if e is not None
        )
        tails = [*self.saves_tail[SaveScheduled], *self.saves_tail[SaveCompleted]]
        # in line order: kept tails, and tracebacks closed after their head (cut short, or at EOF)
        events = sorted([*self.events, *tails], key=lambda e: e.ref.line or 0)
        settings = tuple(e for e in events if isinstance(e, SettingReported))
        if settings:
            events = [e for e in events if not isinstance(e, SettingReported)]
        return CycleLog(
            cycle=self.cycle,
            file=name,
            exists=True,
            line_count=lines,
            first_line=first_line,
            last_line=EvidenceRef(name, lines, clip_line(self.last_text)) if lines else None,
            ranks=tuple(sorted(int(r) for r in self.ranks)),
            unprefixed_lines=self.unprefixed,
            first_iteration=iteration_event(self.first_it),
            last_iteration=iteration_event(self.last_it),
            max_iteration=iteration_event(self.max_it),
            iteration_lines=self.iterations,
            iterations=iterations,
            iterations_not_kept=self.iterations - len(self.its_head) - len(self.its_tail),
            events=tuple(events),
            settings=settings,
            errors_not_kept=self.errors_dropped,
            saves_not_kept=self.saves_seen - sum(self.saves_head.values()) - len(tails),
            injector=tuple(self.injector),
            bad_stamp=_first_ref(self.bad_stamp, cursor.bad_stamp),
            bad_number=_first_ref(self.bad_number, cursor.bad_number),
        )


def _event_kind(adapter: WorkloadLogAdapter) -> Callable[[str], type | None] | None:
    """The adapter's ``event_kind`` (optional): the type of event ``parse_line`` would make of a
    line, without making it."""
    kind = getattr(adapter, "event_kind", None)
    return kind if callable(kind) else None


def _iteration_event(
    kept: _Kept, adapter: WorkloadLogAdapter, cursor: LineCursor
) -> IterationCommitted | None:
    cursor.lineno, cursor.raw = kept[0], kept[1]
    try:
        event = adapter.parse_line(kept[1][kept[2] :], cursor)
    except UnreadableNumber:  # its total or consumed samples: iteration_of read only its number
        cursor.unreadable_number()
        return None
    return event if isinstance(event, IterationCommitted) else None


_ITERATION_FIELDS = tuple(f.name for f in fields(IterationCommitted))


def _flat_iteration(event: IterationCommitted | None) -> tuple[object, ...] | None:
    """An iteration event as plain values, its reference as (file, line, text)."""
    if event is None:
        return None
    ref = event.ref
    return tuple(
        (ref.file, ref.line, ref.text) if name == "ref" else getattr(event, name)
        for name in _ITERATION_FIELDS
    )


def _unflat_iteration(flat: tuple[object, ...] | None) -> IterationCommitted | None:
    if flat is None:
        return None
    values = dict(zip(_ITERATION_FIELDS, flat, strict=True))
    file, line, text = cast(tuple[str, int | None, str], values["ref"])
    values["ref"] = EvidenceRef(file, line, text)
    return IterationCommitted(**values)  # type: ignore[arg-type]


def parse_cycle_log(
    path: Path,
    cycle: int,
    adapter: WorkloadLogAdapter,
    *,
    file: str | None = None,
    tz: tzinfo = UTC,
    workers: int | None = None,
) -> CycleLog:
    """Parse one cycle log; a missing or unreadable file is reported, never raised.

    ``file`` is the name references use (relative to the run dir); ``tz`` the zone of the
    workload's naive timestamps; ``workers`` how many processes may share a log of
    :data:`PARALLEL_MIN_BYTES` or more (default: one per CPU this process may use; 1: this
    process alone).
    """
    name = file if file is not None else path.name
    if not path.is_file():
        return CycleLog(cycle, name, exists=False)
    try:
        with open_regular(path) as f:  # O_NONBLOCK + fstat: a FIFO swapped in never blocks
            size = os.fstat(f.fileno()).st_size
            ranges = _range_count(size, workers)
            if ranges > 1 and _registered(adapter):
                starts = _range_starts(f, size, ranges)
                if len(starts) > 1:
                    parsed = _parse_in_ranges(path, starts, cycle, adapter, name, tz)
                    if parsed is not None:
                        return parsed
                f.seek(0)
            part = _scan(f, name, adapter, tz, 1, last=True)
    except OSError as exc:
        return CycleLog(cycle, name, exists=True, read_error=str(exc))
    if part.read_error is not None:
        return CycleLog(cycle, name, exists=True, line_count=part.lines, read_error=part.read_error)
    merge = _Merge(cycle, name, adapter, tz)
    merge.add(part)
    return merge.result()


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _range_count(size: int, workers: int | None) -> int:
    """How many byte ranges (worker processes) a log of ``size`` bytes is parsed in."""
    if size < PARALLEL_MIN_BYTES:
        return 1
    wanted = _cpus() if workers is None else workers
    return max(1, min(wanted, size // MIN_RANGE_BYTES))


def _registered(adapter: WorkloadLogAdapter) -> bool:
    """Whether a worker process finds the same adapter by name (it gets only the name)."""
    try:
        return type(get_adapter(adapter.name)) is type(adapter)
    except KeyError:
        return False


def _range_starts(f: BinaryIO, size: int, ranges: int) -> list[int]:
    """Offsets that cut ``f`` into about ``ranges`` equal ranges, each the start of a line."""
    starts = [0]
    for k in range(1, ranges):
        at = max(size * k // ranges, starts[-1] + 1)
        f.seek(at - 1)  # the range starts after the first newline at or past at - 1
        while block := f.read(1 << 16):
            newline = block.find(b"\n")
            if newline >= 0:
                at = f.tell() - len(block) + newline + 1
                break
        else:
            break
        if at >= size:
            break
        starts.append(at)
    return starts


class _Window:
    """Bytes ``[start, end)`` of a file (``end`` None: to its end), read like the file itself."""

    __slots__ = ("_f", "_left")

    def __init__(self, f: BinaryIO, start: int, end: int | None) -> None:
        f.seek(start)
        self._f = f
        self._left = -1 if end is None else end - start

    def read(self, size: int = -1) -> bytes:
        if self._left < 0:
            return self._f.read(size)
        if size < 0 or size > self._left:
            size = self._left
        data = self._f.read(size)
        self._left -= len(data)
        return data


_WORKER = "from pytest_nvrx.evidence.cycle_log import _range_worker; _range_worker()"


def _parse_in_ranges(
    path: Path,
    starts: list[int],
    cycle: int,
    adapter: WorkloadLogAdapter,
    name: str,
    tz: tzinfo,
) -> CycleLog | None:
    """Parse the ranges that begin at ``starts`` in one worker process each, merged in order.

    A worker first counts its range's lines and is then told the number of its first line (the
    lines before it, counted by the others meanwhile). When all have parsed, each says how many
    iteration lines its range has and is told how many of its first and last ones the whole
    log keeps (:func:`_kept_iterations`): the parts carry those alone, however many workers.
    Parts are read one at a time, in order. None when a range ends inside a traceback or a
    worker fails: the caller parses in one pass.
    """
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    ends: list[int | None] = [*starts[1:], None]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for start, end in zip(starts, ends, strict=True):
            proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            procs.append(proc)
            job = (str(path), start, end, adapter.name, name, tz)
            pipe_in = cast(IO[bytes], proc.stdin)
            pipe_in.write(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
            pipe_in.flush()
        first = 1
        for proc in procs:
            pipe_in, pipe_out = cast(IO[bytes], proc.stdin), cast(IO[bytes], proc.stdout)
            pipe_in.write(b"%d\n" % first)
            pipe_in.flush()
            first += int(pipe_out.readline())
        counts = [int(cast(IO[bytes], proc.stdout).readline()) for proc in procs]
        for proc, (head, tail) in zip(procs, _kept_iterations(counts), strict=True):
            pipe_in = cast(IO[bytes], proc.stdin)
            pipe_in.write(b"%d %d\n" % (head, tail))
            pipe_in.close()
        merge = _Merge(cycle, name, adapter, tz)
        for i, proc in enumerate(procs):
            part = pickle.load(cast(IO[bytes], proc.stdout))
            if not isinstance(part, _Part) or part.read_error is not None:
                return None
            if part.open_tracebacks and i < len(procs) - 1:
                return None  # the next range's first lines may belong to that traceback
            merge.add(part)
            if proc.wait() != 0:
                return None
        return merge.result()
    except (OSError, EOFError, ValueError, pickle.UnpicklingError):
        return None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()


def _kept_iterations(counts: list[int]) -> list[tuple[int, int]]:
    """Given the iteration lines of each range, in order: how many of each range's first lines
    the log's first ITERATIONS_KEPT take, and how many of its last lines the log's last
    ITERATIONS_KEPT (of those not in the first) take."""
    heads = []
    room = ITERATIONS_KEPT
    for count in counts:
        heads.append(min(count, room))
        room -= heads[-1]
    tails = [0] * len(counts)
    need = ITERATIONS_KEPT
    for i in range(len(counts) - 1, -1, -1):
        tails[i] = min(counts[i] - heads[i], need)
        need -= tails[i]
    return list(zip(heads, tails, strict=True))


def _range_worker() -> None:
    """A worker process of :func:`_parse_in_ranges`: parse one range, pickle its part."""
    pipe_in, pipe_out = sys.stdin.buffer, sys.stdout.buffer
    path, start, end, adapter_name, name, tz = pickle.load(pipe_in)
    adapter = get_adapter(adapter_name)
    with open_regular(Path(path)) as f:
        lines = 0
        if end is not None:  # the last range's count is nobody's first line
            window = _Window(f, start, end)
            while chunk := window.read(1 << 20):
                lines += chunk.count(b"\n")
        pipe_out.write(b"%d\n" % lines)
        pipe_out.flush()
        first = int(pipe_in.readline())
        part = _scan(cast(BinaryIO, _Window(f, start, end)), name, adapter, tz, first, end is None)
    pipe_out.write(b"%d\n" % part.iterations)
    pipe_out.flush()
    head, tail = (int(n) for n in pipe_in.readline().split())
    kept = [*part.its_head, *part.its_tail]  # the first and the last ITERATIONS_KEPT
    heads, tails = part.its_head[:head], kept[len(kept) - tail :] if tail else []
    # the events of the lines kept are made here, in parallel, and sent without their text
    cursor = LineCursor(name, tz)
    for one in (*heads, *tails, part.first_it, part.last_it, part.max_it):
        if one is not None and one[0] not in part.built:
            part.built[one[0]] = _flat_iteration(_iteration_event(one, adapter, cursor))
    part.bad_stamp = _first_ref(part.bad_stamp, cursor.bad_stamp)
    part.bad_number = _first_ref(part.bad_number, cursor.bad_number)
    part.its_head = [(one[0], "", 0) for one in heads]
    part.its_tail = deque(((one[0], "", 0) for one in tails), maxlen=ITERATIONS_KEPT)
    pickle.dump(part, pipe_out, protocol=pickle.HIGHEST_PROTOCOL)
    pipe_out.flush()
