"""The table that ends a session's console: one row per scenario (no pytest here).

pytest-benchmark ends its sessions with one compact table; so do we: the scenario, its outcome,
the downtime and the main recovery phases (verify's timings), and why it did not qualify, cut
to the terminal's width. The full verdicts, each with the line that proves it, are in the
"nvrx verdicts" section above it, the JUnit XML and the HTML report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

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
class Row:
    """One scenario's row, as plain data (it travels from xdist workers on a test report)."""

    scenario: str
    outcome: str  # QUALIFIED, NOT QUALIFIED, CANNOT JUDGE
    timings: Mapping[str, float]
    cause: str | None = None
    baseline: bool = False
    shared_gpu: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "timings": dict(self.timings)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Row:
        return cls(
            scenario=str(data["scenario"]),
            outcome=str(data["outcome"]),
            timings={str(k): float(v) for k, v in dict(data.get("timings") or {}).items()},
            cause=data.get("cause"),
            baseline=bool(data.get("baseline")),
            shared_gpu=bool(data.get("shared_gpu")),
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


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


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
    """The table's lines: the cause is cut to ``width``, or goes on a line of its own below
    its row where the row leaves it too little room; a terminal narrower than the columns
    themselves wraps them."""
    if not rows:
        return []
    shown_phases = [
        (head, key) for head, key in PHASE_COLUMNS if any(_timing(r.timings, key) for r in rows)
    ]
    header = ["scenario", "outcome", "downtime", *(head for head, _ in shown_phases)]
    body: list[list[str]] = []
    for row in rows:
        name = row.scenario + (" *" if row.shared_gpu else "")
        if row.baseline:
            cells = ["—"] * (1 + len(shown_phases))
        else:
            cells = [_seconds(row.timings.get(DOWNTIME_KEY))]
            cells += [_seconds(_timing(row.timings, key)) for _, key in shown_phases]
        body.append([name, row.outcome, *cells])
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first, second, *rest = cells
        text = f"{first:<{widths[0]}}  {second:<{widths[1]}}"
        for cell, w in zip(rest, widths[2:], strict=True):
            text += f"  {cell:>{w}}"
        return text

    out = [line(header) + "  cause", "-" * min(width, len(line(header)) + 7)]
    for row, cells in zip(rows, body, strict=True):
        text = line(cells)
        room = width - len(text) - 2
        if row.cause and room >= 30:
            out.append(text + "  " + _cut(row.cause, room))
        elif row.cause:
            out += [text, "    " + _cut(row.cause, max(width - 4, 30))]
        else:
            out.append(text)
    if any(r.shared_gpu for r in rows):
        out.append(
            _cut(
                "* shared its GPU with other scenarios (--nvrx-gpu-share): its timings include"
                " theirs",
                width,
            )
        )
    return out
