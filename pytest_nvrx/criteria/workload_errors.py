"""How criteria describe the errors a workload logged: what failed where, and the lines to quote.

Shared by optimizer_state_load (why the restore failed) and progress_past_restore (why nothing
trained after it).
"""

from __future__ import annotations

from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.refs import EvidenceRef
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.timeline import logs_from
from pytest_nvrx.evidence.tracebacks import HalfBuilt, half_built
from pytest_nvrx.evidence.workload import LoadStarted, WorkloadError

_MAX_EXCEPTION_CHARS = 160


def describe(error: WorkloadError, *, code: bool = True) -> str:
    """What failed where: ``AssertionError at megatron/core/optimizer/distrib_optimizer.py:839
    (assert len(steps) == 1)``; a plain error line is quoted as it is. A compiled module
    imported half built says so (:func:`half_built_text`)."""
    what = error.exception or error.ref.text.strip()
    if len(what) > _MAX_EXCEPTION_CHARS:
        what = what[: _MAX_EXCEPTION_CHARS - 1] + "…"
    frame = error.innermost
    if frame is not None:
        what = f"{what} at {frame.where}" + (f" ({frame.code})" if code and frame.code else "")
    half = half_built(error.exception)
    return what if half is None else f"{what}; {half_built_text(half)}"


def half_built_text(half: HalfBuilt) -> str:
    """Why a compiled module is found cut: it was being written when it was imported. Megatron
    builds its dataset helpers at first use, with make on rank 0 of every job on the checkout,
    and a job whose make finds the file of another job's build (newer than its source) calls it
    up to date and imports it."""
    return (
        f"{half.name} was half built ({half.why}): it was imported while another process was"
        " still building it (Megatron builds it at first use, on rank 0 of every job using the"
        " checkout)"
    )


def error_refs(error: WorkloadError) -> list[EvidenceRef | None]:
    """The lines that prove an error: the checkpoint-load frame, the innermost frame and its
    source line, the exception line (the traceback's head when it has no frames)."""
    frame = error.innermost
    if frame is None:
        return [error.traceback, error.ref]
    load = error.load_frame.ref if error.load_frame is not None else None
    return [load, frame.ref, frame.source, error.ref]


def errors_before_training(log: CycleLog) -> list[WorkloadError]:
    """Errors a cycle logged before its first committed iteration (all of them if none)."""
    first = log.first_iteration
    limit = (first.ref.line or 0) if first is not None else None
    return [e for e in log.of_type(WorkloadError) if limit is None or (e.ref.line or 0) < limit]


def load_death(
    errors: list[WorkloadError], starts: tuple[LoadStarted, ...]
) -> WorkloadError | None:
    """The error a cycle died of while loading its checkpoint: one raised through a checkpoint
    load (by its traceback), else the first after a load began (the load never completed)."""
    in_load = next((e for e in errors if e.in_checkpoint_load), None)
    if in_load is not None or not starts:
        return in_load
    began = starts[0].ref.line or 0
    return next((e for e in errors if (e.ref.line or 0) > began), None)


def same_error_in(run: RunEvidence, error: WorkloadError, after_cycle: int) -> list[int]:
    """Later cycles that died of the same exception at the same place (a deterministic fault)."""
    key = (error.exception, error.innermost.where if error.innermost else None)
    return [
        log.cycle
        for log in logs_from(run, after_cycle + 1)
        if any(
            (e.exception, e.innermost.where if e.innermost else None) == key
            for e in errors_before_training(log)
        )
    ]


def died_loading(
    run: RunEvidence,
    log: CycleLog,
    died: WorkloadError,
    expected_iteration: int | None,
    *,
    code: bool = True,
) -> str:
    """``cycle 1 died loading checkpoint iteration 5: AssertionError at ... (the same in
    cycles 2, 3)``: the iteration from the workload's own load line, else the one expected."""
    starts = log.of_type(LoadStarted)
    target = starts[0].iteration if starts else expected_iteration
    what = f"checkpoint iteration {target}" if target is not None else "its checkpoint"
    again = same_error_in(run, died, log.cycle)
    repeated = (
        f" (the same in cycle{'s' if len(again) > 1 else ''} {', '.join(map(str, again))})"
        if again
        else ""
    )
    return f"cycle {log.cycle} died loading {what}: {describe(died, code=code)}{repeated}"
