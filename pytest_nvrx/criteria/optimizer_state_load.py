"""Criterion 3: the replacement loaded the newest checkpoint completed before the failure, with
its optimizer state, and not an in-flight save, iteration 0 or a random init.

The load is judged in steps, each returning a failing verdict or nothing: find the load in the
cycle's log, check its iteration against the restore target, check that training resumed after
it, check its optimizer state; what is left is a pass. In a window run (issue #10) the target is
the marker's tracker iteration T; a load of the save N in flight at the fault proves the tracker
named N before its finalization, and the verdict says whether ``iter_N/`` is on disk at the end.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pytest_nvrx.criteria.context import NO_TARGET, JudgeContext, RestoreTarget
from pytest_nvrx.criteria.expected import ExpectedFault
from pytest_nvrx.criteria.helpers import marker_ref
from pytest_nvrx.criteria.required_evidence import world_ranks
from pytest_nvrx.criteria.resume_settings import resume_settings_problem
from pytest_nvrx.criteria.verdict import (
    CriterionId,
    Quote,
    Verdict,
    failing,
    not_applicable,
    passing,
    unjudgeable,
)
from pytest_nvrx.criteria.windows import in_flight_dir_text
from pytest_nvrx.criteria.workload_errors import (
    describe,
    died_loading,
    error_refs,
    errors_before_training,
    load_death,
)
from pytest_nvrx.evidence.checkpoint import DCP_METADATA, CheckpointMetadata, OptimizerState
from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.refs import EvidenceRef, absent, split_rank_prefix
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.workload import (
    LOAD_FAILURES,
    IterationCommitted,
    LoadCompleted,
    LoadStarted,
    SaveCompleted,
    SaveScheduled,
    StartedFromScratch,
    WorkloadError,
    get_adapter,
    loads_on_every_rank,
)

ID: CriterionId = "optimizer_state_load"

# The name a workload uses for optimizer state among the parts it reports restored.
OPTIMIZER_PART = "optimizer"


def optimizer_state_load(run: RunEvidence, expected: ExpectedFault | None = None) -> Verdict:
    """The replacement loaded the newest checkpoint completed before the failure, with its
    optimizer state, and not an in-flight save, iteration 0 or a random init."""
    return check(JudgeContext.build(run, expected))


def check(ctx: JudgeContext) -> Verdict:
    run, timeline = ctx.run, ctx.timeline
    if ctx.expected.baseline:
        first = run.cycle_logs[0] if run.cycle_logs else None
        loads = first.of_type(LoadCompleted) if first is not None else ()
        if first is None or not loads:
            scratch = first.of_type(StartedFromScratch) if first is not None else ()
            return not_applicable(
                ID,
                "baseline run restores nothing",
                ctx.expected.ref,
                scratch[0].ref if scratch else None,
            )
        # a baseline that resumes an existing checkpoint: judge that load
        return _judge_load(ctx, first.cycle, first, NO_TARGET)
    if timeline.replacement_cycle is None:
        return failing(
            ID,
            "no replacement cycle: nothing was restored",
            marker_ref(run, "time"),
            [r.ref for r in run.cycles],
        )
    told = _check_settings(ctx)
    if told is not None:
        return told
    return _judge_load(ctx, timeline.replacement_cycle, ctx.replacement_log, ctx.restore_target)


def _check_settings(ctx: JudgeContext) -> Verdict | None:
    """The replacement was started to skip optimizer state, to finetune, to load from elsewhere
    than the failed cycle saved to, or on another world size / parallel shape: Megatron prints
    no load line that says so, only its startup argument dump."""
    failed = ctx.timeline.failed_cycle
    replacement = ctx.replacement_log
    manifest = ctx.run.manifest
    problem = resume_settings_problem(
        ctx.run.cycle_log(failed) if failed is not None else None,
        replacement,
        checkpoint_dir=manifest.checkpoint_dir if manifest is not None else None,
    )
    if problem is None:
        return None
    loads = replacement.of_type(LoadCompleted) if replacement is not None else ()
    return failing(ID, problem.reason, problem.refs, loads[0].ref if loads else None)


@dataclass(frozen=True, slots=True)
class _Restore:
    """What one cycle's log shows about its restore."""

    log: CycleLog
    loads: tuple[LoadCompleted, ...]  # one per rank that loaded
    starts: tuple[LoadStarted, ...]
    scratch: tuple[StartedFromScratch, ...]  # ranks that found no checkpoint
    first_iteration: IterationCommitted | None
    setup_errors: list[WorkloadError]  # errors before the first committed iteration

    @property
    def cycle(self) -> int:
        return self.log.cycle

    @property
    def reported(self) -> list[LoadCompleted]:
        """The loads that list the parts they restored (LoadCompleted.parts)."""
        return [e for e in self.loads if e.parts is not None]

    def setup_failure(self, said: str, *more: Quote) -> Verdict | None:
        """A failing verdict quoting the cycle's first error before it trained, ``said`` before
        its description (``more`` quoted after it); None when the cycle set up without one."""
        if not self.setup_errors:
            return None
        error = self.setup_errors[0]
        return failing(ID, f"{said}: {describe(error)}", error_refs(error), *more)


def _judge_load(
    ctx: JudgeContext, cycle: int, log: CycleLog | None, target: RestoreTarget
) -> Verdict:
    """Judge the checkpoint load of ``cycle`` (whose log is ``log``) against ``target``."""
    if log is None or not log.exists:
        name = log.file if log is not None else f"logs/ (cycle {cycle})"
        return failing(ID, f"no application log for cycle {cycle}", absent(name))
    restore = _Restore(
        log=log,
        loads=log.of_type(LoadCompleted),
        starts=log.of_type(LoadStarted),
        scratch=log.of_type(StartedFromScratch),
        first_iteration=log.first_iteration,
        setup_errors=errors_before_training(log),
    )
    load = _find_load(ctx.run, restore, target)
    if isinstance(load, Verdict):
        return load
    meta = ctx.run.checkpoint(load.iteration)
    failed = (
        _check_iteration(ctx, restore, load, target)
        # after the iteration against the target: a load of the wrong iteration says so first
        or _paths_disagree(ctx.run, restore)
        or _data_position_disagrees(ctx.run, restore)
        or _check_resumed(restore, load)
        or _restore_point_gone(ctx.run, load, meta)
        or _check_optimizer_state(restore, load, meta)
    )
    return failed or _passed(ctx, restore, load, target, meta)


def _find_load(
    run: RunEvidence, restore: _Restore, target: RestoreTarget
) -> LoadCompleted | Verdict:
    """The first rank's completed load; else why there is none (a failed, mixed or absent load)."""
    cycle, loads, scratch = restore.cycle, restore.loads, restore.scratch
    failures = [e for e in restore.log.events if isinstance(e, LOAD_FAILURES)]
    if failures:
        return failing(
            ID,
            f"cycle {cycle} could not restore its state: {failures[0].ref.text.strip()}",
            [e.ref for e in failures[:3]],
            loads[0].ref if loads else None,
        )
    if loads and scratch:
        # ranks of one cycle disagree: some restored, some start from random initialization
        return failing(
            ID,
            f"cycle {cycle} loaded iteration {loads[0].iteration} on some rank(s) but started"
            " from random initialization on others",
            scratch[0].ref,
            loads[0].ref,
        )
    if not loads:
        return _no_load(run, restore, target)
    return _ranks_disagree(run, restore) or loads[0]


def _rank(ref: EvidenceRef) -> int | None:
    return split_rank_prefix(ref.text)[0]


def _ranks_disagree(run: RunEvidence, restore: _Restore) -> Verdict | None:
    """Every rank of the cycle restored one and the same iteration: a rank whose "loading ... at
    N" line is followed by "loaded ... at M", two ranks (or two lines) naming different
    iterations, or, where every rank prints its own load line, a rank without one, is a restore
    the ranks do not agree on."""
    cycle, loads = restore.cycle, restore.loads
    for load in loads:
        rank = _rank(load.ref)
        began = [s for s in restore.starts if _rank(s.ref) == rank]
        if began and began[-1].iteration != load.iteration:
            return failing(
                ID,
                f"cycle {cycle} rank {_n(rank)} began loading iteration {began[-1].iteration} but"
                f" reports iteration {load.iteration} loaded",
                began[-1].ref,
                load.ref,
            )
    iterations = sorted({e.iteration for e in loads})
    if len(iterations) > 1:
        firsts = [next(e for e in loads if e.iteration == it) for it in iterations]
        said = ", ".join(f"rank {_n(_rank(e.ref))} iteration {e.iteration}" for e in firsts)
        return failing(
            ID,
            f"the ranks of cycle {cycle} restored different checkpoints ({said}): one"
            " training state cannot be resumed from two",
            [e.ref for e in firsts],
        )
    if not loads_on_every_rank(get_adapter(run.workload)):
        return None
    loaded = {_rank(e.ref) for e in loads}
    # every rank the world size names, not only those that printed something
    world = world_ranks(run)
    ranks = sorted(set(restore.log.ranks) | set(world[0] if world is not None else ()))
    missing = [r for r in ranks if r not in loaded]
    if missing:
        silent = missing[0] not in restore.log.ranks and world is not None
        return failing(
            ID,
            f"cycle {cycle} rank {missing[0]} shows no checkpoint load while rank(s)"
            f" {', '.join(_n(r) for r in sorted(loaded, key=_order))} loaded iteration"
            f" {iterations[0]}: every rank of the workload prints its own load line"
            + (
                f" (rank {missing[0]} printed no line at all in {restore.log.file}, one of the"
                f" {len(world[0])} ranks {world[1].location} names)"
                if silent and world is not None
                else ""
            ),
            loads[0].ref,
            world[1] if silent and world is not None else None,
            None if silent else _first_line_of_rank(restore.log, missing[0]),
        )
    return None


def _paths_disagree(run: RunEvidence, restore: _Restore) -> Verdict | None:
    """A load line that names its checkpoint names the checkpoint of the iteration it says it
    loaded (the adapter's ``checkpoint_path``), and every rank names the same one."""
    cycle = restore.cycle
    adapter = get_adapter(run.workload)
    named = [e for e in restore.loads if e.path is not None]
    for load in named:
        assert load.path is not None
        want = adapter.checkpoint_path(Path(), load.iteration).parts
        if _tail(load.path, len(want)) == want:
            continue
        save = next(
            (
                e
                for log in run.cycle_logs
                if log.cycle <= cycle
                for e in log.of_type(SaveScheduled)
                if e.path is not None and _same_path(e.path, load.path)
            ),
            None,
        )
        whose = f"; that path is the save of iteration {save.iteration}" if save else ""
        right = next(
            (e for e in named if e.path is not None and _tail(e.path, len(want)) == want), None
        )
        return failing(
            ID,
            f"cycle {cycle} rank {_n(_rank(load.ref))} reports iteration {load.iteration} loaded"
            f" from {load.path}, not iteration {load.iteration}'s checkpoint"
            f" ({posixpath.join(*want)}){whose}",
            load.ref,
            save.ref if save else None,
            right.ref if right else None,
        )
    paths = sorted({posixpath.normpath(e.path) for e in named if e.path is not None})
    if len(paths) > 1:
        firsts = sorted(
            (next(e for e in named if e.path and posixpath.normpath(e.path) == p) for p in paths),
            key=lambda e: e.ref.line or 0,
        )
        said = ", ".join(f"rank {_n(_rank(e.ref))} {e.path}" for e in firsts)
        return failing(
            ID,
            f"the ranks of cycle {cycle} loaded iteration {named[0].iteration} from different"
            f" checkpoints ({said})",
            [e.ref for e in firsts],
        )
    return None


def _tail(path: str, n: int) -> tuple[str, ...]:
    return PurePosixPath(path).parts[-n:] if n else ()


def _same_path(a: str, b: str) -> bool:
    return posixpath.normpath(a) == posixpath.normpath(b)


def _data_position_disagrees(run: RunEvidence, restore: _Restore) -> Verdict | None:
    """Where load lines say the data position they restored (the reference workload's
    ``consumed_samples``): every rank restored the same one, training went on from it (the first
    iteration after the restored R shows it plus one iteration's samples, as consecutive
    iteration lines count them), and it is what the run printed at iteration R before."""
    cycle = restore.cycle
    said = [e for e in restore.loads if e.consumed_samples is not None]
    if not said:
        return None
    values = sorted({e.consumed_samples for e in said if e.consumed_samples is not None})
    if len(values) > 1:
        firsts = sorted(
            (next(e for e in said if e.consumed_samples == v) for v in values),
            key=lambda e: e.ref.line or 0,
        )
        shown = ", ".join(
            f"rank {_n(_rank(e.ref))} consumed_samples {e.consumed_samples}" for e in firsts
        )
        return failing(
            ID,
            f"the ranks of cycle {cycle} restored iteration {said[0].iteration} at different data"
            f" positions ({shown}): one training state cannot be resumed from two",
            [e.ref for e in firsts],
        )
    load, restored = said[0], values[0]
    loaded = load.iteration
    earlier = _printed_at(run, cycle, loaded)
    first = restore.first_iteration
    if first is not None and first.iteration == loaded + 1 and first.consumed_samples is not None:
        step = _samples_per_iteration([restore.log, *([earlier[0]] if earlier else [])])
        if step is not None and first.consumed_samples != restored + step[0]:
            return failing(
                ID,
                f"cycle {cycle} rank {_n(_rank(load.ref))} restored consumed_samples {restored}"
                f" with iteration {loaded}, but its first iteration after, {first.iteration},"
                f" shows {first.consumed_samples} consumed samples; with {step[0]} samples an"
                f" iteration ({step[1].location}, {step[2].location}) it would show"
                f" {restored + step[0]}: the restored data position is not the one trained on",
                load.ref,
                first.ref,
                [step[1], step[2]],
            )
    if earlier is not None and earlier[1].consumed_samples != restored:
        log, line = earlier
        return failing(
            ID,
            f"cycle {cycle} rank {_n(_rank(load.ref))} restored consumed_samples {restored} with"
            f" iteration {loaded}, but cycle {log.cycle} printed {line.consumed_samples} consumed"
            f" samples at iteration {loaded}: the restored data position is not the checkpoint's",
            load.ref,
            line.ref,
        )
    return None


def _printed_at(
    run: RunEvidence, cycle: int, iteration: int
) -> tuple[CycleLog, IterationCommitted] | None:
    """The last line of ``iteration`` with its consumed samples in the newest cycle before
    ``cycle`` that printed one."""
    for log in sorted(run.cycle_logs, key=lambda g: g.cycle, reverse=True):
        if log.cycle >= cycle:
            continue
        lines = [
            e for e in log.iterations if e.iteration == iteration and e.consumed_samples is not None
        ]
        if lines:
            return log, lines[-1]
    return None


def _samples_per_iteration(
    logs: list[CycleLog],
) -> tuple[int, EvidenceRef, EvidenceRef] | None:
    """Samples one iteration consumes, as the first two consecutive iteration lines of one rank
    (in the first of ``logs`` that has them) count them, with those lines; None: none tell."""
    for log in logs:
        last: dict[int | None, IterationCommitted] = {}
        for line in log.iterations:
            if line.consumed_samples is None:
                continue
            rank = _rank(line.ref)
            before = last.get(rank)
            last[rank] = line
            if before is None or before.consumed_samples is None:
                continue
            span = line.iteration - before.iteration
            grew = line.consumed_samples - before.consumed_samples
            if span > 0 and grew > 0 and grew % span == 0:
                return grew // span, before.ref, line.ref
    return None


def _n(rank: int | None) -> str:
    return "?" if rank is None else str(rank)


def _order(rank: int | None) -> int:
    return -1 if rank is None else rank


def _first_line_of_rank(log: CycleLog, rank: int) -> EvidenceRef:
    """Where the rank without a load line can be seen: its first iteration line, else the log."""
    for it in log.iterations:
        if _rank(it.ref) == rank:
            return it.ref
    return log.first_line or absent(log.file, "empty")


def _no_load(run: RunEvidence, restore: _Restore, target: RestoreTarget) -> Verdict:
    """Why a cycle completed no load: it died loading, started from scratch, never finished the
    load, failed before loading, or shows no load at all."""
    cycle, log, starts = restore.cycle, restore.log, restore.starts
    first_trained = restore.first_iteration
    died = load_death(restore.setup_errors, starts)
    if died is not None:
        return failing(
            ID,
            died_loading(run, log, died, target.iteration),
            error_refs(died),
            starts[0].ref if starts else target.save.ref if target.save else None,
        )
    if restore.scratch:
        return failing(
            ID,
            f"cycle {cycle} found no checkpoint and started from random initialization",
            restore.scratch[0].ref,
            first_trained.ref if first_trained else None,
        )
    if starts:
        return failing(
            ID,
            f"cycle {cycle} began loading iteration {starts[0].iteration} but never finished",
            starts[0].ref,
            log.last_line,
        )
    failed = restore.setup_failure(f"cycle {cycle} failed before loading any checkpoint")
    if failed is not None:
        return failed
    return failing(
        ID,
        f"cycle {cycle} shows no checkpoint load at all",
        log.first_line or absent(log.file, "empty"),
        first_trained.ref if first_trained else None,
    )


def _check_iteration(
    ctx: JudgeContext, restore: _Restore, load: LoadCompleted, target: RestoreTarget
) -> Verdict | None:
    """A trained checkpoint, the target's: not iteration 0, an in-flight save or an older one."""
    cycle, loaded, expected, newest = restore.cycle, load.iteration, target.iteration, target.save
    if loaded <= 0:
        return failing(
            ID, f"cycle {cycle} loaded iteration {loaded}, not a trained checkpoint", load.ref
        )
    if expected is None or loaded == expected:
        return None
    facts = ctx.window_facts
    if facts is not None and facts.in_flight is not None and loaded == facts.in_flight:
        meta = facts.in_flight_dir
        return failing(
            ID,
            f"cycle {cycle} loaded iteration {loaded}, the save in flight at the fault (window"
            f" {facts.window}): the tracker named it before its finalization; the newest"
            f" checkpoint completed before the fault was {expected}",
            load.ref,
            ctx.run.marker.ref("in_flight_iteration") if ctx.run.marker is not None else None,
            newest.ref if newest else None,
            meta.ref if meta is not None else None,
        )
    if loaded < expected:
        return failing(
            ID,
            f"cycle {cycle} loaded iteration {loaded}, older than the newest checkpoint completed"
            f" before the failure ({expected})",
            load.ref,
            newest.ref if newest else None,
        )
    in_flight = [e for e in ctx.scheduled_before_failure if e.iteration == loaded]
    what = (
        "a save only scheduled before the failure, never finalized (in flight)"
        if in_flight
        else "never completed before the failure"
    )
    return failing(
        ID,
        f"cycle {cycle} loaded iteration {loaded}, {what}; the newest completed checkpoint"
        f" was {expected}",
        load.ref,
        [e.ref for e in in_flight[:1]],
        newest.ref if newest else None,
    )


def _check_resumed(restore: _Restore, load: LoadCompleted) -> Verdict | None:
    """No error while restoring, and training went on after the loaded iteration."""
    cycle, loaded, first_trained = restore.cycle, load.iteration, restore.first_iteration
    failed = restore.setup_failure(f"error while cycle {cycle} restored", load.ref)
    if failed is not None:
        return failed
    if first_trained is not None and first_trained.iteration <= loaded:
        return failing(
            ID,
            f"cycle {cycle} loaded iteration {loaded} but then trained iteration"
            f" {first_trained.iteration}: the training state was not resumed",
            load.ref,
            first_trained.ref,
        )
    return None


def _restore_point_gone(
    run: RunEvidence, load: LoadCompleted, meta: CheckpointMetadata | None
) -> Verdict | None:
    """The checkpoint the replacement loaded is gone from a checkpoint directory that still
    holds checkpoints. Pruning (retention.py) keeps every ``iter_N/`` and its ``.metadata``; the
    committed runs trimmed further keep the ``.metadata`` of every checkpoint a cycle loaded
    (tests/data/*/README.md), or no checkpoint directory at all (the tracker alone: judged from
    logs, as said in the verdict). So a restore point absent, or without the DCP metadata every
    torch_dist and reference checkpoint has, beside checkpoints still on disk was removed after
    the run: whether it held the optimizer state is unknown, and the load cannot be judged."""
    others = [n for n in run.checkpoint_dirs or () if n != load.iteration]
    if meta is None or not others:
        # a lone directory (no other checkpoint to compare its pruning with) proves nothing
        # either way: judged from the logs, as a checkpoint directory pruned whole
        return None
    if meta.state is OptimizerState.ABSENT_DIR:
        what = f"{meta.dir}/ is not on disk"
    elif meta.state is OptimizerState.UNKNOWN:
        what = f"{meta.dir}/ holds no {DCP_METADATA} ({meta.detail})"
    else:
        return None
    shown = ", ".join(f"iter_{n:07d}/" for n in others[:3]) + (" ..." if len(others) > 3 else "")
    return unjudgeable(
        ID,
        f"checkpoint {load.iteration}, which the replacement loaded, is gone: {what}, while the"
        f" checkpoint directory still holds {shown} (pruning keeps"
        " every checkpoint's directory and metadata): whether it held the optimizer state is"
        " unknown",
        meta.ref,
        load.ref,
    )


def _check_optimizer_state(
    restore: _Restore, load: LoadCompleted, meta: CheckpointMetadata | None
) -> Verdict | None:
    """The checkpoint on disk holds optimizer state (when it is still there), and every rank that
    lists what it restored lists the optimizer. A metadata file too large to read says something
    about the restore that nobody read: the load cannot be judged, whatever the logs say."""
    if meta is not None and meta.state is OptimizerState.TOO_LARGE:
        return unjudgeable(
            ID,
            f"checkpoint {load.iteration} on disk: {meta.detail}: whether it holds the optimizer"
            " state the replacement had to restore is unknown",
            meta.ref,
            load.ref,
        )
    if meta is not None and meta.state in (OptimizerState.MISSING, OptimizerState.UNREADABLE):
        return failing(
            ID,
            f"checkpoint {load.iteration} on disk: {meta.detail}",
            meta.ref,
            load.ref,
        )
    # A workload that lists what it restored (LoadCompleted.parts) must list the optimizer on
    # every rank that says so; one that does not say is judged from failures and metadata.
    partial = next((e for e in restore.reported if OPTIMIZER_PART not in (e.parts or ())), None)
    if partial is not None:
        return failing(
            ID,
            f"cycle {restore.cycle} restored iteration {partial.iteration} without optimizer"
            f" state: the workload reports only ({', '.join(partial.parts or ()) or 'nothing'})",
            partial.ref,
            meta.ref if meta is not None else None,
        )
    return None


def _passed(
    ctx: JudgeContext,
    restore: _Restore,
    load: LoadCompleted,
    target: RestoreTarget,
    meta: CheckpointMetadata | None,
) -> Verdict:
    """A load that survived every check: say against what target and how the optimizer state
    is known to be back."""
    reported = restore.reported
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
        how = (
            "no optimizer/RNG load failure logged (checkpoint files pruned: judged from logs;"
            " no checkpoint directory is left on disk)"
        )
    what = (
        "the newest completed before the failure"
        if target.iteration is not None and target.save is not None
        else "the marker's tracker iteration"
        if target.iteration is not None
        else "the resumed checkpoint"
    )
    start = next((s for s in restore.starts if s.iteration == load.iteration), None)
    facts = ctx.window_facts
    window_text = ""
    in_flight_ref = None
    if facts is not None and facts.in_flight is not None:
        resaved = next(
            (
                e
                for log in ctx.run.cycle_logs
                if log.cycle >= restore.cycle
                for e in log.of_type(SaveCompleted)
                if e.iteration == facts.in_flight
            ),
            None,
        )
        window_text = (
            f"; not the save {facts.in_flight} in flight at the fault (window {facts.window}):"
            f" {in_flight_dir_text(facts, resaved)}"
        )
        in_flight_ref = facts.in_flight_dir.ref if facts.in_flight_dir is not None else None
    return passing(
        ID,
        f"cycle {restore.cycle} loaded checkpoint iteration {load.iteration}, {what}; {how}"
        f"{window_text}",
        start.ref if start else None,
        load.ref,
        [e.ref for e in reported[:8]],
        target.save.ref if target.save else None,
        meta.ref if meta is not None else None,
        in_flight_ref,
    )
