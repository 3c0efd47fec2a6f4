"""6. training_continuity: the replacement reproduced the interrupted training.

The iterations between the restored checkpoint and the fault were computed twice, by the failed
cycle and by its replacement: a resume that brought back the weights, optimizer, scheduler, RNG
and data position prints the same values for them (bitwise on a deterministic stack). When an
uninterrupted run of the same configuration is at hand (the session's baseline scenario, or
``verify --baseline``), every iteration after the restore must also match it. How a workload's
lines relate to its iterations (Megatron prints losses as means over a logging window, and a
process's second line as the mean of its first two: Megatron-LM #6237) comes from the workload's
adapter (:meth:`print_model`); the comparison itself is :mod:`pytest_nvrx.evidence.replay`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_nvrx.criteria.context import JudgeContext
from pytest_nvrx.criteria.helpers import marker_ref
from pytest_nvrx.criteria.progress_past_restore import print_rule
from pytest_nvrx.criteria.required_evidence import (
    printed_by_rule,
    process_start,
    spans,
    trained_through,
    unprinted,
)
from pytest_nvrx.criteria.resume_settings import settings_of
from pytest_nvrx.criteria.verdict import (
    CriterionId,
    Verdict,
    failing,
    not_applicable,
    passing,
    unjudgeable,
)
from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.refs import EvidenceRef, absent
from pytest_nvrx.evidence.replay import (
    Comparison,
    Mismatch,
    Printed,
    PrintModel,
    compare,
    windows,
)
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.sequence import rank_of
from pytest_nvrx.evidence.timeline import logs_from
from pytest_nvrx.evidence.workload import IterationCommitted, LoadCompleted, get_adapter

CID: CriterionId = "training_continuity"


def print_model(run: RunEvidence) -> PrintModel:
    """The run's workload's print model, read from its own cycles (plain lines if the adapter
    does not say)."""
    try:
        adapter = get_adapter(run.workload)
    except KeyError:
        return PrintModel()
    method = getattr(adapter, "print_model", None)
    if method is None:
        return PrintModel()
    settings: dict[str, str] = {}
    for log in run.cycle_logs:
        for name, event in settings_of(log).items():
            settings.setdefault(name, event.value)
    model = method([log.iterations for log in run.cycle_logs], settings)
    return model if isinstance(model, PrintModel) else PrintModel()


def printed(logs: Sequence[CycleLog], model: PrintModel) -> list[Printed]:
    """Every kept iteration line of ``logs``, each cycle a process lifetime of its own."""
    out: list[Printed] = []
    for log in logs:
        out += windows(log.iterations, model, log.cycle)
    return out


Rank = int | None


def printed_by_rank(log: CycleLog, model: PrintModel) -> dict[Rank, list[Printed]]:
    """A cycle's kept iteration lines by the rank that printed them, each rank a process of its
    own (its windows its own)."""
    groups: dict[Rank, list[IterationCommitted]] = {}
    for event in log.iterations:
        groups.setdefault(rank_of(event), []).append(event)
    return {rank: windows(events, model, log.cycle) for rank, events in groups.items()}


@dataclass(frozen=True, slots=True)
class RankMismatch:
    """A value one rank printed that another rank's line of the same iteration contradicts."""

    mismatch: Mismatch
    candidate: str  # "cycle 1 rank 1"
    reference: str


def _who(cycle: int, rank: Rank) -> str:
    return f"cycle {cycle}" + (f" rank {rank}" if rank is not None else "")


def rank_mismatch(
    reference: CycleLog,
    candidate: CycleLog,
    model: PrintModel,
    rtol: float,
    *,
    up_to: int | None = None,
) -> RankMismatch | None:
    """The first value a rank of ``candidate`` prints (iterations up to ``up_to`` only) that a
    rank of ``reference`` printed otherwise, or that another rank of the same cycle did: every
    rank that prints an iteration prints the same training (a workload prints its values on one
    rank, reduced over the others; a second printing rank's line is compared all the same)."""
    ref_ranks = printed_by_rank(reference, model)
    cand_ranks = printed_by_rank(candidate, model)
    if len(ref_ranks) <= 1 and len(cand_ranks) <= 1:
        return None  # one printing rank: the comparison of the lines themselves says it all
    pairs: list[tuple[int, Rank, list[Printed], int, Rank, list[Printed]]] = []
    for rc, lines in cand_ranks.items():
        kept = [p for p in lines if up_to is None or p.iteration <= up_to]
        pairs += [
            (candidate.cycle, rc, kept, reference.cycle, rr, ref) for rr, ref in ref_ranks.items()
        ]
    for log, ranks in ((reference, ref_ranks), (candidate, cand_ranks)):
        ordered = sorted(ranks.items(), key=lambda item: -1 if item[0] is None else item[0])
        for i, (ra, a) in enumerate(ordered):
            pairs += [(log.cycle, rb, b, log.cycle, ra, a) for rb, b in ordered[i + 1 :]]
    for c_cycle, rc, lines, r_cycle, rr, ref in pairs:
        result = compare(ref, lines, model, rtol=rtol, keep=1)
        if result.mismatches:
            return RankMismatch(result.mismatches[0], _who(c_cycle, rc), _who(r_cycle, rr))
    return None


def _summary(result: Comparison, what: str, verb: str) -> str:
    text = f"{what} {result.span()} {verb}, {len(result.equal)}/{len(result.compared)} equal"
    if result.derived:
        means = ", ".join(
            f"{d.iteration} printed as the mean of {' and '.join(map(str, d.parts))}"
            for d in result.derived
        )
        text += f" ({means})"
    return text


def _tolerance(result: Sequence[Comparison], rtol: float) -> str:
    if rtol <= 0:
        return ""
    worst = max((r.max_relative for r in result), default=0.0)
    return f"; rtol {rtol:g} (largest relative difference admitted {worst:.3g})"


def check(ctx: JudgeContext) -> Verdict:
    run, timeline = ctx.run, ctx.timeline
    if ctx.expected.baseline:
        return not_applicable(
            CID,
            f"baseline run (fault=none, from {ctx.expected.source}) has no restore to replay",
            ctx.expected.ref,
        )
    failed, replacement = timeline.failed_cycle, timeline.replacement_cycle
    if failed is None or replacement is None:
        return failing(
            CID,
            "no replacement cycle: nothing resumed the training",
            marker_ref(run, "time"),
            [r.ref for r in run.cycles],
            ctx.launcher_outcome,
        )
    struck = failed  # the cycle the fault ended: the marker's facts are about it
    failed_log = run.cycle_log(failed)
    if failed_log is None or not failed_log.iterations:
        # a fault schedule's cycle struck while it loaded trained nothing: what the replacement
        # computes again was last computed by the newest earlier cycle that trained (issue #26)
        earlier = [g for g in run.cycle_logs if g.cycle < failed and g.iterations]
        if earlier:
            failed_log, failed = earlier[-1], earlier[-1].cycle
    replacement_log = run.cycle_log(replacement)
    if replacement_log is None or not replacement_log.iterations:
        name = replacement_log.file if replacement_log is not None else f"cycle {replacement}"
        last = replacement_log.last_line if replacement_log is not None else None
        return failing(
            CID,
            f"replacement cycle {replacement} committed no iteration: nothing shows the training"
            " continued",
            last or absent(name, "no iteration line"),
            ctx.launcher_outcome,
        )
    model = print_model(run)
    rtol = ctx.continuity_rtol
    reference = printed([failed_log], model) if failed_log is not None else []
    top = max((p.iteration for p in reference), default=None)
    candidate = printed([replacement_log], model)
    replayed = [p for p in candidate if top is not None and p.iteration <= top]
    replay = compare(reference, replayed, model, rtol=rtol)
    loads = replacement_log.of_type(LoadCompleted)
    restored = f"restored iteration {loads[0].iteration}" if loads else "no checkpoint load"
    cycles = f"cycle {replacement} vs cycle {failed}"
    comparisons = [replay]
    required = _required_lines(ctx, failed_log, replacement_log, struck, replay)
    if required is not None:
        return required
    blank = [p for p in replayed if p.iteration not in replay.compared]
    if blank:
        ref_line = next((r for r in reference if r.iteration == blank[0].iteration), None)
        return unjudgeable(
            CID,
            f"replayed iteration {blank[0].iteration} of cycle {replacement} prints no value"
            f" that can be compared with cycle {failed}'s line of it: the replay cannot be"
            " judged from it",
            blank[0].event.ref,
            ref_line.event.ref if ref_line is not None else None,
        )
    if replay.gaps:
        gap = replay.gaps[0]
        return unjudgeable(
            CID,
            f"{gap.describe(f'cycle {replacement}', f'cycle {failed}')}: the comparison needs it"
            " on both sides, so the replay cannot be judged from it",
            gap.printed_ref,
            gap.missing_refs,
        )
    if not replay.passed:
        bad = replay.mismatches[0]
        return failing(
            CID,
            f"replayed {bad.describe(f'cycle {replacement}', f'cycle {failed}')}"
            f"; after {restored}: {_summary(replay, 'iterations', 'replayed')}",
            bad.actual_ref,
            bad.expected_refs,
            loads[0].ref if loads else None,
        )
    if failed_log is not None:
        other = rank_mismatch(failed_log, replacement_log, model, rtol)
        if other is not None:
            bad = other.mismatch
            return failing(
                CID,
                f"{bad.describe(other.candidate, other.reference)}: the ranks that print one"
                f" iteration print one training; after {restored}",
                bad.actual_ref,
                bad.expected_refs,
                loads[0].ref if loads else None,
            )
    baseline_text = ""
    baseline_refs: list[EvidenceRef | None] = []
    if ctx.baseline is not None:
        base = ctx.baseline
        after = printed(logs_from(run, replacement), model)
        result = compare(printed(base.cycle_logs, model), after, model, rtol=rtol)
        comparisons.append(result)
        base_name = base.run_dir.name
        if result.gaps:
            gap = result.gaps[0]
            where = f"cycle {next(p.cycle for p in after if p.iteration == gap.iteration)}"
            ours, theirs = (
                (gap.missing_refs, [gap.printed_ref])
                if gap.missing_in_candidate
                else ((gap.printed_ref,), gap.missing_refs)
            )
            return unjudgeable(
                CID,
                f"{gap.describe(where, f'baseline {base_name}')}: the comparison needs it on"
                " both sides, so the run cannot be judged against the baseline from it",
                ours,
                [_in_baseline(ref, base_name) for ref in theirs],
            )
        if not result.passed:
            bad = result.mismatches[0]
            where = f"cycle {next(p.cycle for p in after if p.iteration == bad.iteration)}"
            return failing(
                CID,
                f"{bad.describe(where, f'baseline {base_name}')}"
                f"; after {restored}: {_summary(result, 'iterations', 'compared')}",
                bad.actual_ref,
                [_in_baseline(ref, base_name) for ref in bad.expected_refs],
                loads[0].ref if loads else None,
            )
        if not result.compared:
            return failing(
                CID,
                f"baseline {base_name} printed none of the iterations after the restore: it is"
                " not a run of the same configuration",
                [log.first_line for log in base.cycle_logs][:1] or absent(base_name),
                candidate[0].event.ref,
            )
        baseline_text = f"; baseline {base_name}: {_summary(result, 'iterations', 'compared')}"
        if result.not_comparable:
            baseline_text += f" ({len(result.not_comparable)} line(s) without a baseline match)"
        first_equal = result.equal[0]
        baseline_refs = [next(p.event.ref for p in after if p.iteration == first_equal)]
    if not replay.compared and ctx.baseline is None:
        # _required_lines found every line the run says was trained twice: none was
        last = reference[-1].event.ref if reference else None
        return unjudgeable(
            CID,
            f"the failed cycle {failed} committed no iteration that cycle {replacement} trained"
            f" again ({restored}, failed cycle printed up to {top if top is not None else 'none'})"
            ": nothing was computed twice, so no replay shows the resume reproduced the"
            " training; a baseline run of the same configuration would give a reference",
            last,
            candidate[0].event.ref,
        )
    replay_text = (
        _summary(replay, "iterations", "replayed") if replay.compared else "no iteration replayed"
    )
    names = ", ".join(n.replace("_", " ") for n in replay.names) or "nothing"
    proof = [p.event.ref for p in replayed if p.iteration in replay.compared][:1]
    proof += [
        p.event.ref for p in reference if replay.compared and p.iteration == replay.compared[0]
    ]
    return passing(
        CID,
        f"{cycles}: {replay_text} ({names}){baseline_text}{_tolerance(comparisons, rtol)};"
        f" {model.basis}",
        proof,
        baseline_refs,
        loads[0].ref if loads else None,
        candidate[0].event.ref,
    )


def _required_lines(
    ctx: JudgeContext,
    failed_log: CycleLog | None,
    replacement_log: CycleLog,
    struck: int,
    replay: Comparison,
) -> Verdict | None:
    """The lines the replay needs, derived from what the run says was trained (module
    criteria/required_evidence.py): the failed cycle's of every iteration it trained past the
    restore (unless a baseline is the reference), the replacement's of every one of them it
    trained again. A missing line is never "nothing to compare"."""
    run = ctx.run
    loads = replacement_log.of_type(LoadCompleted)
    restored = loads[0].iteration if loads else 0
    replacement = replacement_log.cycle
    f_start = process_start(failed_log) if failed_log is not None else 0
    low = max(restored, f_start)
    proof = (
        trained_through(run, failed_log, struck=failed_log.cycle == struck)
        if failed_log is not None
        else None
    )
    high = proof.iteration if proof is not None else low
    if failed_log is None or proof is None or high <= low:
        if ctx.baseline is not None or replay.compared:
            return None
        name = failed_log.file if failed_log is not None else f"cycle {struck}"
        said = f" ({proof.why}, {proof.ref.location})" if proof and proof.ref else ""
        return unjudgeable(
            CID,
            f"nothing in the run shows that cycle {failed_log.cycle if failed_log else struck}"
            f" trained past iteration {low}, the one cycle {replacement} restored{said}: nothing"
            " was computed twice, so no replay shows the resume reproduced the training; a"
            " baseline run of the same configuration would give a reference",
            proof.ref if proof is not None else None,
            failed_log.last_iteration.ref
            if failed_log is not None and failed_log.last_iteration is not None
            else absent(name, "no iteration line"),
            loads[0].ref if loads else None,
            replacement_log.first_iteration.ref if replacement_log.first_iteration else None,
        )
    failed = failed_log.cycle
    why = f"{proof.why} ({proof.ref.location})" if proof.ref is not None else proof.why
    if ctx.baseline is None:
        missing = unprinted(
            failed_log, printed_by_rule(print_rule(failed_log, run), f_start, low, high)
        )
        if missing:
            last = failed_log.last_iteration
            return unjudgeable(
                CID,
                f"cycle {failed} printed no line of iteration {spans(missing)}, although it"
                f" trained through {high}: {why}; cycle {replacement} trained"
                f" {low + 1}..{high} again after restoring {restored}, and without the failed"
                " cycle's lines that replay cannot be judged"
                + (f" (its last line is iteration {last.iteration})" if last else "")
                + "; a baseline run of the same configuration would give a reference",
                proof.ref,
                last.ref if last is not None else absent(failed_log.file, "no iteration line"),
                loads[0].ref if loads else None,
            )
    again = trained_through(run, replacement_log, struck=False)
    until = min(high, again.iteration) if again is not None else low
    rule = print_rule(replacement_log, run)
    wanted = printed_by_rule(rule, restored, low, until)
    missing = unprinted(replacement_log, wanted)
    if not missing:
        return None
    first = replacement_log.first_iteration
    if not replay.compared and first is not None and first.iteration != rule.first_after(restored):
        # its counter never passed through the replay: progress_past_restore fails that
        # sequence by the same rule, so the run is no pass; here nothing can be matched
        return not_applicable(
            CID,
            f"cycle {replacement} printed none of iterations {spans(wanted)} that cycle {failed}"
            f" trained ({why}): its first line is iteration {first.iteration} after restoring"
            f" {restored}, where the first after it is {rule.first_after(restored)}"
            " (progress_past_restore judges that sequence), so no replayed iteration can be"
            " matched",
            first.ref,
            loads[0].ref if loads else None,
            proof.ref,
        )
    assert again is not None  # wanted is empty without it
    trained = f"{again.why}, {again.ref.location}" if again.ref is not None else again.why
    return failing(
        CID,
        f"cycle {replacement} printed no line of iteration {spans(missing)}, although cycle"
        f" {failed} trained through {high} ({why}) and cycle {replacement} trained through"
        f" {again.iteration} after restoring {restored} ({trained}): what it computed again"
        " there is not in the log",
        again.ref,
        loads[0].ref if loads else None,
        proof.ref,
    )


def _in_baseline(ref: EvidenceRef, name: str) -> EvidenceRef:
    """A baseline line, its file named as in the baseline run (``<baseline>/logs/...``)."""
    return EvidenceRef(f"{name}/{ref.file}", ref.line, ref.text)
