"""A pytest session compared with an earlier qualification (``--nvrx-compare``), pytest-free:
the session's scenarios as the NEW side, and one scenario's comparison as JUnit properties."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_nvrx.compare.diff import Incomparable, compare
from pytest_nvrx.compare.side import Side
from pytest_nvrx.report.model import SCHEMA_VERSION, ScenarioReport
from pytest_nvrx.settings.compare_gate import GateRule

SESSION = "this session"


def session_side(reports: Sequence[ScenarioReport]) -> Side:
    """The scenarios this session judged, as the NEW side."""
    return Side("NEW", SESSION, SESSION, SCHEMA_VERSION, None, tuple(reports))


def scenario_properties(
    previous: Side,
    report: ScenarioReport,
    rules: Sequence[GateRule] = (),
    *,
    gate_noise: bool = False,
) -> list[tuple[str, str]]:
    """``nvrx_compare_*`` JUnit properties of one scenario against ``previous``: its status,
    verdict old -> new, each timing's change in seconds (a schedule's per fault:
    ``nvrx_compare_fault2_checkpoint_load_delta_s``), the gate's failures and the noise."""
    try:
        result = compare(previous, session_side([report]), rules, gate_noise=gate_noise)
    except Incomparable:
        return [("nvrx_compare_status", f"not in {previous.source}")]
    [d] = result.scenarios
    props = [
        ("nvrx_compare_status", d.status),
        ("nvrx_compare_verdict", f"{d.old_outcome} → {d.new_outcome}"),
    ]
    for t in d.timings:
        if t.delta is None:
            continue
        where = "" if t.position is None else f"fault{t.position}_"
        props.append((f"nvrx_compare_{where}{t.what}_delta_s", f"{t.delta:.3f}"))
    if rules:
        failed = "; ".join(f"{f.rule}: {f.text}" for f in d.failures)
        props.append(("nvrx_compare_gate", failed or "passes"))
    if d.noise:
        props.append(("nvrx_compare_noise", "; ".join(d.noise)))
    return props
