"""The five recovery criteria of the NVRx GPT walkthrough ("Verify recovery"), as pure functions.

Each criterion takes the parsed :class:`~pytest_nvrx.evidence.RunEvidence` (and what fault was
expected) and returns a :class:`Verdict` that quotes the lines proving it. They consume only
normalized evidence (launcher events, cycle records, workload events from an adapter, the
marker, the tracker, checkpoint metadata): never our own wrapper's log lines, never absolute
paths. The full semantics, including the baseline (fault=none) rules, are in docs/criteria.md.

Entry points: :func:`judge_run_dir` (path in, :class:`Judgement` out) and :func:`judge` (for
evidence already loaded); each criterion is also callable on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, get_args

from pytest_nvrx.evidence.checkpoint import OptimizerState
from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.launcher_log import LauncherEvent, LauncherEventKind
from pytest_nvrx.evidence.refs import EvidenceRef, Problem, absent
from pytest_nvrx.evidence.rundir import RunEvidence, load_run
from pytest_nvrx.evidence.timeline import (
    Timeline,
    build_timeline,
    logs_from,
    saves_before_failure,
    timings,
)
from pytest_nvrx.evidence.workload import (
    LOAD_FAILURES,
    IterationCommitted,
    LoadCompleted,
    LoadStarted,
    SaveCompleted,
    SaveScheduled,
    StartedFromScratch,
    WorkloadError,
)
from pytest_nvrx.layout import MANIFEST_NAME, MARKER_NAME

# The name a workload uses for optimizer state among the parts it reports restored.
OPTIMIZER_PART = "optimizer"

CriterionId = Literal[
    "prior_checkpoint",
    "replaced_cycle",
    "optimizer_state_load",
    "progress_past_restore",
    "no_repeat_injection",
]
CRITERIA_IDS: tuple[CriterionId, ...] = get_args(CriterionId)

FaultExpectation = Literal["kill", "hang", "none", "any"]
FAULT_CHOICES = ("kill", "hang", "none")
_SIGNAL_NUMBERS = {"SIGKILL": 9, "SIGTERM": 15, "SIGSTOP": 19, "SIGABRT": 6, "SIGSEGV": 11}


@dataclass(frozen=True, slots=True)
class Verdict:
    """One criterion's outcome: a one-line reason and the lines that prove it."""

    id: str
    passed: bool
    reason: str
    evidence: tuple[EvidenceRef, ...]
    # True only for a baseline (fault=none) criterion that needs a fault; passed is then True.
    not_applicable: bool = False

    def __post_init__(self) -> None:
        if not self.evidence:
            raise ValueError(f"verdict {self.id} has no evidence: a verdict must quote its proof")

    @property
    def status(self) -> str:
        if self.not_applicable:
            return "N/A"
        return "PASS" if self.passed else "FAIL"

    def headline(self) -> str:
        return f"{self.status} {self.id}: {self.reason} [{self.evidence[0].location}]"

    def render(self, width: int | None = 200) -> str:
        lines = [self.headline()]
        lines += [f"    {ref.render(width)}" for ref in self.evidence]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "passed": self.passed,
            "not_applicable": self.not_applicable,
            "reason": self.reason,
            "evidence": [ref.render() for ref in self.evidence],
        }


@dataclass(frozen=True, slots=True)
class ExpectedFault:
    """Which fault the run was supposed to see, and where that was learned."""

    kind: FaultExpectation
    source: str
    ref: EvidenceRef

    @property
    def baseline(self) -> bool:
        return self.kind == "none"


def expected_fault(
    run: RunEvidence, override: str | None = None, source: str = "caller"
) -> ExpectedFault:
    """An explicit ``override`` > run.json's ``config.fault`` > the marker's ``fault`` >
    "some fault" (verify exists to judge fault runs; a baseline must say so)."""
    if override is not None:
        if override not in FAULT_CHOICES:
            raise ValueError(
                f"expected fault {override!r}: choose one of {', '.join(FAULT_CHOICES)}"
            )
        kind: FaultExpectation = override  # type: ignore[assignment]
        return ExpectedFault(
            kind, source, EvidenceRef(f"({source})", None, f"expected fault: {kind}")
        )
    manifest = run.manifest
    if manifest is not None and manifest.fault is not None:
        value = manifest.fault.value
        if value in FAULT_CHOICES:
            return ExpectedFault(value, MANIFEST_NAME, manifest.fault.ref)
    marker = run.marker
    if marker is not None and marker.ok and marker.fault in ("kill", "hang"):
        return ExpectedFault(marker.fault, MARKER_NAME, marker.ref("fault"))  # type: ignore[arg-type]
    return ExpectedFault(
        "any",
        "default",
        EvidenceRef(MANIFEST_NAME, None, "(no run.json fault setting: a fault run is expected)"),
    )


# ----------------------------------------------------------------------------------------------
# helpers


@dataclass(frozen=True)
class _Ctx:
    run: RunEvidence
    expected: ExpectedFault
    tl: Timeline
    # the fault the marker says happened (kill|hang), else the expectation
    fault: str = field(default="any")


def _context(run: RunEvidence, expected: ExpectedFault | None) -> _Ctx:
    exp = expected if expected is not None else expected_fault(run)
    marker = run.marker
    fault = marker.fault if marker is not None and marker.ok and marker.fault else exp.kind
    return _Ctx(run, exp, build_timeline(run), fault)


def _t(value: datetime | None) -> str:
    return value.strftime("%H:%M:%S.%f")[:-3] if value is not None else "?"


def _refs(*items: EvidenceRef | Iterable[EvidenceRef | None] | None) -> tuple[EvidenceRef, ...]:
    out: list[EvidenceRef] = []
    for item in items:
        if item is None:
            continue
        if isinstance(item, EvidenceRef):
            candidates: Iterable[EvidenceRef | None] = (item,)
        else:
            candidates = item
        for ref in candidates:
            if ref is not None and ref not in out:
                out.append(ref)
    return tuple(out)


def _verdict(cid: str, passed: bool, reason: str, *evidence: Any) -> Verdict:
    return Verdict(cid, passed, reason, _refs(*evidence))


def _not_applicable(cid: str, reason: str, *evidence: Any) -> Verdict:
    return Verdict(cid, True, f"not applicable: {reason}", _refs(*evidence), not_applicable=True)


def _marker_ref(run: RunEvidence, key: str | None = None) -> EvidenceRef:
    if run.marker is None:
        return absent(MARKER_NAME, "absent: no fault was injected")
    return run.marker.ref(key)


def _launcher_outcome(run: RunEvidence) -> EvidenceRef | None:
    """The launcher's last word: its success/failure line, else its last timestamped line."""
    finals = run.launcher.of_kind(
        LauncherEventKind.RUN_OK,
        LauncherEventKind.GROUP_SUCCEEDED,
        LauncherEventKind.AGENT_EXIT,
        LauncherEventKind.RUN_FAILED,
        LauncherEventKind.NO_RESTART,
        LauncherEventKind.EARLY_TERMINATION,
    )
    if finals:
        return finals[-1].ref
    if run.launcher.last_ref is not None:
        return run.launcher.last_ref
    return absent(run.launcher.file)


def _expected_local_rank(run: RunEvidence) -> int | None:
    """The marker rank as the launcher logs it (torchelastic and rank monitors use local ranks)."""
    marker = run.marker
    if marker is None or marker.rank is None:
        return None
    if marker.local_rank is not None:
        return marker.local_rank
    nproc = run.launcher.nproc_per_node
    if run.manifest is not None and run.manifest.gpus_per_node is not None:
        value = run.manifest.gpus_per_node.value
        nproc = value if isinstance(value, int) and value > 0 else nproc
    return marker.rank % nproc if nproc else marker.rank


def _world_size(run: RunEvidence) -> tuple[int | None, list[EvidenceRef]]:
    """Ranks the launcher ran: nproc_per_node x max_nodes from its launch configs."""
    launcher = run.launcher
    nproc = launcher.nproc_per_node
    nodes = launcher.config.get("max_nodes", "")
    if nproc is None or not nodes.isdigit():
        return None, []
    refs = [
        launcher.config_refs[k]
        for k in ("nproc_per_node", "max_nodes")
        if k in launcher.config_refs
    ]
    return nproc * int(nodes), refs


def _workload_failures(run: RunEvidence, from_cycle: int | None) -> list[EvidenceRef]:
    """Errors and load failures the workload itself logged, in cycles from ``from_cycle`` on."""
    return [
        e.ref
        for log in logs_from(run, from_cycle)
        for e in log.events
        if isinstance(e, (WorkloadError, *LOAD_FAILURES))
    ]


_MAX_EXCEPTION_CHARS = 160


def _describe(error: WorkloadError, *, code: bool = True) -> str:
    """What failed where: ``AssertionError at megatron/core/optimizer/distrib_optimizer.py:839
    (assert len(steps) == 1)``; a plain error line is quoted as it is."""
    what = error.exception or error.ref.text.strip()
    if len(what) > _MAX_EXCEPTION_CHARS:
        what = what[: _MAX_EXCEPTION_CHARS - 1] + "…"
    frame = error.innermost
    if frame is None:
        return what
    return f"{what} at {frame.where}" + (f" ({frame.code})" if code and frame.code else "")


def _error_refs(error: WorkloadError) -> list[EvidenceRef | None]:
    """The lines that prove an error: the checkpoint-load frame, the innermost frame and its
    source line, the exception line (the traceback's head when it has no frames)."""
    frame = error.innermost
    if frame is None:
        return [error.traceback, error.ref]
    load = error.load_frame.ref if error.load_frame is not None else None
    return [load, frame.ref, frame.source, error.ref]


def _errors_before_training(log: CycleLog) -> list[WorkloadError]:
    """Errors a cycle logged before its first committed iteration (all of them if none)."""
    first = log.first_iteration
    limit = (first.ref.line or 0) if first is not None else None
    return [e for e in log.of_type(WorkloadError) if limit is None or (e.ref.line or 0) < limit]


def _restore_target(run: RunEvidence, tl: Timeline) -> tuple[int | None, SaveCompleted | None]:
    """The iteration a replacement must restore: the newest save completed before the failure
    (else the marker's tracker iteration), and that save."""
    newest = max(
        saves_before_failure(run, tl, SaveCompleted), key=lambda e: e.iteration, default=None
    )
    if newest is not None:
        return newest.iteration, newest
    if run.marker is not None and run.marker.ok:
        return run.marker.tracker_iteration, None
    return None, None


def _same_error_in(run: RunEvidence, error: WorkloadError, after_cycle: int) -> list[int]:
    """Later cycles that died of the same exception at the same place (a deterministic fault)."""
    key = (error.exception, error.innermost.where if error.innermost else None)
    return [
        log.cycle
        for log in logs_from(run, after_cycle + 1)
        if any(
            (e.exception, e.innermost.where if e.innermost else None) == key
            for e in _errors_before_training(log)
        )
    ]


# ----------------------------------------------------------------------------------------------
# 1. prior_checkpoint


def prior_checkpoint(run: RunEvidence, expected: ExpectedFault | None = None) -> Verdict:
    """A checkpoint was *completed* (finalized, tracker advanced) before the injected failure."""
    cid = "prior_checkpoint"
    ctx = _context(run, expected)
    exp = ctx.expected
    marker = run.marker
    if exp.baseline:
        return _not_applicable(
            cid, f"baseline run (fault=none, from {exp.source}) has no fault to precede", exp.ref
        )
    if marker is None:
        asked = (
            "a fault run was expected" if exp.kind == "any" else f"fault {exp.kind} was requested"
        )
        return _verdict(
            cid,
            False,
            f"no injection marker: {asked} ({exp.source}) but it never happened",
            _marker_ref(run),
            exp.ref,
            _launcher_outcome(run),
        )
    if not marker.ok:
        return _verdict(cid, False, f"injection marker unusable: {marker.error}", marker.ref())
    if exp.kind in ("kill", "hang") and marker.fault != exp.kind:
        return _verdict(
            cid,
            False,
            f"marker records fault {marker.fault!r} but {exp.kind!r} was expected ({exp.source})",
            marker.ref("fault"),
            exp.ref,
        )
    k = marker.tracker_iteration
    if k is None:
        return _verdict(cid, False, "marker records no tracker_iteration", marker.ref())
    base = marker.baseline_iteration or 0
    if k <= base:
        return _verdict(
            cid,
            False,
            f"marker records tracker iteration {k} (baseline {base}): the fault came before any"
            " checkpoint completed",
            marker.ref("tracker_iteration"),
            marker.ref("baseline_iteration"),
        )
    tl = ctx.tl
    completed = [e for e in saves_before_failure(run, tl, SaveCompleted) if e.iteration == k]
    if not completed:
        later = [
            e
            for log in run.cycle_logs
            for e in log.of_type(SaveCompleted)
            if e.iteration == k and e not in completed
        ]
        scheduled = [e for e in saves_before_failure(run, tl, SaveScheduled) if e.iteration == k]
        if later:
            reason = (
                f"checkpoint {k} was finalized only at {_t(later[0].time)}, after the failure"
                f" ({_t(tl.save_bound)})"
            )
            ev: list[EvidenceRef] = [later[0].ref]
        elif scheduled:
            reason = (
                f"the save of iteration {k} was only scheduled before the failure, never"
                " finalized ('successfully saved' missing)"
            )
            ev = [scheduled[0].ref]
        else:
            reason = f"no completed save of iteration {k} in the logs before the failure"
            ev = [e.ref for e in saves_before_failure(run, tl, SaveCompleted)[-1:]]
        return _verdict(cid, False, reason, marker.ref("tracker_iteration"), ev, marker.ref("time"))
    save = completed[0]
    signal = f" ({marker.signal})" if marker.signal else ""
    return _verdict(
        cid,
        True,
        f"checkpoint iteration {k} was finalized at {_t(save.time)}, before the {marker.fault}"
        f"{signal} of rank {marker.rank} at {_t(marker.time)}",
        marker.ref("tracker_iteration"),
        save.ref,
        marker.ref("time"),
    )


# ----------------------------------------------------------------------------------------------
# 2. replaced_cycle


def replaced_cycle(run: RunEvidence, expected: ExpectedFault | None = None) -> Verdict:
    """The launcher recorded the failed cycle (for the injected rank) and started a replacement."""
    cid = "replaced_cycle"
    ctx = _context(run, expected)
    tl = ctx.tl
    if ctx.expected.baseline:
        first = run.cycles[0].ref if run.cycles else None
        return _not_applicable(
            cid,
            "baseline run has no failed cycle to replace (no-failure is judged by"
            " no_repeat_injection)",
            ctx.expected.ref,
            first,
        )
    marker = run.marker
    if marker is None or not marker.ok:
        return _verdict(
            cid,
            False,
            "no usable injection marker: no injected failure to correlate with the launcher's"
            " records",
            _marker_ref(run),
            [e.ref for e in run.launcher.events if e.kind is LauncherEventKind.WORKER_FAILED][:3],
        )
    if not run.cycle_infos.exists:
        return _verdict(
            cid,
            False,
            f"{run.cycle_infos.dir}/ is missing: the launcher recorded no cycles",
            absent(run.cycle_infos.dir),
        )
    if not tl.failure_events:
        return _verdict(
            cid,
            False,
            f"the launcher recorded no worker failure at or after the fault ({_t(tl.fault_time)})",
            marker.ref("time"),
            _launcher_outcome(run),
        )
    world, world_refs = _world_size(run)
    if world is not None and marker.rank is not None and marker.rank >= world:
        return _verdict(
            cid,
            False,
            f"the marker claims rank {marker.rank}, but the launcher ran a world of {world}"
            " rank(s)",
            marker.ref("rank"),
            world_refs,
        )
    local = _expected_local_rank(run)
    rank_text = f"rank {marker.rank}" + (f" (local {local})" if local != marker.rank else "")
    failed = [e for e in tl.failure_events if e.kind is LauncherEventKind.WORKER_FAILED]
    timeouts = [
        e
        for e in tl.failure_events
        if e.kind in (LauncherEventKind.SECTION_TIMEOUT, LauncherEventKind.HEARTBEAT_TIMEOUT)
    ]

    def matches(e: LauncherEvent) -> bool:
        if marker.pid is not None and e.pid is not None and e.pid != marker.pid:
            return False
        return local is None or e.rank is None or e.rank == local

    proof: list[EvidenceRef] = []
    if ctx.fault == "hang":
        matching = [e for e in timeouts if e.rank == local or (e.rank is None and local is None)]
        if not matching:
            if timeouts:
                reason = (
                    f"the section-timeout message names local rank {timeouts[0].rank}, but the"
                    f" marker claims {rank_text}"
                )
            else:
                reason = f"no section-timeout message for {rank_text}: the hang was not detected"
            return _verdict(cid, False, reason, [e.ref for e in timeouts[:2]], marker.ref("rank"))
        proof.append(matching[0].ref)
        how = f"timed out in section {matching[0].name!r}"
        proof += [e.ref for e in failed if matches(e)][:1]
    else:
        matching = [e for e in failed if matches(e)]
        if not matching:
            if failed:
                e = failed[0]
                reason = (
                    f"the launcher recorded the failure of local_rank {e.rank} (pid {e.pid}), but"
                    f" the marker claims {rank_text} (pid {marker.pid})"
                )
                return _verdict(cid, False, reason, e.ref, marker.ref("rank"), marker.ref("pid"))
            return _verdict(
                cid,
                False,
                f"no worker-failure record for {rank_text} (only: {tl.failure_events[0].kind})",
                tl.failure_events[0].ref,
                marker.ref("rank"),
            )
        hit = matching[0]
        signum = _SIGNAL_NUMBERS.get(marker.signal or "")
        if signum is not None and hit.exit_code is not None and hit.exit_code != -signum:
            return _verdict(
                cid,
                False,
                f"{rank_text} failed with exit code {hit.exit_code}, not the {-signum} that"
                f" {marker.signal} gives: it did not die of the injected fault",
                hit.ref,
                marker.ref("signal"),
            )
        proof.append(hit.ref)
        how = f"failed with exit code {hit.exit_code}"
    if tl.detected is not None and tl.detected.ref not in proof:
        proof.append(tl.detected.ref)
    if tl.restart_decision is None:
        return _verdict(
            cid,
            False,
            "the launcher recorded the failure but no decision to restart the worker group",
            proof,
            _launcher_outcome(run),
        )
    proof.append(tl.restart_decision.ref)
    cycles = ", ".join(str(r.cycle) for r in run.cycles) or "none"
    replacement = (
        run.cycle_infos.by_cycle(tl.replacement_cycle) if tl.replacement_cycle is not None else None
    )
    if replacement is None or (
        replacement.start is not None
        and tl.fault_time is not None
        and replacement.start < tl.fault_time
    ):
        return _verdict(
            cid,
            False,
            f"no replacement cycle record after the failure of cycle {tl.failed_cycle}"
            f" ({run.cycle_infos.dir}/ has cycles: {cycles})",
            proof,
            [r.ref for r in run.cycles],
        )
    log = run.cycle_log(replacement.cycle)
    if log is None or not log.exists or log.line_count == 0 or log.first_line is None:
        name = log.file if log is not None else f"cycle {replacement.cycle} log"
        return _verdict(
            cid,
            False,
            f"replacement cycle {replacement.cycle} has no application log ({name} missing or"
            " empty): no replacement worker ran",
            replacement.ref,
            absent(name, "missing or empty"),
        )
    started = tl.replacement_started
    return _verdict(
        cid,
        True,
        f"launcher recorded {rank_text} {how} in cycle {tl.failed_cycle} and started replacement"
        f" cycle {replacement.cycle} at {_t(started.time if started else replacement.start)}",
        proof,
        replacement.ref,
        started.ref if started else None,
        log.first_line,
    )


# ----------------------------------------------------------------------------------------------
# 3. optimizer_state_load


def optimizer_state_load(run: RunEvidence, expected: ExpectedFault | None = None) -> Verdict:
    """The replacement loaded the newest checkpoint completed before the failure, with its
    optimizer state, and not an in-flight save, iteration 0 or a random init."""
    cid = "optimizer_state_load"
    ctx = _context(run, expected)
    tl = ctx.tl
    if ctx.expected.baseline:
        first = run.cycle_logs[0] if run.cycle_logs else None
        loads = first.of_type(LoadCompleted) if first is not None else ()
        if first is None or not loads:
            scratch = first.of_type(StartedFromScratch) if first is not None else ()
            return _not_applicable(
                cid,
                "baseline run restores nothing",
                ctx.expected.ref,
                scratch[0].ref if scratch else None,
            )
        # a baseline that resumes an existing checkpoint: judge that load
        return _judge_load(cid, run, first.cycle, expected_iteration=None, tl=tl)
    if tl.replacement_cycle is None:
        return _verdict(
            cid,
            False,
            "no replacement cycle: nothing was restored",
            _marker_ref(run, "time"),
            [r.ref for r in run.cycles],
        )
    expected_iteration, newest = _restore_target(run, tl)
    return _judge_load(cid, run, tl.replacement_cycle, expected_iteration, tl, newest)


def _load_death(
    errors: list[WorkloadError], starts: tuple[LoadStarted, ...]
) -> WorkloadError | None:
    """The error a cycle died of while loading its checkpoint: one raised through a checkpoint
    load (by its traceback), else the first after a load began (the load never completed)."""
    in_load = next((e for e in errors if e.in_checkpoint_load), None)
    if in_load is not None or not starts:
        return in_load
    began = starts[0].ref.line or 0
    return next((e for e in errors if (e.ref.line or 0) > began), None)


def _died_loading(
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
    again = _same_error_in(run, died, log.cycle)
    repeated = (
        f" (the same in cycle{'s' if len(again) > 1 else ''} {', '.join(map(str, again))})"
        if again
        else ""
    )
    return f"cycle {log.cycle} died loading {what}: {_describe(died, code=code)}{repeated}"


def _judge_load(
    cid: str,
    run: RunEvidence,
    cycle: int,
    expected_iteration: int | None,
    tl: Timeline,
    newest: SaveCompleted | None = None,
) -> Verdict:
    log = run.cycle_log(cycle)
    if log is None or not log.exists:
        name = log.file if log is not None else f"logs/ (cycle {cycle})"
        return _verdict(cid, False, f"no application log for cycle {cycle}", absent(name))
    loads = log.of_type(LoadCompleted)
    starts = log.of_type(LoadStarted)
    scratch = log.of_type(StartedFromScratch)
    failures = [e for e in log.events if isinstance(e, LOAD_FAILURES)]
    first_it = log.first_iteration
    setup_errors = _errors_before_training(log)
    if failures:
        return _verdict(
            cid,
            False,
            f"cycle {cycle} could not restore its state: {failures[0].ref.text.strip()}",
            [e.ref for e in failures[:3]],
            loads[0].ref if loads else None,
        )
    if loads and scratch:
        # ranks of one cycle disagree: some restored, some start from random initialization
        return _verdict(
            cid,
            False,
            f"cycle {cycle} loaded iteration {loads[0].iteration} on some rank(s) but started"
            " from random initialization on others",
            scratch[0].ref,
            loads[0].ref,
        )
    if not loads:
        died = _load_death(setup_errors, starts)
        if died is not None:
            return _verdict(
                cid,
                False,
                _died_loading(run, log, died, expected_iteration),
                _error_refs(died),
                starts[0].ref if starts else newest.ref if newest else None,
            )
        if scratch:
            return _verdict(
                cid,
                False,
                f"cycle {cycle} found no checkpoint and started from random initialization",
                scratch[0].ref,
                first_it.ref if first_it else None,
            )
        if starts:
            return _verdict(
                cid,
                False,
                f"cycle {cycle} began loading iteration {starts[0].iteration} but never finished",
                starts[0].ref,
                log.last_line,
            )
        if setup_errors:
            return _verdict(
                cid,
                False,
                f"cycle {cycle} failed before loading any checkpoint: {_describe(setup_errors[0])}",
                _error_refs(setup_errors[0]),
            )
        return _verdict(
            cid,
            False,
            f"cycle {cycle} shows no checkpoint load at all",
            log.first_line or absent(log.file, "empty"),
            first_it.ref if first_it else None,
        )
    load = loads[0]
    n = load.iteration
    start = next((s for s in starts if s.iteration == n), None)
    if n <= 0:
        return _verdict(
            cid, False, f"cycle {cycle} loaded iteration {n}, not a trained checkpoint", load.ref
        )
    if expected_iteration is not None and n != expected_iteration:
        if n > expected_iteration:
            in_flight = [
                e for e in saves_before_failure(run, tl, SaveScheduled) if e.iteration == n
            ]
            what = (
                "a save only scheduled before the failure, never finalized (in flight)"
                if in_flight
                else "never completed before the failure"
            )
            reason = (
                f"cycle {cycle} loaded iteration {n}, {what}; the newest completed checkpoint"
                f" was {expected_iteration}"
            )
            return _verdict(
                cid,
                False,
                reason,
                load.ref,
                [e.ref for e in in_flight[:1]],
                newest.ref if newest else None,
            )
        return _verdict(
            cid,
            False,
            f"cycle {cycle} loaded iteration {n}, older than the newest checkpoint completed"
            f" before the failure ({expected_iteration})",
            load.ref,
            newest.ref if newest else None,
        )
    if setup_errors:
        return _verdict(
            cid,
            False,
            f"error while cycle {cycle} restored: {_describe(setup_errors[0])}",
            _error_refs(setup_errors[0]),
            load.ref,
        )
    if first_it is not None and first_it.iteration <= n:
        return _verdict(
            cid,
            False,
            f"cycle {cycle} loaded iteration {n} but then trained iteration {first_it.iteration}:"
            " the training state was not resumed",
            load.ref,
            first_it.ref,
        )
    meta = run.checkpoint(n)
    if meta is not None and meta.state in (OptimizerState.MISSING, OptimizerState.UNREADABLE):
        return _verdict(
            cid,
            False,
            f"checkpoint {n} on disk: {meta.detail}",
            meta.ref,
            load.ref,
        )
    # A workload that lists what it restored (LoadCompleted.parts) must list the optimizer on
    # every rank that says so; one that does not say is judged from failures and metadata.
    reported = [e for e in loads if e.parts is not None]
    partial = next((e for e in reported if OPTIMIZER_PART not in (e.parts or ())), None)
    if partial is not None:
        return _verdict(
            cid,
            False,
            f"cycle {cycle} restored iteration {partial.iteration} without optimizer state: the"
            f" workload reports only ({', '.join(partial.parts or ()) or 'nothing'})",
            partial.ref,
            meta.ref if meta is not None else None,
        )
    if meta is not None and meta.state is OptimizerState.PRESENT:
        how = (
            f"optimizer state confirmed in the checkpoint ({meta.optimizer_keys}/{meta.keys} keys)"
        )
    elif reported:
        how = (
            f"the workload reports optimizer state restored on {len(reported)} rank(s)"
            f" ({', '.join(reported[0].parts or ())})"
        )
    else:
        how = "no optimizer/RNG load failure logged (checkpoint files pruned: judged from logs)"
    what = (
        "the newest completed before the failure"
        if expected_iteration is not None and newest is not None
        else "the marker's tracker iteration"
        if expected_iteration is not None
        else "the resumed checkpoint"
    )
    return _verdict(
        cid,
        True,
        f"cycle {cycle} loaded checkpoint iteration {n}, {what}; {how}",
        start.ref if start else None,
        load.ref,
        [e.ref for e in reported[:8]],
        newest.ref if newest else None,
        meta.ref if meta is not None else None,
    )


# ----------------------------------------------------------------------------------------------
# 4. progress_past_restore


def progress_past_restore(run: RunEvidence, expected: ExpectedFault | None = None) -> Verdict:
    """After the restore: steps beyond it, a later checkpoint completed, final iteration reached."""
    cid = "progress_past_restore"
    ctx = _context(run, expected)
    tl = ctx.tl
    if ctx.expected.baseline:
        logs = logs_from(run, None)
        start_cycle = logs[0].cycle if logs else None
    else:
        if tl.replacement_cycle is None:
            return _verdict(
                cid,
                False,
                "no replacement cycle: nothing trained after a restore",
                _marker_ref(run, "time"),
                _launcher_outcome(run),
            )
        start_cycle = tl.replacement_cycle
        logs = logs_from(run, start_cycle)
    first_log = run.cycle_log(start_cycle) if start_cycle is not None else None
    loads = first_log.of_type(LoadCompleted) if first_log is not None else ()
    restored = loads[0].iteration if loads else 0
    restored_text = f"iteration {restored}" if loads else "a fresh start (no checkpoint loaded)"
    its = [log.max_iteration for log in logs if log.max_iteration is not None]
    top: IterationCommitted | None = max(its, key=lambda e: e.iteration, default=None)
    first = next((log.first_iteration for log in logs if log.first_iteration is not None), None)
    if top is None or top.iteration <= restored:
        died = (
            _load_death(_errors_before_training(first_log), first_log.of_type(LoadStarted))
            if first_log is not None and not loads
            else None
        )
        if died is not None and first_log is not None:
            # say why: the restore itself failed (criterion 3 has the details)
            target = None if ctx.expected.baseline else _restore_target(run, tl)[0]
            return _verdict(
                cid,
                False,
                "no iteration was committed after the restore: "
                + _died_loading(run, first_log, died, target, code=False),
                died.ref,
                [e.ref for e in run.launcher.of_kind(LauncherEventKind.NO_PROGRESS)][:3],
                top.ref if top else None,
            )
        return _verdict(
            cid,
            False,
            f"no iteration beyond {restored_text} was committed after the restore",
            loads[0].ref if loads else None,
            top.ref if top else None,
            (first_log.last_line if first_log else None) or _launcher_outcome(run),
        )
    later = [e for log in logs for e in log.of_type(SaveCompleted) if e.iteration > restored]
    if not later:
        scheduled = [
            e for log in logs for e in log.of_type(SaveScheduled) if e.iteration > restored
        ]
        return _verdict(
            cid,
            False,
            f"no checkpoint beyond {restored_text} completed after the restore"
            + (" (saves were scheduled but never finalized)" if scheduled else ""),
            [e.ref for e in scheduled[:2]],
            top.ref,
        )
    final_ref: EvidenceRef | None = None
    final: int | None = None
    manifest = run.manifest
    if manifest is not None and manifest.train_iters is not None:
        value = manifest.train_iters.value
        if isinstance(value, int) and not isinstance(value, bool):
            final, final_ref = value, manifest.train_iters.ref
    source = "run.json"
    if final is None:
        last = max(
            (log.last_iteration for log in logs if log.last_iteration is not None),
            key=lambda e: e.ref.line or 0,
            default=None,
        )
        if last is not None and last.total is not None:
            final, final_ref, source = last.total, last.ref, "the iteration lines"
    if final is None:
        return _verdict(cid, False, "the final iteration is unknown (no run.json, no N/M)", top.ref)
    if top.iteration < final:
        return _verdict(
            cid,
            False,
            f"training stopped at iteration {top.iteration}, before the final iteration {final}"
            f" (from {source})",
            top.ref,
            final_ref,
            later[-1].ref,
        )
    tracker = run.tracker
    tracker_ref = (
        tracker.ref
        if tracker.iteration is not None and tracker.iteration > restored and tracker.ref
        else None
    )
    return _verdict(
        cid,
        True,
        f"after {restored_text}, committed iterations {first.iteration if first else '?'}"
        f"..{top.iteration}, checkpoint {later[0].iteration} completed at {_t(later[0].time)},"
        f" final iteration {final} (from {source}) reached",
        first.ref if first else None,
        later[0].ref,
        top.ref,
        later[-1].ref if later[-1] is not later[0] else None,
        final_ref if final_ref is not top.ref else None,
        tracker_ref,
    )


# ----------------------------------------------------------------------------------------------
# 5. no_repeat_injection


def no_repeat_injection(run: RunEvidence, expected: ExpectedFault | None = None) -> Verdict:
    """The launcher finished successfully after exactly one injected failure: no second failure,
    no no-progress stop (EARLY TERMINATION / exit code 93)."""
    cid = "no_repeat_injection"
    ctx = _context(run, expected)
    tl = ctx.tl
    launcher = run.launcher
    K = LauncherEventKind
    manifest = run.manifest
    exit_code = manifest.exit_code if manifest is not None else None
    stops = launcher.of_kind(K.EARLY_TERMINATION, K.NO_RESTART, K.RUN_FAILED)
    bad_exits = [e for e in launcher.of_kind(K.AGENT_EXIT) if e.exit_code not in (None, 0)]
    if stops or bad_exits:
        first = (stops or tuple(bad_exits))[0]
        what = "no-progress stop" if first.kind is K.EARLY_TERMINATION else "failed run"
        return _verdict(
            cid,
            False,
            f"launcher stopped ({what}): {first.ref.text.split('] ')[-1].strip()}",
            [e.ref for e in (*stops, *bad_exits)][:4],
            exit_code.ref if exit_code else None,
        )
    if exit_code is not None and exit_code.value != 0:
        why = " (no-progress stop)" if exit_code.value == 93 else ""
        return _verdict(
            cid,
            False,
            f"launcher exited with code {exit_code.value}{why}",
            exit_code.ref,
            _launcher_outcome(run),
        )
    successes = launcher.of_kind(K.RUN_OK, K.GROUP_SUCCEEDED) + tuple(
        e for e in launcher.of_kind(K.AGENT_EXIT) if e.exit_code == 0
    )
    if not successes and exit_code is None:
        return _verdict(
            cid,
            False,
            "the launcher recorded no successful finish",
            _launcher_outcome(run),
        )
    success_refs = [e.ref for e in successes][-1:] + ([exit_code.ref] if exit_code else [])
    marker = run.marker
    if ctx.expected.baseline:
        failures = [*tl.failure_events, *tl.other_failures]
        if marker is not None:
            return _verdict(
                cid, False, "baseline run (fault=none) has an injection marker", marker.ref()
            )
        if failures:
            return _verdict(
                cid,
                False,
                f"baseline run recorded a worker failure: {failures[0].ref.text.strip()}",
                [e.ref for e in failures[:3]],
            )
        if len(run.cycles) > 1:
            return _verdict(
                cid,
                False,
                f"baseline run needed {len(run.cycles)} cycles: it was restarted",
                [r.ref for r in run.cycles],
            )
        reported = _workload_failures(run, None)
        if reported:
            return _verdict(
                cid,
                False,
                f"baseline run's workload reported a failure: {reported[0].text.strip()}",
                reported[:3],
                success_refs,
            )
        return _verdict(
            cid,
            True,
            "baseline finished successfully in one cycle with no injection and no failure",
            success_refs,
            ctx.expected.ref,
            run.cycles[0].ref if run.cycles else None,
        )
    if marker is None:
        return _verdict(
            cid,
            False,
            "no injection happened (no marker): exactly one was requested",
            _marker_ref(run),
            success_refs,
        )
    if not marker.ok:
        return _verdict(cid, False, f"injection marker unusable: {marker.error}", marker.ref())
    if tl.other_failures:
        e = tl.other_failures[0]
        when = (
            "after the replacement started"
            if tl.replacement_started is not None
            and e.ref.line is not None
            and tl.replacement_started.ref.line is not None
            and e.ref.line > tl.replacement_started.ref.line
            else "besides the injected one"
        )
        return _verdict(
            cid,
            False,
            f"a second failure {when}: {e.ref.text.split('] ')[-1].strip()}",
            [x.ref for x in tl.other_failures[:3]],
            tl.replacement_started.ref if tl.replacement_started else None,
        )
    extra = [
        r for r in run.cycles if tl.replacement_cycle is not None and r.cycle > tl.replacement_cycle
    ]
    if extra:
        return _verdict(
            cid,
            False,
            f"the launcher started cycle {extra[0].cycle} after the replacement cycle"
            f" {tl.replacement_cycle}: the job failed again",
            [r.ref for r in extra[:2]],
        )
    reported = (
        _workload_failures(run, tl.replacement_cycle) if tl.replacement_cycle is not None else []
    )
    if reported:
        # the launcher saw no second failure, but the workload says it failed again
        return _verdict(
            cid,
            False,
            "the workload reported a failure after the replacement started:"
            f" {reported[0].text.strip()}",
            reported[:3],
            tl.replacement_started.ref if tl.replacement_started else None,
            success_refs,
        )
    return _verdict(
        cid,
        True,
        f"launcher finished successfully after exactly one injected {marker.fault}; no later"
        " failure, no no-progress stop",
        success_refs,
        marker.ref("time"),
        tl.replacement_started.ref if tl.replacement_started else None,
    )


# ----------------------------------------------------------------------------------------------
# all five

Criterion = Callable[[RunEvidence, ExpectedFault | None], Verdict]

CRITERIA: dict[str, Criterion] = {
    "prior_checkpoint": prior_checkpoint,
    "replaced_cycle": replaced_cycle,
    "optimizer_state_load": optimizer_state_load,
    "progress_past_restore": progress_past_restore,
    "no_repeat_injection": no_repeat_injection,
}


@dataclass(frozen=True)
class Judgement:
    """All five verdicts of one run, plus what the report needs (stack, timings, problems)."""

    run_dir: Path
    checkpoint_dir: Path
    expected: ExpectedFault
    verdicts: tuple[Verdict, ...]
    problems: tuple[Problem, ...]
    timings: dict[str, float]
    stack: dict[str, Any]

    @property
    def judgeable(self) -> bool:
        """False when the artifacts are too broken to judge (verify exits 2)."""
        return not any(p.severity == "fatal" for p in self.problems)

    @property
    def passed(self) -> bool:
        return self.judgeable and all(v.passed for v in self.verdicts)

    def verdict(self, criterion: str) -> Verdict:
        for v in self.verdicts:
            if v.id == criterion:
                return v
        raise KeyError(f"unknown criterion {criterion!r}; known: {', '.join(CRITERIA_IDS)}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "checkpoint_dir": str(self.checkpoint_dir),
            "expected_fault": {"kind": self.expected.kind, "source": self.expected.source},
            "criteria": [v.as_dict() for v in self.verdicts],
            "passed": self.passed,
            "problems": [{"severity": p.severity, "message": p.message} for p in self.problems],
            "stack": self.stack,
            "timings": self.timings,
        }


def judge(
    run: RunEvidence, expect_fault: str | None = None, *, source: str = "caller"
) -> Judgement:
    """Judge loaded evidence by all five criteria (``expect_fault`` overrides run.json;
    ``source`` names where it came from in the report)."""
    expected = expected_fault(run, expect_fault, source)
    verdicts = tuple(CRITERIA[cid](run, expected) for cid in CRITERIA_IDS)
    return Judgement(
        run_dir=run.run_dir,
        checkpoint_dir=run.checkpoint_dir,
        expected=expected,
        verdicts=verdicts,
        problems=run.problems,
        timings=timings(run, build_timeline(run)),
        stack=run.stack(),
    )


def judge_run_dir(
    run_dir: Path, checkpoint_dir: Path | None = None, *, expect_fault: str | None = None
) -> Judgement:
    """Load and judge a run directory. Raises RunDirError if it is not a directory."""
    return judge(load_run(Path(run_dir), checkpoint_dir), expect_fault)
