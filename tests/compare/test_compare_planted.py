"""A planted regression found by ``compare``: two real reference kill runs through the real
ft_launcher, the second with ``--load-delay`` (its replacement sleeps inside the checkpoint
load), compared as run directories judged on the fly. The phase that grew must be
``checkpoint_load``, by about the delay, and the gate on it must fire; without the delay (the
option broken, or compare reading the wrong phase) these tests fail."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pytest_nvrx.compare import compare, load_side
from pytest_nvrx.compare.main import compare_main
from tests.helpers.reference_runs import launch_reference

# both tests judge the module's two real runs
pytestmark = pytest.mark.real_run

#: the planted slowdown. The rest of the load phase (the replacement's start to the load line:
#: its imports, NVRx's monitor, gloo's rendezvous of both ranks, the model, DCP's read) moves by
#: seconds on a loaded 2-core machine (the plain run's took 12.2 s in one ./check at -n 3, where
#: the slow run's took 5.8 s besides its sleep: the load grew by only 3.6 s of a 10 s delay),
#: hence a delay well above that and a band of NOISE_S around it
DELAY_S = 20.0
NOISE_S = 4.0


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("planted")
    plain, code, _ = launch_reference(work, "plain", ())
    assert code == 0
    slow, code, _ = launch_reference(work, "slow", ("--load-delay", f"{DELAY_S:g}"))
    assert code == 0
    return plain, slow


def test_the_phase_that_grew_is_the_checkpoint_load_by_about_the_delay(
    pair: tuple[Path, Path],
) -> None:
    plain, slow = pair
    result = compare(load_side(plain, "OLD"), load_side(slow, "NEW"))
    [scenario] = result.scenarios
    assert scenario.old_qualified and scenario.new_qualified, scenario.new_outcome
    grown = {t.what: t.delta for t in scenario.timings if t.delta is not None}
    by = {t.what: t for t in scenario.timings}
    load = grown["checkpoint_load"]
    old_load, new_load = by["checkpoint_load"].old, by["checkpoint_load"].new
    assert load is not None and old_load is not None and new_load is not None, grown
    # the planted sleep lies inside the load: the slow run's load phase holds all of it, so
    # the phase grew by at least the delay less what the plain run's own load took (that
    # bound holds however busy the host is); and by not much more than the delay
    assert new_load >= DELAY_S, by["checkpoint_load"]
    assert DELAY_S - old_load <= load <= DELAY_S + NOISE_S, grown
    largest = max((w for w in grown if w != "downtime"), key=lambda w: grown[w] or 0.0)
    assert largest == "checkpoint_load", grown
    # the other phases move by seconds on a busy 2-core host (a restart's termination,
    # rendezvous): the downtime grew, by how much is the load's business, not this test's
    assert grown["downtime"] is not None and grown["downtime"] > 0, grown
    assert scenario.status == "slower"


def test_the_gate_on_the_load_phase_fires_and_a_looser_one_holds(pair: tuple[Path, Path]) -> None:
    plain, slow = pair
    out, err = io.StringIO(), io.StringIO()
    code = compare_main([str(plain), str(slow), "--fail-on", "phase:load:+5s"], out, err)
    assert code == 1, out.getvalue() + err.getvalue()
    assert "gate fails:" in out.getvalue() and "checkpoint_load" in out.getvalue()
    out = io.StringIO()
    code = compare_main([str(plain), str(slow), "--fail-on", "phase:load:+30s,verdict"], out, err)
    assert code == 0, out.getvalue() + err.getvalue()
    # the other way round it is an improvement of the same size: nothing to gate
    out = io.StringIO()
    code = compare_main([str(slow), str(plain), "--fail-on", "phase:load:+5s"], out, err)
    assert code == 0, out.getvalue() + err.getvalue()
    assert "FASTER" in out.getvalue()
