"""One side of a comparison: a ``report.json`` of any schema version we wrote, or run
directories judged on the fly (no pytest).

A report.json is untrusted input: it is read whole up to :data:`MAX_REPORT_BYTES`, must be UTF-8
JSON without ``NaN``/``Infinity``, of a schema version this pytest-nvrx reads (a newer one is
refused: its fields may mean something else), and every field the comparison reads is checked
for its type before anything is compared, and for agreeing with the rest of the document (a
scenario that passed and says elsewhere it did not, timings that contradict each other, a schema
its phases contradict). Whatever is wrong is one :class:`CompareInputError` line naming the side
and the place, never a traceback.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pytest_nvrx.evidence.refs import printable
from pytest_nvrx.evidence.rundir import RunDirError
from pytest_nvrx.evidence.timeline import Phase
from pytest_nvrx.layout import LAUNCHER_LOG_NAME, LOGS_DIR, MANIFEST_NAME, RESULT_NAME
from pytest_nvrx.report.main import build_reports
from pytest_nvrx.report.model import SCHEMA_VERSION, ScenarioReport
from pytest_nvrx.report.recovery import LostWork, MilestoneTime, Recovery
from pytest_nvrx.report.render import STACK_IDENTITY
from pytest_nvrx.report.timeline_data import CycleSpan, TimelineData, TimelineEvent

#: a report.json larger than this is refused unread (a 10-scenario report is about 200 KB)
MAX_REPORT_BYTES = 64 << 20

#: the oldest report.json schema this reads: 1 counted NVRx's GPU memory wait in ``termination``
OLDEST_SCHEMA = 1

#: the schema that split NVRx's GPU memory wait off ``termination``: every recovery of a document
#: of this schema or later lists this phase, and none of an earlier one does
RECLAIM_SCHEMA = 2
RECLAIM_PHASE = "gpu_reclaim"

#: the longest timing a report can hold (about 31 years): anything above is no run's measurement,
#: and keeps every difference and percentage of two timings a finite JSON number
MAX_SECONDS = 1e9


class CompareInputError(ValueError):
    """A side that cannot be compared: the message is one line that names it and why."""


@dataclass(frozen=True, slots=True)
class Side:
    """What one side holds: where it came from, its schema and its scenarios' reports."""

    label: str  # OLD | NEW
    source: str  # the path as given
    kind: str  # "report.json" | "run directories"
    schema_version: int  # a side judged on the fly: this version's
    #: the document's stack (None: the scenarios' stacks differ, or a side of run dirs)
    stack: Mapping[str, Any] | None
    scenarios: tuple[ScenarioReport, ...]
    #: the file's (device, inode), to tell the same file given twice
    identity: tuple[int, int] | None = None

    def stack_values(self, key: str) -> tuple[str, ...]:
        """The values of stack field ``key`` over the side (one where every scenario agrees)."""
        stacks = [self.stack] if self.stack else [s.stack for s in self.scenarios if s.stack]
        seen: list[str] = []
        for one in stacks:
            value = one.get(key, "not recorded")
            shown = "not installed" if value is None else str(value)
            if shown not in seen:
                seen.append(shown)
        return tuple(seen)


def load_side(path: Path, label: str) -> Side:
    """``path`` as a side: a file is a report.json; a directory is a run directory, or a folder
    of run directories (each judged as ``verify`` does)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise CompareInputError(f"{label} {path}: cannot be read ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        return _run_dirs_side(path, label)
    if not stat.S_ISREG(st.st_mode):
        raise CompareInputError(f"{label} {path}: not a report.json file or a directory")
    return _report_side(path, label, (st.st_dev, st.st_ino))


# ----------------------------------------------------------------------------------------------
# A directory of run directories


def is_run_dir(path: Path) -> bool:
    """A directory our launch (run.json, result.json) or ft_launcher's (its log) wrote."""
    names = (MANIFEST_NAME, RESULT_NAME, f"{LOGS_DIR}/{LAUNCHER_LOG_NAME}")
    return any((path / name).is_file() for name in names)


def _run_dirs_side(path: Path, label: str) -> Side:
    if is_run_dir(path):
        run_dirs = [path]
    else:
        try:
            entries = sorted(path.iterdir())
        except OSError as exc:
            raise CompareInputError(f"{label} {path}: cannot be listed ({exc.strerror})") from None
        run_dirs = [p for p in entries if p.is_dir() and is_run_dir(p)]
    if not run_dirs:
        raise CompareInputError(
            f"{label} {path}: no run directory in it (a run dir holds {MANIFEST_NAME} or "
            f"{LOGS_DIR}/{LAUNCHER_LOG_NAME}); give a report.json or a folder of run dirs"
        )
    try:
        reports = build_reports(run_dirs)
    except RunDirError as exc:
        raise CompareInputError(f"{label} {path}: {exc}") from None
    return Side(label, str(path), "run directories", SCHEMA_VERSION, None, tuple(reports))


# ----------------------------------------------------------------------------------------------
# A report.json


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _report_side(path: Path, label: str, identity: tuple[int, int]) -> Side:
    where = f"{label} {path}"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_REPORT_BYTES + 1)
    except OSError as exc:
        raise CompareInputError(f"{where}: cannot be read ({exc.strerror})") from None
    if len(raw) > MAX_REPORT_BYTES:
        raise CompareInputError(f"{where}: larger than {MAX_REPORT_BYTES >> 20} MiB: no report")
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise CompareInputError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise CompareInputError(f"{where}: JSON nested too deep to be a report") from None
    except ValueError as exc:  # json.JSONDecodeError, a 5000-digit integer, NaN
        why = "empty" if not raw.strip() else f"not JSON ({exc})"
        raise CompareInputError(
            printable(f"{where}: {why}; truncated or not a report.json")
        ) from None
    if not isinstance(doc, dict):
        raise CompareInputError(f"{where}: not a report.json (its top level is no object)")
    try:
        # a JSON escape can name half a UTF-16 pair (\ud800), which is no character: no
        # terminal or file could be given the text that holds it
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise CompareInputError(
            f"{where}: a text holds a lone surrogate escape (\\ud800-\\udfff), which is no "
            "character; not a report.json"
        ) from None
    except RecursionError:
        raise CompareInputError(f"{where}: JSON nested too deep to be a report") from None
    version = doc.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < OLDEST_SCHEMA:
        raise CompareInputError(
            f"{where}: no report.json schema_version (got {_shown(version)}); not a report of "
            "pytest-nvrx"
        )
    if version > SCHEMA_VERSION:
        raise CompareInputError(
            f"{where}: report.json schema {version} is newer than this pytest-nvrx reads (up "
            f"to {SCHEMA_VERSION}); compare with the pytest-nvrx that wrote it, or upgrade"
        )
    scenarios = doc.get("scenarios")
    if not isinstance(scenarios, list):
        raise CompareInputError(f"{where}: 'scenarios' is {_shown(scenarios)}, not a list")
    stack = doc.get("stack")
    if stack is not None and not isinstance(stack, dict):
        raise CompareInputError(f"{where}: 'stack' is {_shown(stack)}, not an object")
    reports = []
    for n, data in enumerate(scenarios, 1):
        at = f"{where}: scenario {n}"
        if not isinstance(data, dict):
            raise CompareInputError(f"{at} is {_shown(data)}, not an object")
        _check_lists(data, at)
        try:
            report = ScenarioReport.from_dict(_known_fields(data))
        except KeyError as exc:
            raise CompareInputError(f"{at} lacks the field {exc}") from None
        except (TypeError, ValueError, AttributeError, OverflowError, IndexError) as exc:
            # OverflowError: a 400-digit integer or 1e999 where a number is taken;
            # IndexError: a list shorter than the field's (an empty fault_window)
            raise CompareInputError(printable(f"{at} is not a report's scenario ({exc})")) from None
        _check_schema(report, version, at)
        check_scenario(report, at)
        _check_outcome(data, report, at)
        reports.append(report)
    _check_document_verdict(doc.get("passed"), reports, where)
    return Side(label, str(path), "report.json", version, stack, tuple(reports), identity)


def _check_schema(report: ScenarioReport, version: int, at: str) -> None:
    """The phases a recovery lists are the ones its schema wrote: a document relabelled to
    another schema would be compared by the other schema's meaning of termination."""
    for recovery in report.fault_recoveries:
        if not recovery.phases:
            continue
        has = any(p.id == RECLAIM_PHASE for p in recovery.phases)
        if version >= RECLAIM_SCHEMA and not has:
            raise CompareInputError(
                f"{at}: a recovery lacks the {RECLAIM_PHASE} phase every recovery of report.json "
                f"schema {RECLAIM_SCHEMA} lists, yet the document says schema {version}: it "
                "contradicts itself"
            )
        if version < RECLAIM_SCHEMA and has:
            raise CompareInputError(
                f"{at}: a recovery lists the {RECLAIM_PHASE} phase, which report.json schema "
                f"{version} never wrote, yet the document says schema {version}: it contradicts "
                "itself"
            )


def _check_outcome(data: dict[str, Any], report: ScenarioReport, at: str) -> None:
    """A scenario that says it passed and, elsewhere, that it did not is refused: the gate
    would otherwise read the one flag and count a failed run as QUALIFIED."""
    fatal = next((p for p in report.problems if p.startswith("fatal: ")), None)
    if report.judgeable and fatal is not None:
        raise CompareInputError(
            printable(
                f"{at}: 'judgeable' is true beside the problem {_shown(fatal)}: it "
                "contradicts itself"
            )
        )
    if not report.passed:
        return
    failing = next((c for c in report.criteria if c.status == "FAIL"), None)
    said = data.get("outcome")
    qualified = report.outcome  # QUALIFIED, or a planted run's line
    against = [
        (not report.judgeable, "'judgeable' is false"),
        (fatal is not None, f"the problem {_shown(fatal)}"),
        (failing is not None, f"criterion {_shown(failing.id if failing else None)} is FAIL"),
        (report.first_cause is not None, f"'first_cause' is {_shown(report.first_cause)}"),
        (report.gate is not None, f"'gate' is {_shown(report.gate)}"),
        (
            not report.summary.removeprefix(f"planted: {report.planted}: ").startswith("PASSED"),
            f"'summary' is {_shown(report.summary)}",
        ),
        (said is not None and said != qualified, f"'outcome' is {_shown(said)}"),
    ]
    why = next((text for contradicts, text in against if contradicts), None)
    if why is not None:
        raise CompareInputError(
            printable(f"{at}: 'passed' is true, yet {why}: the scenario contradicts itself")
        )


def _check_document_verdict(passed: Any, reports: Sequence[ScenarioReport], where: str) -> None:
    """The document's own ``passed`` (every scenario passed) agrees with its scenarios'."""
    if passed is None:
        return
    every = bool(reports) and all(r.passed for r in reports)
    if passed is not every:
        raise CompareInputError(
            f"{where}: the document's 'passed' is {_shown(passed)}, yet "
            + ("every scenario passed" if every else "not every scenario passed")
            + ": it contradicts itself"
        )


#: the scenario's fields that are lists when present (a string there would read as its letters)
_LISTS = ("schedule", "recoveries", "criteria", "problems", "gpu_shared_with")


def _check_lists(data: dict[str, Any], at: str) -> None:
    for key in _LISTS:
        value = data.get(key)
        if value is not None and not isinstance(value, list):
            raise CompareInputError(f"{at}: '{key}' is {_shown(value)}, not a list")


def _names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def _only(data: Any, cls: type) -> Any:
    """``data`` less the keys ``cls`` has no field for (anything else as it is: the reader
    refuses it)."""
    if not isinstance(data, dict):
        return data
    names = _names(cls)
    return {k: v for k, v in data.items() if k in names}


def _each(items: Any, cls: type) -> Any:
    return [_only(item, cls) for item in items] if isinstance(items, list) else items


def _recovery(data: Any) -> Any:
    data = _only(data, Recovery)
    if not isinstance(data, dict):
        return data
    return {
        **data,
        "milestones": _each(data.get("milestones"), MilestoneTime),
        "phases": _each(data.get("phases"), Phase),
        "lost_work": _only(data.get("lost_work"), LostWork),
    }


def _known_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The scenario without the nested fields this version does not know: a later pytest-nvrx
    adds fields without raising the schema (docs/report.md), and a reader ignores them."""
    out = dict(data)
    if isinstance(out.get("recovery"), dict):
        out["recovery"] = _recovery(out["recovery"])
    if isinstance(out.get("recoveries"), list):
        out["recoveries"] = [_recovery(r) for r in out["recoveries"]]
    timeline = _only(out.get("timeline"), TimelineData)
    if isinstance(timeline, dict):
        timeline["cycles"] = _each(timeline.get("cycles"), CycleSpan)
        timeline["events"] = _each(timeline.get("events"), TimelineEvent)
        out["timeline"] = timeline
    return out


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return printable(text if len(text) <= 40 else text[:37] + "...")


def _text(value: Any, field: str, at: str, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise CompareInputError(f"{at}: '{field}' is {_shown(value)}, not text")


def _seconds(value: Any, field: str, at: str) -> None:
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        # abs() before isfinite: an int of 400 digits is no float
        or not abs(value) <= MAX_SECONDS
        or not math.isfinite(value)
    ):
        raise CompareInputError(
            f"{at}: '{field}' is {_shown(value)}, not seconds (a finite number up to "
            f"{MAX_SECONDS:.0e})"
        )
    # a negative duration in a run that did not pass is the judgement's (its milestones out of
    # order: it cannot be judged), and the comparison reads it as no measurement
    # (diff.measured); in a run that passed it contradicts the verdict (check_scenario)


#: each timing is rounded to the millisecond: the slack each one adds to a sum of them
_ROUNDING_S = 0.001


def _check_recovery(recovery: Recovery, at: str, passed: bool) -> None:
    _seconds(recovery.downtime_s, "downtime_s", at)
    _seconds(recovery.unattributed_s, "unattributed_s", at)
    if recovery.position is not None and (
        isinstance(recovery.position, bool) or not isinstance(recovery.position, int)
    ):
        raise CompareInputError(f"{at}: 'position' is {_shown(recovery.position)}, not a number")
    _text(recovery.fault, "fault", at)
    _text(recovery.outcome, "outcome", at)
    seen: set[str] = set()
    for phase in recovery.phases:
        _text(phase.id, "phases.id", at, optional=False)
        _seconds(phase.seconds, f"phases.{phase.id}.seconds", at)
        if phase.id in seen:
            raise CompareInputError(
                printable(
                    f"{at}: a recovery lists the phase {_shown(phase.id)} twice: which one "
                    "was measured cannot be told"
                )
            )
        seen.add(phase.id)
    timed = [
        ("downtime_s", recovery.downtime_s),
        ("unattributed_s", recovery.unattributed_s),
        *((f"phases.{p.id}.seconds", p.seconds) for p in recovery.phases),
    ]
    negative = next(((f, v) for f, v in timed if v is not None and v < 0), None)
    if passed and negative is not None:
        raise CompareInputError(
            f"{at}: '{negative[0]}' is {negative[1]} s, negative, yet 'passed' is true (a "
            "negative timing is no measurement: the run cannot be judged): it contradicts itself"
        )
    parts = [recovery.unattributed_s, *(p.seconds for p in recovery.phases)]
    if recovery.downtime_s is not None and recovery.phases and None not in parts:
        # the known phases and the unattributed rest are the downtime (report/recovery.py)
        total = sum(v for v in parts if v is not None)
        if abs(total - recovery.downtime_s) > _ROUNDING_S * (len(parts) + 1):
            raise CompareInputError(
                f"{at}: a recovery's downtime_s is {recovery.downtime_s} s, but its phases and "
                f"unattributed_s add up to {total:.3f} s: it contradicts itself"
            )


def check_scenario(report: ScenarioReport, at: str) -> None:
    """Every field the comparison reads has its type, and its timings agree with each other
    (a document is untrusted input: a timing it states twice or that its parts contradict is
    no measurement to gate)."""
    _text(report.name, "name", at, optional=False)
    _text(report.workload, "workload", at)
    _text(report.fault, "fault", at, optional=False)
    _text(report.window, "window", at)
    for fault in report.schedule:
        _text(fault, "schedule", at, optional=False)
    for flag in ("passed", "judgeable"):
        if not isinstance(getattr(report, flag), bool):
            raise CompareInputError(f"{at}: '{flag}' is {_shown(getattr(report, flag))}, not bool")
    # what says why a scenario did not qualify (its outcome), read against 'passed'
    _text(report.summary, "summary", at, optional=False)
    _text(report.first_cause, "first_cause", at)
    _text(report.gate, "gate", at)
    for problem in report.problems:
        _text(problem, "problems", at, optional=False)
    for criterion in report.criteria:
        _text(criterion.id, "criteria.id", at, optional=False)
        _text(criterion.status, "criteria.status", at, optional=False)
        _text(criterion.reason, "criteria.reason", at, optional=False)
    for name in ("train_iters", "world_size"):
        it = getattr(report, name)
        if it is not None and (isinstance(it, bool) or not isinstance(it, int)):
            raise CompareInputError(f"{at}: '{name}' is {_shown(it)}, not an integer")
    for recovery in report.fault_recoveries:
        _check_recovery(recovery, at, report.passed)
    _seconds(report.total_downtime_s, "total_downtime_s", at)
    if report.passed and report.total_downtime_s is not None and report.total_downtime_s < 0:
        raise CompareInputError(
            f"{at}: 'total_downtime_s' is negative, yet 'passed' is true: it contradicts itself"
        )
    downtimes = [r.downtime_s for r in report.recoveries if r.downtime_s is not None]
    total_s = report.total_downtime_s
    if report.schedule and total_s is not None and downtimes:
        # a schedule's total is the union of its recoveries' down intervals
        # (evidence/segments.schedule_downtime_s): no shorter than the longest, no longer than
        # their sum
        slack = _ROUNDING_S * (len(downtimes) + 1)
        if not max(downtimes) - slack <= total_s <= sum(downtimes) + slack:
            raise CompareInputError(
                f"{at}: 'total_downtime_s' is {total_s} s, but its recoveries' downtimes are "
                f"{', '.join(f'{d}' for d in downtimes)} s: it contradicts itself"
            )
    if report.gpu_shared_with is not None:
        for other in report.gpu_shared_with:
            _text(other, "gpu_shared_with", at, optional=False)
    _text(report.planted, "planted", at)
    for cycle in report.timeline.cycles:
        if not isinstance(cycle.ranks, tuple):
            raise CompareInputError(f"{at}: a cycle's 'ranks' is not a list")


def identity_stack(side: Side) -> dict[str, tuple[str, ...]]:
    """The side's values of each field that identifies a stack (render.STACK_IDENTITY)."""
    return {key: side.stack_values(key) for key in STACK_IDENTITY}


def side_summary(sides: Sequence[Side]) -> str:
    return ", ".join(f"{s.label} {s.kind} (schema {s.schema_version})" for s in sides)
