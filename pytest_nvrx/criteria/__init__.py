"""The recovery criteria of the NVRx GPT walkthrough ("Verify recovery"), as pure functions.

Each criterion takes the parsed :class:`~pytest_nvrx.evidence.RunEvidence` (and what fault was
expected) and returns a :class:`Verdict` that quotes the lines proving it. They consume only
normalized evidence (launcher events, cycle records, workload events from an adapter, the
marker, the tracker, checkpoint metadata, and the injector's own lines, which the marker must
agree with: criteria/marker_agreement.py), never absolute paths of the run host. The full
semantics, including the baseline (fault=none) rules, are in docs/criteria.md.

Entry points: :func:`judge_run_dir` (path in, :class:`Judgement` out) and :func:`judge` (for
evidence already loaded); each criterion is also callable on its own.

Layout: one module per criterion, each with ``check(ctx: JudgeContext) -> Verdict`` (``ctx`` is
built once per judgement, ``context.py``) and its public ``name(run, expected=None)``;
``verdict.py`` holds :class:`Verdict` and the criterion ids, ``registry.py`` the ordered
:data:`CRITERIA`, ``judgement.py`` :func:`judge`, ``outcome.py`` the run's one outcome and
cause (:func:`~pytest_nvrx.criteria.outcome.run_outcome`), which every output reads. A new
criterion is a module, its id in :data:`CriterionId` and its entry in :data:`CRITERIA`.
"""

from __future__ import annotations

from pytest_nvrx.criteria.context import JudgeContext, RestoreTarget
from pytest_nvrx.criteria.expected import (
    FAULT_CHOICES,
    WINDOW_CHOICES,
    ExpectedFault,
    ExpectedWindow,
    FaultExpectation,
    expected_fault,
    expected_window,
)
from pytest_nvrx.criteria.first_cause import FirstCause
from pytest_nvrx.criteria.judgement import Judgement, judge, judge_run_dir
from pytest_nvrx.criteria.no_repeat_injection import no_repeat_injection
from pytest_nvrx.criteria.optimizer_state_load import OPTIMIZER_PART, optimizer_state_load
from pytest_nvrx.criteria.prior_checkpoint import prior_checkpoint
from pytest_nvrx.criteria.progress_past_restore import progress_past_restore
from pytest_nvrx.criteria.registry import CRITERIA, Check
from pytest_nvrx.criteria.replaced_cycle import replaced_cycle
from pytest_nvrx.criteria.verdict import CRITERIA_IDS, CriterionId, Verdict

__all__ = [
    "CRITERIA",
    "CRITERIA_IDS",
    "FAULT_CHOICES",
    "OPTIMIZER_PART",
    "WINDOW_CHOICES",
    "Check",
    "CriterionId",
    "ExpectedFault",
    "ExpectedWindow",
    "FaultExpectation",
    "FirstCause",
    "JudgeContext",
    "Judgement",
    "RestoreTarget",
    "Verdict",
    "expected_fault",
    "expected_window",
    "judge",
    "judge_run_dir",
    "no_repeat_injection",
    "optimizer_state_load",
    "prior_checkpoint",
    "progress_past_restore",
    "replaced_cycle",
]
