"""The application log of one launcher cycle (``logs/train_cycle<N>.log``), streamed.

NVRx's per-cycle log aggregation prefixes each worker line with its rank (``"0: "``); lines can
also arrive unprefixed. The workload adapter sees the line without the prefix; the reference
keeps the raw line. Iteration lines are summarized (first, last, highest, count) rather than
kept, so memory stays bounded however long the run; every other event is kept, except errors,
of which the first :data:`MAX_ERRORS` are kept and the rest counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, tzinfo
from pathlib import Path

from pytest_nvrx.evidence.refs import (
    EvidenceRef,
    LineCursor,
    decode_line,
    iter_raw_lines,
    quote,
    split_rank_prefix,
)
from pytest_nvrx.evidence.workload import (
    IterationCommitted,
    WorkloadError,
    WorkloadEvent,
    WorkloadLogAdapter,
)

MAX_ERRORS = 50


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
    events: tuple[WorkloadEvent, ...] = ()
    errors_not_kept: int = 0
    read_error: str | None = None

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
    ranks: set[int] = set()
    unprefixed = 0
    events: list[WorkloadEvent] = []
    errors_kept = 0
    errors_dropped = 0
    first_line: EvidenceRef | None = None
    first_it: IterationCommitted | None = None
    last_it: IterationCommitted | None = None
    max_it: IterationCommitted | None = None
    n_iterations = 0
    lineno = 0
    text = ""
    try:
        with path.open("rb") as f:
            for raw in iter_raw_lines(f):
                lineno += 1
                text = decode_line(raw)
                rank, body = split_rank_prefix(text)
                if rank is None:
                    unprefixed += 1
                else:
                    ranks.add(rank)
                cursor.lineno = lineno
                cursor.raw = text
                if lineno == 1:
                    first_line = cursor.ref()
                event = parse(body, cursor)
                if event is None:
                    continue
                if isinstance(event, IterationCommitted):
                    n_iterations += 1
                    if first_it is None:
                        first_it = event
                    last_it = event
                    if max_it is None or event.iteration > max_it.iteration:
                        max_it = event
                    continue
                if isinstance(event, WorkloadError):
                    if errors_kept >= MAX_ERRORS:
                        errors_dropped += 1
                        continue
                    errors_kept += 1
                events.append(event)
    except OSError as exc:
        return CycleLog(cycle, name, exists=True, line_count=lineno, read_error=str(exc))
    return CycleLog(
        cycle=cycle,
        file=name,
        exists=True,
        line_count=lineno,
        first_line=first_line,
        last_line=EvidenceRef(name, lineno, quote(text)) if lineno else None,
        ranks=tuple(sorted(ranks)),
        unprefixed_lines=unprefixed,
        first_iteration=first_it,
        last_iteration=last_it,
        max_iteration=max_it,
        iteration_lines=n_iterations,
        events=tuple(events),
        errors_not_kept=errors_dropped,
    )
