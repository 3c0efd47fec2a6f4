"""Scheduling under pytest-xdist: a scenario's tests form one work unit (launched once)."""

from __future__ import annotations

import pytest

from pytest_nvrx.session.xdist_scheduling import scenario_scope
from tests.conftest import work_unit

SUITE = "pytest_nvrx/suite/test_recovery.py"


@pytest.mark.parametrize(
    ("nodeid", "scope"),
    [
        (f"{SUITE}::test_run_finished[reference-baseline]", "nvrx-reference"),
        (
            f"{SUITE}::test_recovery_criterion[reference-kill-save-prior_checkpoint]",
            "nvrx-reference",
        ),
        (
            f"{SUITE}::test_recovery_criterion[megatron-hang-finalize-replaced_cycle]",
            "nvrx-megatron",
        ),
        (f"{SUITE}::test_run_finished[existing-run]", "nvrx-existing-run"),
        # a workload's self-test runs (--nvrx-selftest) once, on the worker of its scenarios
        (
            "pytest_nvrx/suite/test_selftest.py::test_plant_caught[reference-selftest-rng]",
            "nvrx-reference",
        ),
        (
            "pytest_nvrx/suite/test_selftest.py::test_plant_caught[megatron-selftest-control]",
            "nvrx-megatron",
        ),
        # loadgroup's suffix (where xdist can still add it) changes nothing
        (f"{SUITE}::test_run_finished[reference-baseline]@nvrx-reference", "nvrx-reference"),
        ("tests/test_x.py::test_y[referenced]", None),
        ("tests/test_x.py::test_y", None),
    ],
)
def test_scenario_scope(nodeid: str, scope: str | None) -> None:
    assert scenario_scope(nodeid) == scope


def test_our_work_units() -> None:
    # a module stays together (its module-scoped fixtures run once) ...
    assert (
        work_unit("tests/evidence/test_evidence_checkpoint.py::test_a")
        == "tests/evidence/test_evidence_checkpoint.py"
    )
    # ... independent real runs spread out ...
    cli = (
        "tests/launch/test_cli_e2e.py::test_run_each_default_pair_then_verify[reference-kill-save]"
    )
    assert work_unit(cli) == cli
    # ... and the tests reading the self-test's runs stay with them, parameters and all
    assert work_unit("tests/selftest/test_selftest.py::test_a[rng]") == work_unit(
        "tests/selftest/test_selftest.py::test_b[data]"
    )
