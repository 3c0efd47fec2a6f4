"""The recovery criteria, judged for every selected scenario.

Each scenario (``reference-baseline``, ``reference-kill-save``, ``megatron-hang-finalize``, ...)
is launched once by the ``nvrx_scenario_run`` fixture; these tests only read its verdicts. The
matrix is ``--nvrx-matrix default|full`` or ``--nvrx-window``; markers select within it, by
fault, window and workload: ``-m "gpu and finalize"``, ``-m "kill and not step"``,
``-m "not gpu"``. With ``--nvrx-max-downtime S`` or ``--nvrx-max-phase P=S``
each scenario also gets ``test_recovery_downtime``, the downtime gate.
"""

from __future__ import annotations

import pytest

from pytest_nvrx.criteria import CRITERIA_IDS
from pytest_nvrx.criteria.outcome import RUN_CAUSES
from pytest_nvrx.evidence.refs import printable
from pytest_nvrx.fixtures import nvrx_settings
from pytest_nvrx.session.scenario_run import Limits, ScenarioRun

# A scenario's run has its own deadline (--nvrx-run-timeout) that kills the whole process tree;
# pytest-timeout must not interrupt it first (the run happens inside the first test's setup).
pytestmark = pytest.mark.timeout(0)


def test_run_finished(nvrx_scenario_run: ScenarioRun) -> None:
    """The run left a judgeable run directory, its workers did not die before the fault and the
    launch ended by itself; otherwise the failure is the run's cause (criteria/outcome.py: the
    one the console, the report and JUnit name), its first line what ``-ra`` shows."""
    outcome = nvrx_scenario_run.outcome()
    if outcome.kind in RUN_CAUSES and outcome.cause is not None:
        lines = [outcome.cause]
        if outcome.kind == "cannot-judge":  # every reason, under the first
            lines += [f"  {why}" for why in nvrx_scenario_run.judgement.unjudgeable_reasons[1:]]
        pytest.fail(printable("\n".join(lines), lines=True), pytrace=False)


@pytest.mark.parametrize("criterion", CRITERIA_IDS)
def test_recovery_criterion(nvrx_scenario_run: ScenarioRun, criterion: str) -> None:
    verdict = nvrx_scenario_run.judgement.verdict(criterion)
    if verdict.not_applicable:
        pytest.skip(f"{criterion}: {verdict.reason}")
    if not verdict.passed:
        # the verdict alone (no assertion rewrite, no source of this suite), its reason first
        # (led by the first cause where the workers died before the fault: what ``-ra``
        # shows), then the lines that prove it; the run's control characters escaped
        head, *proof = verdict.render().split("\n")  # (a log line's own \r is no line break)
        first = head.removeprefix(f"{verdict.status} {verdict.id}: ")
        pytest.fail(printable("\n".join([first, *proof]), lines=True), pytrace=False)


@pytest.mark.nvrx_downtime_gate
def test_recovery_downtime(nvrx_scenario_run: ScenarioRun, pytestconfig: pytest.Config) -> None:
    """The fault's instant to the first step committed after the restore is within
    --nvrx-max-downtime, and each phase named by --nvrx-max-phase within its limit (collected
    only when one is given); a limit with nothing measured fails too."""
    limits = Limits.of(nvrx_settings(pytestconfig))
    if not limits.given:
        pytest.skip("no --nvrx-max-downtime or --nvrx-max-phase given")
    if nvrx_scenario_run.baseline:
        pytest.skip("baseline scenario: no fault, no downtime")
    failures = nvrx_scenario_run.gate_failures(limits)
    if failures:
        pytest.fail(printable("\n".join(failures), lines=True), pytrace=False)
