"""The self-test, with ``--nvrx-selftest``: each known recovery bug planted into a real run of
this stack must be caught by its documented criterion (docs/selftest.md).

One test per self-test run of each selected workload: ``reference-selftest-control`` (the
unplanted control, which must qualify), then ``reference-selftest-rng``, ... in the catalogue's
order (the plant, which its criterion must catch); ``megatron-selftest-*`` as the GPU scenarios
(``gpu``). Every test carries the marker ``selftest``: ``-m selftest`` runs the self-test alone,
``-m "not selftest"`` leaves it out, ``-k rng`` runs the control and that plant. A workload's
self-test runs once (the ``nvrx_selftest_outcome`` fixture, the CLI's core); without
``--nvrx-selftest`` these tests are not collected at all.
"""

from __future__ import annotations

import pytest

from pytest_nvrx.criteria.selftest_outcome import PlantOutcome
from pytest_nvrx.evidence.refs import printable

# the runs have their own deadline (--nvrx-run-timeout), as the scenarios' (test_recovery.py)
pytestmark = pytest.mark.timeout(0)


def test_plant_caught(nvrx_selftest_outcome: PlantOutcome) -> None:
    """The control qualified; a plant was caught by the criterion the catalogue names for it (a
    plant the run is too small for is skipped, saying so)."""
    outcome = nvrx_selftest_outcome
    if outcome.status == "skipped":
        pytest.skip(printable(outcome.reason))
    expected = "qualified" if outcome.plant is None else "caught"
    if outcome.status != expected:
        pytest.fail(printable(f"{outcome.status}: {outcome.reason}", lines=True), pytrace=False)
