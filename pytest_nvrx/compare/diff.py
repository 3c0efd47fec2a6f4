"""Two sides compared: the stacks, each scenario matched by its key, verdicts and timings old
-> new, what the gate fails, and what is noise (no pytest, nothing written).

A scenario is matched by its key (workload, its fault or fault schedule with the window, train
iterations, ranks launched), never by its name: a run dir's name carries the time it ran. Several
scenarios of one key on one side are samples of it: the side's timing is their median and its
verdict QUALIFIED only when every sample qualified. A timing is *noise* when a sample of either
side ran on a GPU it shared with another run (result.json's ``gpu_shared_with``: its recovery
waited for their memory too) or a side has fewer samples than ``min_samples``; noise is shown,
and gated only when asked (``gate_noise``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from pytest_nvrx.compare.side import Side, identity_stack
from pytest_nvrx.layout import PHASE_IDS
from pytest_nvrx.report.model import ScenarioReport
from pytest_nvrx.report.recovery import Recovery
from pytest_nvrx.settings.compare_gate import GateRule

#: phases whose meaning changed with report.json schema 2 (NVRx's GPU memory wait moved from
#: ``termination`` to its own ``gpu_reclaim``): not compared across that change
SCHEMA2_PHASES = frozenset({"termination", "gpu_reclaim"})

_PHASE_ORDER = {p: n for n, p in enumerate(PHASE_IDS)}

#: stack fields shown when they differ, though they do not identify a stack
SHOWN_STACK_EXTRA = ("megatron_describe",)


class Incomparable(ValueError):
    """The sides cannot be compared (different workloads, no scenario in common): one line."""


@dataclass(frozen=True, slots=True, order=True)
class ScenarioKey:
    workload: str
    fault: str  # "kill (step)", a schedule's "kill@step, kill@restore", "none"
    train_iters: int | None
    ranks: int | None

    def __str__(self) -> str:
        shape = [f"{self.train_iters} iterations"] if self.train_iters is not None else []
        if self.ranks is not None:
            shape.append(f"{self.ranks} rank" + ("" if self.ranks == 1 else "s"))
        return f"{self.workload} {self.fault}" + (f" [{', '.join(shape)}]" if shape else "")


def scenario_key(report: ScenarioReport) -> ScenarioKey:
    """The ranks are the world size run.json says the run launched; a document that does not
    record it (written before it did) gives the most ranks a cycle shows: a rank that printed
    nothing is still one of the scenario's, or a run that lost it would be another scenario."""
    shown = max((len(c.ranks) for c in report.timeline.cycles), default=0)
    ranks = report.world_size if report.world_size is not None else shown
    return ScenarioKey(
        report.workload or "unknown workload",
        report.fault_text,
        report.train_iters,
        ranks or None,
    )


@dataclass(frozen=True, slots=True)
class StackChange:
    field: str
    old: str
    new: str

    def __str__(self) -> str:
        return f"{self.field} {self.old} → {self.new}"


@dataclass(frozen=True, slots=True)
class TimingDiff:
    """One timing of a scenario old -> new: its downtime, or one recovery's downtime or phase."""

    what: str  # "downtime" or a phase id
    recovery: str | None  # None: the scenario's; "recovery 2 (kill@restore)" of a schedule
    old: float | None
    new: float | None
    #: why this timing is not compared (phases whose meaning changed between schemas)
    incomparable: str | None = None
    #: a schedule's recovery: its fault's position (None: the scenario's, a one-fault run's)
    position: int | None = None

    @property
    def label(self) -> str:
        return self.what if self.recovery is None else f"{self.recovery}: {self.what}"

    @property
    def delta(self) -> float | None:
        if self.old is None or self.new is None or self.incomparable:
            return None
        return round(self.new - self.old, 3)

    @property
    def percent(self) -> float | None:
        delta = self.delta
        if delta is None or self.old is None or self.old <= 0:
            return None
        return delta / self.old * 100

    @property
    def changed(self) -> bool:
        if self.incomparable:
            return False
        if (self.old is None) != (self.new is None):
            return True
        return self.delta is not None and abs(self.delta) >= 0.001


@dataclass(frozen=True, slots=True)
class GateFailure:
    scenario: ScenarioKey
    rule: str
    text: str

    def __str__(self) -> str:
        return f"{self.scenario}: {self.rule}: {self.text}"


@dataclass(frozen=True, slots=True)
class ScenarioDiff:
    key: ScenarioKey
    old: tuple[ScenarioReport, ...]
    new: tuple[ScenarioReport, ...]
    timings: tuple[TimingDiff, ...]
    noise: tuple[str, ...]
    failures: tuple[GateFailure, ...] = ()
    #: rules that held back on noise: what they would have failed
    not_gated: tuple[str, ...] = ()
    #: a schedule's recoveries that ended otherwise ("recovery 2 (kill@restore): struck →
    #: recovered")
    recovery_changes: tuple[str, ...] = ()

    @property
    def old_qualified(self) -> bool:
        return qualified(self.old)

    @property
    def new_qualified(self) -> bool:
        return qualified(self.new)

    @property
    def old_outcome(self) -> str:
        return outcome(self.old)

    @property
    def new_outcome(self) -> str:
        return outcome(self.new)

    @property
    def verdict_change(self) -> str | None:
        """``regression`` (qualified -> not), ``improvement`` (not -> qualified), or None."""
        if self.old_qualified == self.new_qualified:
            return None
        return "improvement" if self.new_qualified else "regression"

    @property
    def downtime(self) -> TimingDiff | None:
        return next((t for t in self.timings if t.what == "downtime" and t.recovery is None), None)

    @property
    def status(self) -> str:
        """regression, improvement, slower, faster, changed or unchanged: the closing line's."""
        if self.verdict_change is not None:
            return self.verdict_change
        if self.failures:
            return "regression"
        down = self.downtime
        if down is not None and down.delta is not None and abs(down.delta) >= 0.001:
            return "slower" if down.delta > 0 else "faster"
        if (
            any(t.changed for t in self.timings)
            or self.recovery_changes
            or self.old_outcome != self.new_outcome
        ):
            return "changed"
        return "unchanged"


@dataclass(frozen=True, slots=True)
class Comparison:
    old: Side
    new: Side
    stack_changes: tuple[StackChange, ...]
    scenarios: tuple[ScenarioDiff, ...]
    only_old: tuple[ScenarioKey, ...]
    only_new: tuple[ScenarioKey, ...]
    rules: tuple[GateRule, ...]
    min_samples: int
    gate_noise: bool
    notes: tuple[str, ...] = field(default=())
    #: the ``missing`` rule's: each scenario of OLD that NEW lacks
    missing: tuple[GateFailure, ...] = ()

    @property
    def failures(self) -> tuple[GateFailure, ...]:
        return tuple(f for s in self.scenarios for f in s.failures) + self.missing

    @property
    def gate_failed(self) -> bool:
        return bool(self.failures)

    def count(self, status: str) -> int:
        return sum(s.status == status for s in self.scenarios)

    @property
    def changes(self) -> int:
        """Scenarios that differ in any way, and scenarios on one side only."""
        differing = sum(s.status != "unchanged" for s in self.scenarios)
        return differing + len(self.only_old) + len(self.only_new)

    def closing_line(self) -> str:
        counts = [
            f"{self.count(s)} {s if self.count(s) == 1 else plural(s)}"
            for s in ("regression", "improvement", "slower", "faster", "changed")
        ]
        line = (
            f"{', '.join(counts)}, {self.count('unchanged')} unchanged; "
            f"{len(self.only_old)} only in OLD, {len(self.only_new)} only in NEW"
        )
        if not self.rules:
            return line + "; no gate"
        gate = "FAILS" if self.gate_failed else "passes"
        return f"{line}; gate {', '.join(str(r) for r in self.rules)} {gate}"


def plural(status: str) -> str:
    return {"regression": "regressions", "improvement": "improvements"}.get(status, status)


def qualified(reports: Sequence[ScenarioReport]) -> bool:
    """Every sample qualified (a planted self-test run never qualifies)."""
    return bool(reports) and all(r.passed and r.planted is None for r in reports)


def outcome(reports: Sequence[ScenarioReport]) -> str:
    """The first sample that did not qualify says why; else QUALIFIED."""
    failing = next((r for r in reports if not (r.passed and r.planted is None)), None)
    return failing.outcome if failing is not None else "QUALIFIED"


def _median(values: Sequence[float | None]) -> float | None:
    """The samples' median; None when any sample lacks the timing (absence is not evidence)."""
    if not values or any(v is None for v in values):
        return None
    return round(statistics.median(v for v in values if v is not None), 3)


def _recovery_label(recovery: Recovery, index: int) -> str | None:
    if not recovery.scheduled:
        return None
    fault = f" ({recovery.fault})" if recovery.fault else ""
    return f"recovery {recovery.position if recovery.position is not None else index + 1}{fault}"


def measured(seconds: float | None) -> float | None:
    """A timing as a measurement: a negative one is none (its milestones out of order: the
    judgement could not judge that run; side.check_scenario refuses one in a run that passed)."""
    return seconds if seconds is not None and seconds >= 0 else None


def _phase_seconds(recovery: Recovery | None, phase: str) -> float | None:
    if recovery is None:
        return None
    # side.check_scenario refuses a phase listed twice: there is one to find
    return measured(next((p.seconds for p in recovery.phases if p.id == phase), None))


def _timings(
    key_old: Sequence[ScenarioReport],
    key_new: Sequence[ScenarioReport],
    cross_schema: bool,
) -> tuple[TimingDiff, ...]:
    out = [
        TimingDiff(
            "downtime",
            None,
            _median([measured(r.downtime_s) for r in key_old]),
            _median([measured(r.downtime_s) for r in key_new]),
        )
    ]
    count = max(
        max((len(r.fault_recoveries) for r in key_old), default=0),
        max((len(r.fault_recoveries) for r in key_new), default=0),
    )
    for i in range(count):

        def nth(reports: Sequence[ScenarioReport], i: int = i) -> list[Recovery | None]:
            return [r.fault_recoveries[i] if i < len(r.fault_recoveries) else None for r in reports]

        olds, news = nth(key_old), nth(key_new)
        shown = next((r for r in (*olds, *news) if r is not None), None)
        label = _recovery_label(shown, i) if shown is not None else None
        position = i + 1 if label is not None else None
        if label is not None:  # a schedule's recovery: its own downtime too
            out.append(
                TimingDiff(
                    "downtime",
                    label,
                    _median([measured(r.downtime_s) if r else None for r in olds]),
                    _median([measured(r.downtime_s) if r else None for r in news]),
                    position=position,
                )
            )
        phases = {p.id for r in (*olds, *news) if r is not None for p in r.phases}
        for phase in sorted(phases, key=lambda p: (_PHASE_ORDER.get(p, len(_PHASE_ORDER)), p)):
            why = None
            if cross_schema and phase in SCHEMA2_PHASES:
                why = "report.json schema 1 counted NVRx's GPU memory wait in termination"
            out.append(
                TimingDiff(
                    phase,
                    label,
                    _median([_phase_seconds(r, phase) for r in olds]),
                    _median([_phase_seconds(r, phase) for r in news]),
                    why,
                    position,
                )
            )
    return tuple(out)


def _recovery_changes(
    old: Sequence[ScenarioReport], new: Sequence[ScenarioReport]
) -> tuple[str, ...]:
    """How each of a schedule's recoveries ended, where the sides' first samples differ."""
    a, b = old[0].fault_recoveries, new[0].fault_recoveries
    out = []
    for i in range(max(len(a), len(b))):
        ra, rb = (a[i] if i < len(a) else None), (b[i] if i < len(b) else None)
        ea = ra.outcome if ra is not None else "absent"
        eb = rb.outcome if rb is not None else "absent"
        shown = ra or rb
        if ea != eb and shown is not None:
            out.append(f"{_recovery_label(shown, i) or 'recovery'}: {ea} → {eb}")
    return tuple(out)


def _noise(
    old: Sequence[ScenarioReport], new: Sequence[ScenarioReport], min_samples: int
) -> tuple[str, ...]:
    out = []
    for label, reports in (("OLD", old), ("NEW", new)):
        shared = sorted({o for r in reports for o in (r.gpu_shared_with or ())})
        if shared:
            out.append(
                f"{label} ran on a GPU shared with {len(shared)} other run"
                + ("" if len(shared) == 1 else "s")
                + " (result.json gpu_shared_with): its timings include theirs"
            )
        if len(reports) < min_samples:
            out.append(f"{label} has {len(reports)} sample(s), fewer than {min_samples}")
    return tuple(out)


def _gate(
    key: ScenarioKey,
    old: Sequence[ScenarioReport],
    new: Sequence[ScenarioReport],
    timings: Sequence[TimingDiff],
    noise: Sequence[str],
    rules: Sequence[GateRule],
    gate_noise: bool,
) -> tuple[tuple[GateFailure, ...], tuple[str, ...]]:
    failures: list[GateFailure] = []
    held: list[str] = []
    for rule in rules:
        if rule.what == "missing":
            continue  # the comparison's: scenarios on OLD only
        if rule.limit is None:
            if qualified(old) and not qualified(new):
                failures.append(GateFailure(key, str(rule), f"QUALIFIED → {outcome(new)}"))
            continue
        for t in timings:
            if t.what != rule.what or t.incomparable or t.old is None:
                continue  # nothing on OLD to hold it to
            if t.new is None:
                why = f"{t.label} {t.old:.3f} s on OLD, not measured on NEW"
            elif rule.limit.exceeded(t.old, t.new):
                pct = f", {t.percent:+.1f}%" if t.percent is not None else ""
                why = (
                    f"{t.label} {t.old:.3f} s → {t.new:.3f} s "
                    f"({t.new - t.old:+.3f} s{pct}), over {rule.limit}"
                )
            else:
                continue
            if noise and not gate_noise:
                held.append(f"{rule}: {why} (noise, not gated)")
            else:
                failures.append(GateFailure(key, str(rule), why))
    return tuple(failures), tuple(held)


def _by_key(side: Side) -> dict[ScenarioKey, list[ScenarioReport]]:
    out: dict[ScenarioKey, list[ScenarioReport]] = {}
    for report in side.scenarios:
        out.setdefault(scenario_key(report), []).append(report)
    return out


def _compatible(a: ScenarioKey, b: ScenarioKey) -> bool:
    """Keys of one scenario where a side could not show part of it (a run that never started a
    cycle shows no ranks): the rest equal, the unknown part taken as either."""
    return (
        a.workload == b.workload
        and a.fault == b.fault
        and (a.train_iters is None or b.train_iters is None or a.train_iters == b.train_iters)
        and (a.ranks is None or b.ranks is None or a.ranks == b.ranks)
    )


def _pair_partial_keys(
    a: dict[ScenarioKey, list[ScenarioReport]], b: dict[ScenarioKey, list[ScenarioReport]]
) -> list[str]:
    """Match, in place, each key one side shows only in part with the one key of the other side
    it can be (filed under OLD's key): a NEW run that broke before its first cycle is the
    scenario it was, its verdict compared and gated, not a scenario "only in NEW".

    NEW's unmatched keys are indexed by their known parts, so that each OLD key looks up its
    candidates instead of scanning every NEW key: the work is linear in the keys."""
    unmatched = [kb for kb in b if kb not in a]
    #: the unmatched NEW keys by (workload, fault) and a part: the exact key, its train
    #: iterations (any ranks), its ranks (any train iterations), neither
    exact: dict[tuple[object, ...], set[ScenarioKey]] = {}
    by_iters: dict[tuple[object, ...], set[ScenarioKey]] = {}
    by_ranks: dict[tuple[object, ...], set[ScenarioKey]] = {}
    by_kind: dict[tuple[object, ...], set[ScenarioKey]] = {}

    def buckets(k: ScenarioKey) -> list[set[ScenarioKey]]:
        kind = (k.workload, k.fault)
        return [
            exact.setdefault((*kind, k.train_iters, k.ranks), set()),
            by_iters.setdefault((*kind, k.train_iters), set()),
            by_ranks.setdefault((*kind, k.ranks), set()),
            by_kind.setdefault(kind, set()),
        ]

    for kb in unmatched:
        for bucket in buckets(kb):
            bucket.add(kb)

    def candidates(ka: ScenarioKey) -> list[set[ScenarioKey]]:
        kind = (ka.workload, ka.fault)
        it, rk = ka.train_iters, ka.ranks
        if it is None and rk is None:
            return [by_kind.get(kind, set())]
        if it is None:  # any train iterations, ranks equal or unknown
            return [by_ranks.get((*kind, rk), set()), by_ranks.get((*kind, None), set())]
        if rk is None:  # any ranks, train iterations equal or unknown
            return [by_iters.get((*kind, it), set()), by_iters.get((*kind, None), set())]
        return [  # both known: the NEW key lacks one part or both (an equal key is in common)
            exact.get((*kind, it, rk), set()),
            exact.get((*kind, None, rk), set()),
            exact.get((*kind, it, None), set()),
            exact.get((*kind, None, None), set()),
        ]

    notes = []
    for ka in [k for k in a if k not in b]:
        found = [s for s in candidates(ka) if s]
        if sum(len(s) for s in found) != 1:
            continue
        [kb] = found[0]
        if not _compatible(ka, kb):  # the index holds only keys that are
            continue
        for bucket in buckets(kb):
            bucket.discard(kb)
        b[ka] = b.pop(kb)
        notes.append(f"matched OLD {ka} with NEW {kb} (one side does not show all of the key)")
    return notes


def stack_changes(old: Side, new: Side) -> tuple[StackChange, ...]:
    """Each identifying stack field (and the Megatron tag) whose values differ, old -> new."""
    a, b = identity_stack(old), identity_stack(new)
    for extra in SHOWN_STACK_EXTRA:
        a[extra], b[extra] = old.stack_values(extra), new.stack_values(extra)
    out = []
    for key in a:
        if a[key] != b[key] and (a[key] or b[key]):
            out.append(StackChange(key, " / ".join(a[key]) or "—", " / ".join(b[key]) or "—"))
    return tuple(out)


def compare(
    old: Side,
    new: Side,
    rules: Sequence[GateRule] = (),
    *,
    min_samples: int = 1,
    gate_noise: bool = False,
) -> Comparison:
    """``old`` against ``new``. Raises :class:`Incomparable` when no scenario is in common."""
    for side in (old, new):
        if not side.scenarios:
            raise Incomparable(f"{side.label} {side.source} has no scenario")
    a, b = _by_key(old), _by_key(new)
    paired = _pair_partial_keys(a, b)
    common = [k for k in a if k in b]
    if not common:
        wa = sorted({k.workload for k in a})
        wb = sorted({k.workload for k in b})
        if not set(wa) & set(wb):
            raise Incomparable(
                f"different workloads: OLD ran {', '.join(wa)}, NEW ran {', '.join(wb)}"
            )
        raise Incomparable(
            f"no scenario in common: OLD has {', '.join(str(k) for k in sorted(a))}; "
            f"NEW has {', '.join(str(k) for k in sorted(b))}"
        )
    cross = (old.schema_version < 2) != (new.schema_version < 2)
    diffs = []
    for key in common:
        timings = _timings(a[key], b[key], cross)
        noise = _noise(a[key], b[key], min_samples)
        failures, held = _gate(key, a[key], b[key], timings, noise, rules, gate_noise)
        diffs.append(
            ScenarioDiff(
                key,
                tuple(a[key]),
                tuple(b[key]),
                timings,
                noise,
                failures,
                held,
                _recovery_changes(a[key], b[key]),
            )
        )
    notes = list(paired)
    if old.identity is not None and old.identity == new.identity:
        notes.append(f"OLD and NEW are one file ({new.source}): nothing can have changed")
    if cross:
        notes.append(
            f"OLD is report.json schema {old.schema_version}, NEW schema {new.schema_version}: "
            "termination and gpu_reclaim are not compared (schema 1 counted NVRx's GPU memory "
            "wait in termination); downtime and the other phases are"
        )
    only_old = tuple(k for k in a if k not in b)
    missing = tuple(
        GateFailure(k, "missing", f"on OLD ({outcome(a[k])}), not on NEW")
        for k in only_old
        if any(r.what == "missing" for r in rules)
    )
    return Comparison(
        old=old,
        new=new,
        stack_changes=stack_changes(old, new),
        scenarios=tuple(diffs),
        only_old=only_old,
        only_new=tuple(k for k in b if k not in a),
        rules=tuple(rules),
        min_samples=min_samples,
        gate_noise=gate_noise,
        notes=tuple(notes),
        missing=missing,
    )
