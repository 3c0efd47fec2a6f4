"""pytest-xdist scheduling: each scenario is launched once per session whatever ``-n`` is.

A scenario runs inside the session-scoped ``nvrx_scenario_run`` fixture and its tests only read
the verdicts; xdist's ``load`` would scatter those tests over the workers and each worker would
launch the scenario again. The controller only sees node ids, so the grouping is read from them:
the scenario parameter leads the test's id (``test_recovery_criterion[reference-kill-save-...]``)
and every scenario id starts with its workload. One work unit per workload keeps a workload's
baseline and its faulted scenarios on one worker, so continuity is judged against the baseline
exactly as without xdist. Every other test is its own work unit (plain ``load``).

Imported only when pytest-xdist is installed (plugin.pytest_xdist_make_scheduler).
"""

from __future__ import annotations

import re

from xdist.scheduler import LoadScopeScheduling

from pytest_nvrx.session.scenarios import WORKLOAD_ORDER

_SCENARIO_PARAM = re.compile(
    r"\[(?P<group>existing-run|" + "|".join(map(re.escape, WORKLOAD_ORDER)) + r")(?:-|\])"
)


def scenario_scope(nodeid: str) -> str | None:
    """``nvrx-<workload>`` for a test parametrized by a scenario, else None."""
    match = _SCENARIO_PARAM.search(nodeid)
    return f"nvrx-{match.group('group')}" if match is not None else None


class ScenarioScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """``load``, except that the tests of one workload's scenarios form one work unit."""

    def _split_scope(self, nodeid: str) -> str:
        return scenario_scope(nodeid) or nodeid
