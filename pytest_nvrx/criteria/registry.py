"""The criteria a judgement applies, in the order of :data:`CRITERIA_IDS`.

Adding a criterion: a module with ``check(ctx: JudgeContext) -> Verdict``, its id in
:data:`~pytest_nvrx.criteria.verdict.CriterionId`, and its entry here.
"""

from __future__ import annotations

from collections.abc import Callable

from pytest_nvrx.criteria.context import JudgeContext
from pytest_nvrx.criteria.no_repeat_injection import check as check_no_repeat_injection
from pytest_nvrx.criteria.optimizer_state_load import check as check_optimizer_state_load
from pytest_nvrx.criteria.prior_checkpoint import check as check_prior_checkpoint
from pytest_nvrx.criteria.progress_past_restore import check as check_progress_past_restore
from pytest_nvrx.criteria.replaced_cycle import check as check_replaced_cycle
from pytest_nvrx.criteria.training_continuity import check as check_training_continuity
from pytest_nvrx.criteria.verdict import CRITERIA_IDS, CriterionId, Verdict

Check = Callable[[JudgeContext], Verdict]

CRITERIA: dict[CriterionId, Check] = {
    "prior_checkpoint": check_prior_checkpoint,
    "replaced_cycle": check_replaced_cycle,
    "optimizer_state_load": check_optimizer_state_load,
    "progress_past_restore": check_progress_past_restore,
    "no_repeat_injection": check_no_repeat_injection,
    "training_continuity": check_training_continuity,
}

if tuple(CRITERIA) != CRITERIA_IDS:
    raise RuntimeError(
        f"CRITERIA lists {', '.join(CRITERIA)} but CriterionId has {', '.join(CRITERIA_IDS)}:"
        " give each criterion id one check, in the same order"
    )
