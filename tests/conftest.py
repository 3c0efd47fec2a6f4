"""Shared fixtures for the test suite (the plugin's own tests use pytester separately)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.doctor import Doctor, copy_run

#: Real passing runs that tests edit one thing in (tests/helpers/doctor.py): the CPU reference
#: workload's kill in the save window (2 ranks, each printing its own lines) and Megatron's kill
#: on 2 x H200 (rank 0 prints the load lines, rank 1 the iterations).
REF_KILL_SAVE = Path(__file__).parent / "data" / "windows" / "cpu" / "ref-kill-save"
G2_KILL = Path(__file__).parent / "data" / "gpu-continuity" / "g2-kill-30"


@pytest.fixture
def ref(tmp_path: Path) -> Doctor:
    """A copy of ref-kill-save to edit."""
    return copy_run(REF_KILL_SAVE, tmp_path / "ref-kill-save")


@pytest.fixture
def g2(tmp_path: Path) -> Doctor:
    """A copy of g2-kill-30 to edit."""
    return copy_run(G2_KILL, tmp_path / "g2-kill-30")


@pytest.fixture
def megatron_stub(tmp_path: Path) -> Path:
    """A directory that passes the recipe's Megatron path check (pretrain_gpt.py present).

    Only the path check and argv construction use it; nothing ever executes it.
    """
    root = tmp_path / "Megatron-LM"
    root.mkdir()
    (root / "pretrain_gpt.py").write_text("raise SystemExit('not a real Megatron')\n")
    return root


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Any]:
    """The injector's test launcher (tests/helpers/injector_launcher.py): its
    runs' process groups are killed at the end."""
    from tests.helpers.injector_launcher import Launcher

    lau = Launcher(tmp_path)
    try:
        yield lau
    finally:
        lau.kill_all()


@pytest.fixture
def sc(tmp_path: Path) -> Any:
    """A fresh injector scenario (tracker, marker, workload files) under ``tmp_path``."""
    from tests.helpers.injector_launcher import Scenario

    return Scenario(tmp_path)


SESSION_VAR = "PYTEST_NVRX_TEST_SESSION"

#: Fixtures whose runs are launched for the tests that use them, however indirectly: the shipped
#: suite's scenario and self-test runs (testpaths collects pytest_nvrx/suite beside tests/), and
#: the session's reference self-test below.
LAUNCHING_FIXTURES = frozenset({"nvrx_scenario_run", "nvrx_selftest_outcome", "reference_selftest"})


def pytest_configure(config: pytest.Config) -> None:
    """A test that launches the real ft_launcher carries @pytest.mark.real_run or fails."""
    config.pluginmanager.import_plugin("tests.helpers.launch_guard")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that uses a launching fixture (LAUNCHING_FIXTURES; the shipped suite is the
    plugin's, so its marks are not written there) is marked real_run before ``-m`` selects."""
    for item in items:
        if LAUNCHING_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker("real_run")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Mark this session's children so the final check finds exactly them (not another
    session's runs on the same machine)."""
    os.environ[SESSION_VAR] = uuid.uuid4().hex


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No test may leave a launched process behind: fail the session if any survived.

    Every process a run starts carries the run's tag in its environment
    (pytest_nvrx.launch.launcher), orphans in other process sessions included; ours also carry this
    test session's marker.
    """
    from pytest_nvrx.launch.process_tree import TAG_VAR, kill_tree

    mine = f"{SESSION_VAR}={os.environ.get(SESSION_VAR, '')}".encode()
    survivors: dict[int, str] = {}
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
            continue
        try:
            env = (pid_dir / "environ").read_bytes().split(b"\0")
            cmd = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if mine not in env:
            continue
        for item in env:
            if item.startswith(TAG_VAR.encode() + b"="):
                survivors[int(pid_dir.name)] = cmd
                kill_tree(None, item.split(b"=", 1)[1].decode(), grace_s=1.0)
    if survivors:
        lines = "\n".join(f"  {pid}: {cmd[:160]}" for pid, cmd in sorted(survivors.items()))
        print(f"\nERROR: launched processes survived the test session (now killed):\n{lines}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


#: Under pytest-xdist (``./check`` runs ``-n 3``) tests are handed out by scope: a module stays
#: on one worker (its module-scoped fixtures, a real launch among them, run once; the self-test's
#: nine runs in tests/selftest/test_selftest.py), except these modules, whose tests share nothing
#: expensive: each launches its own run, or judges its own doctored copies.
SPLIT_BY_TEST = frozenset(
    {
        "tests/launch/test_cli_e2e.py",
        "tests/launch/test_signals.py",
        "tests/session/test_plugin_signals.py",
        # a thousand doctored copies of committed runs, each judged on its own (~2 min in one)
        "tests/criteria/test_pass_beside_contradiction.py",
    }
)


#: Work units that take long (real launches), roughly in seconds on 2 cores; the rest ~1 s.
UNIT_COSTS = (
    ("tests/selftest/test_selftest.py", 220),  # the self-test (9 runs, with test_planted_labels)
    ("tests/selftest/test_plugin_selftest.py", 60),  # --nvrx-selftest: the control, the rng plant
    ("nvrx-reference", 230),  # 10 scenarios (3 of them fault schedules), 3 at once
    ("tests/launch/test_slurm_launch.py", 170),
    ("tests/launch/test_local_nodes.py", 75),
    ("tests/worker/test_reference_workload.py", 70),
    ("tests/session/test_plugin_retention.py", 65),
    ("tests/session/test_plugin_xdist.py", 60),
    ("tests/session/test_scenario_pool.py", 80),
    ("tests/launch/test_cli_e2e.py::test_run_each", 45),
    ("tests/criteria/test_broken_resumes.py", 35),
    ("tests/criteria/test_broken_runs.py", 20),
    ("tests/compare/test_compare_planted.py", 65),  # 2 real runs, one with a slower load
    ("tests/test_packaging.py", 30),
    ("tests/launch/test_run_claim.py", 25),
    ("tests/launch/test_harness_death.py", 25),  # 2 real runs, SIGKILLed at their first iteration
    ("tests/launch/test_signals.py", 18),
    ("tests/session/test_plugin_signals.py", 14),
    ("tests/session/test_plugin.py", 20),
    ("tests/worker/test_injector.py", 15),
    # doctored copies of the committed runs judged by the hundred, one unit each (CPU seconds
    # of each module alone, -n 0, 2026-12-05): with the long units, not in the short tail where
    # a unit of a minute (two beside the other worker) leaves the other worker idle
    ("tests/criteria/test_checkpoint_agreement.py", 65),
    ("tests/criteria/test_adversarial_36_sweep.py", 60),
    ("tests/criteria/test_adversarial_review_36.py", 60),
    ("tests/criteria/test_required_evidence.py", 50),
)


def unit_cost(unit: str) -> int:
    return next((cost for prefix, cost in UNIT_COSTS if unit.startswith(prefix)), 1)


#: Modules that share a session fixture's real runs: one work unit with the first.
SHARED_UNITS = {"tests/selftest/test_planted_labels.py": "tests/selftest/test_selftest.py"}


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test of this repository."""
    path = nodeid.split("::", 1)[0]
    path = SHARED_UNITS.get(path, path)
    if path in SPLIT_BY_TEST:
        return nodeid
    return path


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The plugin's scheduler (one workload's scenarios on one worker) for the suite's tests,
    ``work_unit`` for ours."""
    from pytest_nvrx.session.xdist_scheduling import ScenarioScheduling, scenario_scope

    class TestsScheduling(ScenarioScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith("pytest_nvrx/"):
                return scenario_scope(nodeid) or nodeid
            return work_unit(nodeid)

        def schedule(self) -> None:
            # xdist hands out the largest units (by test count) first; the long real runs are
            # often units of one test and would come last, leaving one worker with a long tail.
            # The first units are assigned in schedule(); the rest go by expected cost.
            super().schedule()
            queue = getattr(self, "workqueue", None)
            if queue:
                ordered = sorted(queue.items(), key=lambda item: -unit_cost(item[0]))
                queue.clear()
                queue.update(ordered)

    return TestsScheduling(config, log)


@pytest.fixture(scope="session")
def reference_selftest(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``python -m pytest_nvrx selftest --workload reference --json -``, once per session (the
    modules using it are one xdist work unit: SHARED_UNITS)."""
    from tests.helpers.selftest_runs import run_reference_selftest

    return run_reference_selftest(tmp_path_factory.mktemp("selftest"))


#: The walkthrough's and our own variables, and Slurm's job ids: a test that runs the plugin or
#: the CLI decides them itself, never the developer's shell.
WALKTHROUGH_VARS = (
    "MEGATRON_PATH",
    "NVRX_WORK_DIR",
    "TP",
    "PP",
    "NNODES",
    "GPUS_PER_NODE",
    "TRAIN_ITERS",
    "SAVE_INTERVAL",
    "NVRX_FAULT_RANK",
    "RDZV_ENDPOINT",
    "NVRX_LAUNCHER",
    "NVRX_FAULT_MATRIX",
    "NVRX_FAULT_WINDOW",
    "NVRX_GPU_LOCK_DIR",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No walkthrough, pytest-nvrx or Slurm job variable leaks in from the developer's shell."""
    for var in WALKTHROUGH_VARS:
        monkeypatch.delenv(var, raising=False)
