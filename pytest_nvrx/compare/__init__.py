"""Two qualifications compared side by side, and a gate on it (pytest-free; docs/compare.md).

* :func:`load_side` reads a side: a ``report.json`` of any schema we wrote (checked as untrusted
  input), or run directories judged on the fly.
* :func:`compare` matches scenarios by :class:`ScenarioKey`, diffs the stacks, the verdicts and
  every recovery's downtime and phases, flags noise and applies the gate's rules
  (:func:`parse_gate`: ``verdict``, ``downtime:+20%``, ``phase:load:+5s``).
* :mod:`~pytest_nvrx.compare.render` shows a :class:`Comparison` as text, JSON and HTML;
  :func:`compare_main` is the command (``python -m pytest_nvrx compare OLD NEW``).
"""

from __future__ import annotations

from pytest_nvrx.compare.diff import (
    Comparison,
    GateFailure,
    Incomparable,
    ScenarioDiff,
    ScenarioKey,
    TimingDiff,
    compare,
    scenario_key,
)
from pytest_nvrx.compare.main import compare_main
from pytest_nvrx.compare.side import CompareInputError, Side, load_side
from pytest_nvrx.settings.compare_gate import GateRule, Limit, parse_gate

__all__ = [
    "CompareInputError",
    "Comparison",
    "GateFailure",
    "GateRule",
    "Incomparable",
    "Limit",
    "ScenarioDiff",
    "ScenarioKey",
    "Side",
    "TimingDiff",
    "compare",
    "compare_main",
    "load_side",
    "parse_gate",
    "scenario_key",
]
