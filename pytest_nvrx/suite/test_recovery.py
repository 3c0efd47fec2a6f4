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
from pytest_nvrx.evidence.refs import printable
from pytest_nvrx.fixtures import nvrx_settings
from pytest_nvrx.session.scenario_run import Limits, ScenarioRun

# A scenario's run has its own deadline (--nvrx-run-timeout) that kills the whole process tree;
# pytest-timeout must not interrupt it first (the run happens inside the first test's setup).
pytestmark = pytest.mark.timeout(0)


def test_run_finished(nvrx_scenario_run: ScenarioRun) -> None:
    """The launch itself ended (no timeout), left a judgeable run directory, and its workers
    did not die before the fault (a setup error: the first cause, quoted, is the failure)."""
    assert nvrx_scenario_run.error is None, nvrx_scenario_run.error
    judgement = nvrx_scenario_run.judgement
    if not judgement.judgeable:
        pytest.fail(
            printable(
                "run directory cannot be judged: " + "; ".join(judgement.unjudgeable_reasons)
            ),
            pytrace=False,
        )
    if judgement.first_cause is not None:
        pytest.fail(printable(judgement.first_cause.text), pytrace=False)


@pytest.mark.parametrize("criterion", CRITERIA_IDS)
def test_recovery_criterion(nvrx_scenario_run: ScenarioRun, criterion: str) -> None:
    verdict = nvrx_scenario_run.judgement.verdict(criterion)
    if verdict.not_applicable:
        pytest.skip(f"{criterion}: {verdict.reason}")
    if not verdict.passed:
        # the verdict alone (no assertion rewrite, no source of this suite); it reaches the
        # terminal and JUnit with the run's control characters escaped
        pytest.fail(printable(verdict.render(), lines=True), pytrace=False)


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
