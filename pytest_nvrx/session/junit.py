"""A scenario's run as JUnit properties: the text the plugin puts on its testcases (the run's
own on the scenario's first testcase, each criterion's verdict on its own). No pytest here: the
plugin attaches them (``record_property``-style, ``user_properties``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pytest_nvrx.criteria import Judgement
from pytest_nvrx.criteria.selftest_outcome import PlantOutcome
from pytest_nvrx.session.scenario_run import Limits, ScenarioRun


def property_text(value: Any) -> str | None:
    """A JUnit property's value as a person reads it: no Python reprs (``None`` leaves the
    property out, ``True`` is ``true``, a list is its items joined by `` | ``: XML readers turn
    a newline in an attribute into a space)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return " | ".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def properties(pairs: Sequence[tuple[str, Any]]) -> list[tuple[str, str]]:
    """(name, text) pairs; a dict value becomes one property per key, a None value none."""
    out: list[tuple[str, str]] = []
    for name, value in pairs:
        if isinstance(value, dict):
            out += properties([(f"{name}_{k}", v) for k, v in sorted(value.items())])
            continue
        text = property_text(value)
        if text is not None:
            out.append((name, text))
    return out


def run_properties(run: ScenarioRun, limits: Limits | None = None) -> list[tuple[str, str]]:
    """The run's own properties (its dir, its outcome and cause, the launcher's end, the stack,
    verify's timings), as text: the plugin puts them on the scenario's first testcase only. A
    planted self-test run's first is ``nvrx_planted``: it is never a qualification run. The
    outcome is the run's held to ``limits`` (criteria/outcome.py): the one the console and the
    report name."""
    outcome = run.outcome(limits)
    props: list[tuple[str, Any]] = [
        ("nvrx_planted", run.judgement.planted),  # None: left out
        ("nvrx_run_dir", str(run.layout.run_dir)),
        ("nvrx_outcome", outcome.text),
        ("nvrx_cause", outcome.reason),  # None (qualified): left out
    ]
    if run.result is not None:
        props += [
            ("nvrx_exit_code", run.result.exit_code),
            ("nvrx_wall_s", round(run.result.wall_s, 1)),
        ]
    props += [(f"nvrx_stack_{k}", v) for k, v in sorted(run.stack.items())]
    props += [(f"nvrx_timing_{k}", v) for k, v in sorted(run.judgement.timings.items())]
    props += recovery_properties(run.judgement)
    shared = run.judgement.gpu_shared_with
    if shared is not None:
        # the timings above were measured beside these runs on one GPU ("" alone)
        props.append(("nvrx_gpu_shared_with", ",".join(shared)))
    return properties(props)


def recovery_properties(judgement: Judgement) -> list[tuple[str, Any]]:
    """A fault schedule's every recovery (``nvrx_fault<k>_...``: its fault, how it ended, its
    downtime, verify's timings and the report's phases) and the schedule's total; none for a
    run of one fault (its timings are the run's)."""
    if not judgement.schedule:
        return []
    props: list[tuple[str, Any]] = [
        ("nvrx_schedule_downtime_s", judgement.total_downtime_s),
        ("nvrx_recoveries", judgement.recovery_count),
    ]
    for r in judgement.recoveries:
        head = f"nvrx_fault{r.position}"
        props += [
            (head, r.fault),
            (f"{head}_outcome", r.outcome),
            (f"{head}_note", r.note()),
            (f"{head}_downtime_s", r.downtime_s),
        ]
        props += [(f"{head}_timing_{k}", v) for k, v in sorted(r.timings().items())]
        props += [(f"{head}_phase_{p.id}_s", p.seconds) for p in r.phases]
    return props


def criterion_properties(run: ScenarioRun, criterion: str) -> list[tuple[str, str]]:
    """One criterion's testcase: its own verdict and the lines that prove it."""
    verdict = run.judgement.verdict(criterion)
    return properties(
        [
            ("nvrx_criterion", verdict.id),
            ("nvrx_status", verdict.status),
            ("nvrx_reason", verdict.reason),
            ("nvrx_evidence", [ref.render() for ref in verdict.evidence]),
        ]
    )


def selftest_properties(outcome: PlantOutcome) -> list[tuple[str, str]]:
    """A self-test run's testcases: its outcome (caught, missed, ...), what was expected of it
    (the criterion that must catch its plant; the control: qualified) and why."""
    expected = outcome.plant.caught_by if outcome.plant is not None else "qualified"
    return [
        ("nvrx_selftest_status", outcome.status),
        ("nvrx_selftest_expected", expected),
        ("nvrx_selftest_reason", outcome.reason),
    ]


def downtime_properties(run: ScenarioRun, limits: Limits) -> list[tuple[str, str]]:
    """The downtime test's testcase: the downtime measured and the limits it is held to. A
    schedule's downtime is its total; the limit holds each recovery's (listed after it)."""
    measured = [("nvrx_downtime_s", run.downtime_s)] + [
        (f"nvrx_fault{r.position}_downtime_s", r.downtime_s)
        for r in run.judgement.recoveries
        if r.due
    ]
    props = [
        (name, str(value))
        for name, value in [*measured, ("nvrx_max_downtime_s", limits.downtime_s)]
        if value is not None
    ]
    props += [(f"nvrx_max_phase_{phase}_s", str(limit)) for phase, limit in limits.phases.items()]
    return props
