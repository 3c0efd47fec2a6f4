"""Criterion 4: after the restore, training committed steps beyond it, completed a later
checkpoint and reached the final iteration. In a window run (issue #10) whose fault had a save N
in flight, that save is completed again after the restore (the rerun overwrites what the fault
left of ``iter_N/``)."""

from __future__ import annotations

import re

from pytest_nvrx.criteria.context import JudgeContext
from pytest_nvrx.criteria.expected import ExpectedFault
from pytest_nvrx.criteria.helpers import clock, marker_ref
from pytest_nvrx.criteria.resume_settings import settings_of
from pytest_nvrx.criteria.verdict import CriterionId, Verdict, failing, passing
from pytest_nvrx.criteria.workload_errors import died_loading, errors_before_training, load_death
from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.durability import (
    DurabilityBreak,
    end_of_run_break,
    reading_breaks,
    unfinalized_breaks,
)
from pytest_nvrx.evidence.launcher_log import LauncherEventKind
from pytest_nvrx.evidence.refs import EvidenceRef, is_ascii_number
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.sequence import PrintRule, sequence_breaks
from pytest_nvrx.evidence.timeline import logs_from
from pytest_nvrx.evidence.workload import (
    IterationCommitted,
    LoadCompleted,
    LoadStarted,
    SaveCompleted,
    SaveScheduled,
    SettingReported,
)

ID: CriterionId = "progress_past_restore"


def progress_past_restore(run: RunEvidence, expected: ExpectedFault | None = None) -> Verdict:
    """After the restore: steps beyond it, a later checkpoint completed, final iteration reached."""
    return check(JudgeContext.build(run, expected))


def check(ctx: JudgeContext) -> Verdict:
    run = ctx.run
    if ctx.expected.baseline:
        logs = logs_from(run, None)
        start_cycle = logs[0].cycle if logs else None
        first_log = run.cycle_log(start_cycle) if start_cycle is not None else None
    else:
        if ctx.timeline.replacement_cycle is None:
            return failing(
                ID,
                "no replacement cycle: nothing trained after a restore",
                marker_ref(run, "time"),
                ctx.launcher_outcome,
            )
        logs = logs_from(run, ctx.timeline.replacement_cycle)
        first_log = ctx.replacement_log
    broken = _sequence_broken(run) or _durability_broken(reading_breaks(run))
    if broken is not None:
        return broken
    loads = first_log.of_type(LoadCompleted) if first_log is not None else ()
    restored = loads[0].iteration if loads else 0
    restored_text = f"iteration {restored}" if loads else "a fresh start (no checkpoint loaded)"
    its = [log.max_iteration for log in logs if log.max_iteration is not None]
    top: IterationCommitted | None = max(its, key=lambda e: e.iteration, default=None)
    first = next((log.first_iteration for log in logs if log.first_iteration is not None), None)
    if top is None or top.iteration <= restored:
        died = (
            load_death(errors_before_training(first_log), first_log.of_type(LoadStarted))
            if first_log is not None and not loads
            else None
        )
        if died is not None and first_log is not None:
            # say why: the restore itself failed (criterion 3 has the details)
            target = None if ctx.expected.baseline else ctx.restore_target.iteration
            return failing(
                ID,
                "no iteration was committed after the restore: "
                + died_loading(run, first_log, died, target, code=False),
                died.ref,
                [e.ref for e in run.launcher.of_kind(LauncherEventKind.NO_PROGRESS)][:3],
                top.ref if top else None,
            )
        return failing(
            ID,
            f"no iteration beyond {restored_text} was committed after the restore",
            loads[0].ref if loads else None,
            top.ref if top else None,
            (first_log.last_line if first_log else None) or ctx.launcher_outcome,
        )
    later = [e for log in logs for e in log.of_type(SaveCompleted) if e.iteration > restored]
    if not later:
        scheduled = [
            e for log in logs for e in log.of_type(SaveScheduled) if e.iteration > restored
        ]
        return failing(
            ID,
            f"no checkpoint beyond {restored_text} completed after the restore"
            + (" (saves were scheduled but never finalized)" if scheduled else ""),
            [e.ref for e in scheduled[:2]],
            top.ref,
        )
    if ctx.cut_short:
        # a schedule's recovery that the next fault ended: its progress, not the run's end
        return passing(
            ID,
            f"after {restored_text}, committed iterations {first.iteration if first else '?'}"
            f"..{top.iteration} and completed checkpoint {later[0].iteration} at"
            f" {clock(later[0].time)} before the next fault ended the cycle",
            first.ref if first else None,
            later[0].ref,
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
        return failing(ID, "the final iteration is unknown (no run.json, no N/M)", top.ref)
    if top.iteration < final:
        return failing(
            ID,
            f"training stopped at iteration {top.iteration}, before the final iteration {final}"
            f" (from {source})",
            top.ref,
            final_ref,
            later[-1].ref,
        )
    backwards = _tracker_went_backwards(ctx, restored, loads[0].ref if loads else None)
    if backwards is not None:
        return backwards
    end = end_of_run_break(run)
    undurable = _durability_broken([end] if end is not None else [])
    if undurable is not None:
        return undurable
    resaved_text = ""
    resaved_ref: EvidenceRef | None = None
    facts = None if ctx.expected.baseline else ctx.window_facts
    if facts is not None and facts.in_flight is not None:
        n = facts.in_flight
        again = [e for log in logs for e in log.of_type(SaveCompleted) if e.iteration == n]
        if not again:
            marker = run.marker
            return failing(
                ID,
                f"the save of iteration {n}, in flight at the fault (window {facts.window}), was"
                f" never completed after the restore of {restored_text}",
                marker.ref("in_flight_iteration") if marker is not None else None,
                top.ref,
                later[-1].ref,
            )
        resaved_text = (
            f", the in-flight checkpoint {n} saved again at {clock(again[0].time)}"
            f" (cycle {_cycle_of(logs, again[0])})"
        )
        resaved_ref = again[0].ref
    # after the in-flight save's own check: its loss is said as the fault's
    lost = _durability_broken(unfinalized_breaks(run))
    if lost is not None:
        return lost
    tracker = run.tracker
    tracker_ref = (
        tracker.ref
        if tracker.iteration is not None and tracker.iteration > restored and tracker.ref
        else None
    )
    return passing(
        ID,
        f"after {restored_text}, committed iterations {first.iteration if first else '?'}"
        f"..{top.iteration}, checkpoint {later[0].iteration} completed at {clock(later[0].time)},"
        f" final iteration {final} (from {source}) reached{resaved_text}",
        first.ref if first else None,
        later[0].ref,
        top.ref,
        later[-1].ref if later[-1] is not later[0] else None,
        final_ref if final_ref is not top.ref else None,
        tracker_ref,
        resaved_ref,
    )


def print_rule(log: CycleLog, run: RunEvidence | None = None) -> PrintRule:
    """How the cycle's process prints its iterations, from its startup settings (Megatron's
    ``log_interval`` and ``iterations_to_skip``; every iteration where it prints none), and what
    each line must count: the run's iterations (run.json, else the cycle's ``train_iters``) and,
    with a fixed batch, its consumed samples (``global_batch_size`` without ``rampup_batch_size``,
    else the run's first iteration line)."""
    settings = settings_of(log)
    interval_event = settings.get("log_interval")
    interval_text = interval_event.value if interval_event is not None else "1"
    interval = (
        int(interval_text) if is_ascii_number(interval_text) and int(interval_text) > 0 else 1
    )
    skip_event = settings.get("iterations_to_skip")
    skipped = (
        frozenset(int(n) for n in re.findall(r"\d+", skip_event.value, re.ASCII))
        if skip_event is not None
        else frozenset()
    )
    basis = "a line at every iteration" if interval == 1 else f"a line every {interval} iterations"
    if skipped:
        basis += f", none for the iterations to skip {sorted(skipped)}"
    iters, iters_source = _train_iters(run, settings)
    per, per_source = _samples_per_iteration(run, settings)
    return PrintRule(interval, skipped, basis, iters, iters_source, per, per_source)


def _positive(text: str | None) -> int | None:
    if text is None or not (text.isascii() and text.isdigit()):
        return None
    return int(text) if int(text) > 0 else None


def _train_iters(
    run: RunEvidence | None, settings: dict[str, SettingReported]
) -> tuple[int | None, str]:
    manifest = run.manifest if run is not None else None
    if manifest is not None and manifest.train_iters is not None:
        value = manifest.train_iters.value
        if isinstance(value, int) and not isinstance(value, bool):
            return value, "run.json"
    told = settings.get("train_iters")
    value = _positive(told.value) if told is not None else None
    return (value, f"train_iters at {told.ref.location}") if told is not None else (None, "")


def _samples_per_iteration(
    run: RunEvidence | None, settings: dict[str, SettingReported]
) -> tuple[int | None, str]:
    ramp = settings.get("rampup_batch_size")
    if ramp is not None and ramp.value != "None":
        return None, ""
    batch = settings.get("global_batch_size")
    value = _positive(batch.value) if batch is not None else None
    if batch is not None and value is not None:
        return value, f"global_batch_size at {batch.ref.location}"
    logs = run.cycle_logs if run is not None else ()
    first = next((log.iterations[0] for log in logs if log.iterations), None)
    if first is None or not first.consumed_samples or first.iteration <= 0:
        return None, ""
    if first.consumed_samples % first.iteration:
        return None, ""
    per = first.consumed_samples // first.iteration
    return per, f"the run's first iteration line, {first.ref.location}"


def _sequence_broken(run: RunEvidence) -> Verdict | None:
    """Every cycle trained step by step from where it started: its printed iterations begin
    right after the iteration it restored (1 after a fresh start), follow one another by the
    print rule, never repeat and never go back (pytest_nvrx.evidence.sequence)."""
    for log in run.cycle_logs:
        loads = log.of_type(LoadCompleted)
        restored = loads[0].iteration if loads else None
        rule = print_rule(log, run)
        told = settings_of(log).get("train_iters")
        if (
            told is not None
            and rule.train_iters is not None
            and _positive(told.value) != rule.train_iters
        ):
            manifest = run.manifest
            return failing(
                ID,
                f"cycle {log.cycle} was started to train {told.value} iterations, but the run"
                f" trains {rule.train_iters} ({rule.train_iters_source})",
                told.ref,
                manifest.train_iters.ref if manifest is not None and manifest.train_iters else None,
            )
        breaks = sequence_breaks(log, restored, rule)
        if breaks:
            first = breaks[0]
            return failing(
                ID,
                f"the iteration sequence is broken: {first.text}",
                first.refs,
                loads[0].ref if loads else None,
            )
    return None


def _durability_broken(breaks: list[DurabilityBreak]) -> Verdict | None:
    """The tracker named only finalized checkpoints (pytest_nvrx.evidence.durability): its
    readings in every cycle, checked first, and its value at the end, checked last."""
    if not breaks:
        return None
    first = breaks[0]
    more = f" ({len(breaks) - 1} more reading(s) like it)" if len(breaks) > 1 else ""
    return failing(ID, f"durability order broken: {first.text}{more}", first.refs)


def _cycle_of(logs: list[CycleLog], event: SaveCompleted) -> int | None:
    return next((log.cycle for log in logs if event in log.of_type(SaveCompleted)), None)


def _tracker_went_backwards(
    ctx: JudgeContext, restored: int, restored_ref: EvidenceRef | None
) -> Verdict | None:
    """The tracker only moves forward: at the end it holds at least the restored iteration, the
    marker's tracker reading and the newest checkpoint the logs report finalized."""
    run = ctx.run
    tracker = run.tracker
    if tracker.iteration is None or tracker.ref is None:
        return None  # absent, release or unreadable: nothing to compare
    marker = run.marker
    readings: list[tuple[str, EvidenceRef | None]] = []
    if restored > tracker.iteration:
        readings.append((f"iteration {restored} was restored", restored_ref))
    if (
        not ctx.expected.baseline
        and marker is not None
        and marker.ok
        and marker.tracker_iteration is not None
        and marker.tracker_iteration > tracker.iteration
    ):
        readings.append(
            (f"the marker read {marker.tracker_iteration}", marker.ref("tracker_iteration"))
        )
    newest = max(
        (e for log in run.cycle_logs for e in log.of_type(SaveCompleted)),
        key=lambda e: e.iteration,
        default=None,
    )
    if newest is not None and newest.iteration > tracker.iteration:
        readings.append(
            (
                f"checkpoint {newest.iteration} was finalized at {clock(newest.time)}",
                newest.ref,
            )
        )
    if not readings:
        return None
    return failing(
        ID,
        f"the checkpoint tracker went backwards: {tracker.file} holds {tracker.iteration} at the"
        f" end, although {' and '.join(text for text, _ in readings)}",
        tracker.ref,
        [ref for _, ref in readings],
    )
