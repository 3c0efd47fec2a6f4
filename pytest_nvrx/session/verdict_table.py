"""The table that ends a session's console: one row per scenario (no pytest here).

pytest-benchmark ends its sessions with one compact table; so do we: the scenario, its outcome,
the downtime and the main recovery phases (verify's timings), and why it did not qualify
(criteria/outcome.py's cause, whole, wrapped within its column to the terminal's width). A
fault schedule's row shows its total downtime and how many recoveries it had, and one row under
it per fault: that recovery's downtime and phases, and how it ended where it did not recover
(struck while restoring by the next fault, the job stopped). The full verdicts, each with the
line that proves it, are in the "nvrx verdicts" section above it, the JUnit XML and the HTML
report.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pytest_nvrx.evidence.segments import FaultRecovery

#: The columns of timings: (header, verify's timing key or a difference of two keys).
PHASE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("detect", "failure_to_detected_s"),
    ("restart", "detected_to_replacement_start_s"),
    ("gpu wait", "gpu_memory_reclaim_s"),
    ("load", "replacement_start_to_checkpoint_loaded_s"),
    ("1st step", "first_step_after_load_s"),
)
DOWNTIME_KEY = "failure_to_first_iteration_after_restore_s"


@dataclass(frozen=True)
class FaultRow:
    """One fault of a schedule's row: its recovery's downtime and timings, and how it ended
    where it did not recover (plain data)."""

    fault: str  # "fault 1 kill@step"
    timings: Mapping[str, float]
    downtime_s: float | None
    note: str | None = None  # "struck while restoring by fault 2", ...
    due: bool = True  # a recovery was due (the job was not stopped after this fault)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "timings": dict(self.timings)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FaultRow:
        downtime = data.get("downtime_s")
        return cls(
            fault=str(data["fault"]),
            timings=_float_map(data.get("timings")),
            downtime_s=float(downtime) if downtime is not None else None,
            note=data.get("note"),
            due=bool(data.get("due", True)),
        )


def fault_rows(recoveries: Sequence[FaultRecovery]) -> tuple[FaultRow, ...]:
    """A schedule's recoveries as the rows under its own (none for a run of one fault)."""
    return tuple(
        FaultRow(f"fault {r.position} {r.fault}", r.timings(), r.downtime_s, r.note(), due=r.due)
        for r in recoveries
    )


def _float_map(data: Any) -> dict[str, float]:
    return {str(k): float(v) for k, v in dict(data or {}).items()}


@dataclass(frozen=True)
class Row:
    """One scenario's row, as plain data (it travels from xdist workers on a test report)."""

    scenario: str
    outcome: str  # QUALIFIED, NOT QUALIFIED, CANNOT JUDGE
    timings: Mapping[str, float]
    cause: str | None = None
    baseline: bool = False
    shared_gpu: bool = False
    #: a fault schedule's recoveries, one row each, and its total downtime; () and None for a
    #: run of one fault
    recoveries: tuple[FaultRow, ...] = ()
    total_downtime_s: float | None = None

    @property
    def recovery_count(self) -> int:
        return sum(r.due for r in self.recoveries)

    def as_dict(self) -> dict[str, Any]:
        data = {**asdict(self), "timings": dict(self.timings)}
        if self.recoveries:
            data["recoveries"] = [r.as_dict() for r in self.recoveries]
        else:  # a run of one fault's row, as it always was
            del data["recoveries"], data["total_downtime_s"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Row:
        total = data.get("total_downtime_s")
        return cls(
            scenario=str(data["scenario"]),
            outcome=str(data["outcome"]),
            timings=_float_map(data.get("timings")),
            cause=data.get("cause"),
            baseline=bool(data.get("baseline")),
            shared_gpu=bool(data.get("shared_gpu")),
            recoveries=tuple(FaultRow.from_dict(r) for r in data.get("recoveries") or ()),
            total_downtime_s=float(total) if total is not None else None,
        )


def _timing(timings: Mapping[str, float], key: str) -> float | None:
    if key == "first_step_after_load_s":
        first = timings.get("replacement_start_to_first_iteration_s")
        loaded = timings.get("replacement_start_to_checkpoint_loaded_s")
        if first is None:
            return None
        return first - loaded if loaded is not None else None
    return timings.get(key)


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}s"


#: the least room beside a row that its cause wraps in; less, and it wraps below the row
MIN_CAUSE_WIDTH = 30


def wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken between words only: a word
    longer than the width stands whole on its own line (a path, a quoted token)."""
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]


def fit(line: str, width: int) -> str:
    """``line`` in ``width`` characters: the middle of a verdict's reason is cut, its closing
    ``[file:line]`` kept (the full text is in the JUnit XML and the report)."""
    if len(line) <= width:
        return line
    tail = ""
    if line.endswith("]") and " [" in line:
        tail = line[line.rindex(" [") :]
        if len(tail) > width // 2:
            tail = ""
    return line[: max(width - len(tail) - 1, 0)] + "…" + tail


def verdict_table(rows: Sequence[Row], width: int = 120) -> list[str]:
    """The table's lines: the cause wraps within its column to ``width``, never cut and never
    broken inside a word, or below its row where the row leaves it too little room; the rule
    under the header is as wide as the table. A terminal narrower than the columns themselves
    wraps them."""
    if not rows:
        return []
    every = [t for r in rows for t in (r.timings, *(f.timings for f in r.recoveries))]
    shown_phases = [
        (head, key) for head, key in PHASE_COLUMNS if any(_timing(t, key) for t in every)
    ]
    header = ["scenario", "outcome", "downtime", *(head for head, _ in shown_phases)]
    # each line: its cells and what goes in the cause column (a row's cause, a fault's note)
    body: list[tuple[list[str], str | None]] = []
    for row in rows:
        name = row.scenario
        if row.recoveries:
            n = row.recovery_count
            name += f" ({n} recover{'y' if n == 1 else 'ies'})"
        name += " *" if row.shared_gpu else ""
        if row.baseline:
            cells = ["—"] * (1 + len(shown_phases))
        elif row.recoveries:
            # a schedule: its total, its phases in the rows of its faults below
            cells = [_seconds(row.total_downtime_s)] + [""] * len(shown_phases)
        else:
            cells = [_seconds(row.timings.get(DOWNTIME_KEY))]
            cells += [_seconds(_timing(row.timings, key)) for _, key in shown_phases]
        body.append(([name, row.outcome, *cells], row.cause))
        for fault in row.recoveries:
            cells = [_seconds(fault.downtime_s) if fault.due else "—"]
            cells += [_seconds(_timing(fault.timings, key)) for _, key in shown_phases]
            body.append(([f"  {fault.fault}", "", *cells], fault.note))
    widths = [
        max(len(line[i]) for line in [header, *(b for b, _ in body)]) for i in range(len(header))
    ]

    def line(cells: Sequence[str]) -> str:
        first, second, *rest = cells
        text = f"{first:<{widths[0]}}  {second:<{widths[1]}}"
        for cell, w in zip(rest, widths[2:], strict=True):
            text += f"  {cell:>{w}}"
        return text

    head = line(header)
    # the cause column starts where the header says "cause"; a cause wraps within it, word by
    # word, unless the columns leave it too little room: then it wraps below its row
    room = width - len(head) - 2
    table = [head + "  cause"]
    for cells, cause in body:
        text = line(cells)
        if not cause:
            table.append(text.rstrip())
        elif room >= MIN_CAUSE_WIDTH:
            first, *more = wrap(cause, room)
            table.append(f"{text}  {first}")
            table += [" " * (len(text) + 2) + part for part in more]
        else:
            # (a schedule's row leaves its phase cells blank)
            table.append(text.rstrip())
            table += ["    " + part for part in wrap(cause, max(width - 4, MIN_CAUSE_WIDTH))]
    out = [table[0], "-" * max(len(t) for t in table), *table[1:]]
    if any(r.recoveries for r in rows):
        out += wrap(
            "schedule downtime: its recoveries' total (a struck one ends at the next fault)", width
        )
    if any(r.shared_gpu for r in rows):
        out += wrap(
            "* shared its GPU with other scenarios (--nvrx-gpu-share): its timings include theirs",
            width,
        )
    return out
