"""Scenarios side by side (--nvrx-parallel): how many at once, and a real session that runs the
reference baseline and kill-save together through the real ft_launcher (~45 s)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_nvrx.session.scenario_pool import cpu_parallel, parallel_limit, scenario_gpus
from pytest_nvrx.session.scenarios import Scenario
from pytest_nvrx.settings import NvrxSettings, PartialRunConfig
from tests.helpers.processes import kill_marked, marked_env, new_mark, stop, stopped_run

pytest_plugins = ["pytester"]

GPU = [
    Scenario("megatron", "none"),
    Scenario("megatron", "kill", "save"),
    Scenario("megatron", "hang", "step"),
]
CPU = [Scenario("reference", "none"), Scenario("reference", "kill", "save")]


def test_gpu_scenarios_fill_the_visible_gpus_slots() -> None:
    settings = NvrxSettings()
    assert [scenario_gpus(settings, s) for s in GPU] == [1, 1, 1]
    assert parallel_limit(settings, GPU, ["0", "1"]) == 2
    assert parallel_limit(NvrxSettings(gpu_share=2), GPU, ["0", "1"]) == 4
    two = NvrxSettings(overrides=PartialRunConfig(gpus_per_node=2))
    assert scenario_gpus(two, GPU[0]) == 2
    assert parallel_limit(two, GPU, ["0", "1", "2", "3"]) == 2
    # a scenario wider than the host: one at a time (its launch then says why it cannot run)
    assert parallel_limit(two, GPU, ["0"]) == 1


def test_explicit_multinode_and_cpu_limits() -> None:
    assert parallel_limit(NvrxSettings(parallel=3), GPU, ["0"]) == 3
    assert parallel_limit(NvrxSettings(parallel=3), CPU, []) == 3
    assert parallel_limit(NvrxSettings(), CPU, []) == cpu_parallel(os.cpu_count())
    assert [cpu_parallel(n) for n in (None, 1, 2, 6, 8, 32)] == [3, 3, 3, 3, 4, 16]
    assert [scenario_gpus(NvrxSettings(), s) for s in CPU] == [0, 0]
    # the nodes of a multinode run start in step: never pooled, whatever was asked
    two_nodes = NvrxSettings(parallel=3, overrides=PartialRunConfig(nnodes=2))
    assert parallel_limit(two_nodes, GPU, ["0", "1"]) == 1
    by_hand = NvrxSettings(overrides=PartialRunConfig(node_index=1))
    assert parallel_limit(by_hand, GPU, ["0", "1"]) == 1
    assert parallel_limit(NvrxSettings(), [], ["0"]) == 1


@pytest.mark.real_run
@pytest.mark.timeout(600)
def test_two_reference_scenarios_side_by_side(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        "--pyargs", "pytest_nvrx.suite", "-p", "no:cacheprovider", "--nvrx-parallel", "2",
        "-k", "reference-baseline or reference-kill-save",
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out[-4000:]
    result.assert_outcomes(passed=10, skipped=4)
    assert "nvrx reference: 2 scenarios, up to 2 at once" in out
    events = re.findall(
        r"^nvrx (reference-\S+): (launching in|launcher exit|continuity also checked)", out, re.M
    )
    order = [f"{name} {what.split()[0]}" for name, what in events]
    # both launched before either launcher ended: they ran side by side
    first_exit = min(i for i, e in enumerate(order) if e.endswith(" launcher"))
    assert sorted(order[:first_exit]) == [
        "reference-baseline launching",
        "reference-kill-save launching",
    ], order
    # and the kill-save was still judged against the session's baseline
    assert "reference-kill-save continuity" in order
    runs = re.findall(r"^(reference-\S+): (\S+), launcher \S+ exit 0", out, re.M)
    assert len({d for _, d in runs}) == 2


@pytest.mark.real_run
@pytest.mark.timeout(300)
def test_a_stop_signal_stops_every_run_of_the_pool(tmp_path: Path) -> None:
    """SIGTERM while two scenarios train side by side: pytest exits 2 (interrupted), both trees
    are gone, both result.json name the signal, both TMPDIRs are removed."""
    work = tmp_path / "work"
    mark = new_mark()
    out = tmp_path / "pytest.out"
    with out.open("wb") as console:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "--pyargs", "pytest_nvrx.suite", "-p",
             "no:cacheprovider", "-k", "reference-baseline or reference-kill-save",
             "--nvrx-parallel", "2", "--nvrx-work-dir", str(work)],
            stdout=console, stderr=subprocess.STDOUT, env=marked_env(mark),
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while len(list(work.glob("runs/*/logs/train_cycle0.log"))) < 2:
            assert proc.poll() is None, out.read_text(errors="replace")
            assert time.monotonic() < deadline, "the two scenarios never both started training"
            time.sleep(0.5)
        returncode, left = stop(proc, signal.SIGTERM, mark, repeat=False, within=90)
    finally:
        kill_marked(mark)
    run_dirs = sorted(work.glob("runs/*"))
    assert len(run_dirs) == 2
    for run_dir in run_dirs:
        assert stopped_run(run_dir, returncode, left) == {
            "exit": pytest.ExitCode.INTERRUPTED,
            "processes left": 0,
            "interrupted": "SIGTERM",
            "TMPDIR left": False,
        }, (
            f"{run_dir.name} left: {sorted(left.values())}\n"
            + out.read_text(errors="replace")[-3000:]
        )
