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
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import UTC, tzinfo
from pathlib import Path

from pytest_nvrx.evidence.injector_log import (
    MAX_INJECTOR_LINES,
    InjectorLine,
    parse_injector_line,
)
from pytest_nvrx.evidence.injector_log import TAG as INJECTOR_TAG
from pytest_nvrx.evidence.refs import (
    EvidenceRef,
    LineCursor,
    iter_raw_line_batches,
    open_regular,
    quote,
)
from pytest_nvrx.evidence.tracebacks import HEAD, TracebackAssembler
from pytest_nvrx.evidence.workload import (
    IterationCommitted,
    SaveCompleted,
    SaveScheduled,
    WorkloadError,
    WorkloadEvent,
    WorkloadLogAdapter,
    source_roots,
)

MAX_ERRORS = 50
SAVES_KEPT = 64
ITERATIONS_KEPT = 10_000


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
    errors_not_kept: int = 0
    saves_not_kept: int = 0
    read_error: str | None = None
    # the fault injector's own lines (start, fire, skip), at most MAX_INJECTOR_LINES
    injector: tuple[InjectorLine, ...] = ()

    def of_type[E](self, kind: type[E]) -> tuple[E, ...]:
        return tuple(e for e in self.events if isinstance(e, kind))


def parse_cycle_log(
    path: Path,
    cycle: int,
    adapter: WorkloadLogAdapter,
    *,
    file: str | None = None,
    tz: tzinfo = UTC,
) -> CycleLog:
    """Parse one cycle log; a missing or unreadable file is reported, never raised.

    ``file`` is the name references use (relative to the run dir); ``tz`` the zone of the
    workload's naive timestamps.
    """
    name = file if file is not None else path.name
    if not path.is_file():
        return CycleLog(cycle, name, exists=False)
    cursor = LineCursor(name, tz)
    parse = adapter.parse_line
    iteration_of = adapter.iteration_of
    tracebacks = TracebackAssembler(source_roots(adapter))
    rank_texts: set[str] = set()
    unprefixed = 0
    events: list[WorkloadEvent] = []
    errors_kept = 0
    errors_dropped = 0

    def keep_error(event: WorkloadError) -> None:
        nonlocal errors_kept, errors_dropped
        if errors_kept >= MAX_ERRORS:
            errors_dropped += 1
        else:
            errors_kept += 1
            events.append(event)

    saves_head = {SaveScheduled: 0, SaveCompleted: 0}
    saves_tail: dict[type, deque[WorkloadEvent]] = {
        SaveScheduled: deque(maxlen=SAVES_KEPT),
        SaveCompleted: deque(maxlen=SAVES_KEPT),
    }
    saves_seen = 0
    injector: list[InjectorLine] = []
    first_line: EvidenceRef | None = None
    # Iteration lines are the bulk of a log: only their number is read in the loop; the three
    # kept (first, last, highest) become events at the end, from (line number, raw, body).
    first_it: tuple[int, str, str] | None = None
    last_it: tuple[int, str, str] | None = None
    max_it: tuple[int, str, str] | None = None
    max_no = -1
    n_iterations = 0
    its_head: list[tuple[int, str, str]] = []
    its_tail: deque[tuple[int, str, str]] = deque(maxlen=ITERATIONS_KEPT)
    lineno = 0
    text = ""
    # The last rank prefix seen, ": " included ("\n": none yet, no line holds one). A line that
    # starts with it has that rank: the prefix holds no ": " before its own, so split_rank_prefix
    # would find the same one. Most lines of a log share one prefix.
    prefix = "\n"
    prefix_rank = ""
    skip = 0
    try:
        with open_regular(path) as f:  # O_NONBLOCK + fstat: a FIFO swapped in never blocks
            for batch in iter_raw_line_batches(f):
                for raw in batch:
                    lineno += 1
                    text = raw.decode("utf-8", "replace")
                    if text[-1:] == "\r":
                        text = text[:-1]
                    if text.startswith(prefix):
                        head = prefix_rank
                        body = text[skip:]
                    else:
                        # NVRx's rank prefix ("0: ", "12: "); inlined split_rank_prefix (hot loop)
                        colon = text.find(": ", 0, 8)
                        head = text[:colon].strip() if colon > 0 else ""
                        if head.isdigit():
                            rank_texts.add(head)
                            skip = colon + 2
                            prefix, prefix_rank = text[:skip], head
                            body = text[skip:]
                        else:
                            unprefixed += 1
                            body = text
                    number = iteration_of(body)
                    if number is not None:
                        n_iterations += 1
                        kept = (lineno, text, body)
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
                        first_line = cursor.ref()
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
                            saves_tail[kind].append(event)
                        continue
                    if isinstance(event, WorkloadError):
                        keep_error(event)
                        continue
                    events.append(event)
    except OSError as exc:
        return CycleLog(cycle, name, exists=True, line_count=lineno, read_error=str(exc))
    for error in tracebacks.finish():
        keep_error(error)
    if lineno >= 1 and first_line is None and first_it is not None and first_it[0] == 1:
        first_line = EvidenceRef(name, 1, quote(first_it[1]))

    def iteration_event(kept: tuple[int, str, str] | None) -> IterationCommitted | None:
        if kept is None:
            return None
        cursor.lineno, cursor.raw = kept[0], kept[1]
        event = parse(kept[2], cursor)
        return event if isinstance(event, IterationCommitted) else None

    iterations = tuple(
        e for e in (iteration_event(k) for k in (*its_head, *its_tail)) if e is not None
    )
    tails = [*saves_tail[SaveScheduled], *saves_tail[SaveCompleted]]
    # in line order: kept tails, and tracebacks closed after their head (cut short, or at EOF)
    events = sorted([*events, *tails], key=lambda e: e.ref.line or 0)
    return CycleLog(
        cycle=cycle,
        file=name,
        exists=True,
        line_count=lineno,
        first_line=first_line,
        last_line=EvidenceRef(name, lineno, quote(text)) if lineno else None,
        ranks=tuple(sorted(int(r) for r in rank_texts)),
        unprefixed_lines=unprefixed,
        first_iteration=iteration_event(first_it),
        last_iteration=iteration_event(last_it),
        max_iteration=iteration_event(max_it),
        iteration_lines=n_iterations,
        iterations=iterations,
        iterations_not_kept=n_iterations - len(its_head) - len(its_tail),
        events=tuple(events),
        errors_not_kept=errors_dropped,
        saves_not_kept=saves_seen - sum(saves_head.values()) - len(tails),
        injector=tuple(injector),
    )
