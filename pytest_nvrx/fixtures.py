"""Fixtures and the session state they share with the hooks: one launched run per scenario.

The run happens in the session-scoped ``nvrx_scenario_run`` fixture (parametrized by the plugin
with ``indirect=True, scope="session"``, so pytest groups a scenario's tests and launches it
once); plan -> launch -> judge is pytest_nvrx.session.scenario_run's, this module is the pytest glue
around it. GPU scenarios hold a lock per GPU they see (gpu_slots), so scenarios never share a
GPU (xdist workers or sessions on one host wait), while sessions on disjoint GPUs run side by
side.

A baseline scenario that passed becomes the reference of the same workload's fault scenarios
(every fault and window) judged after it in the session (training_continuity compares every
iteration after the restore with it); its parsed evidence is kept in memory. Every run dir is
kept after the session, less its checkpoint payload unless --nvrx-keep (retention).

With ``--nvrx-selftest`` the ``nvrx_selftest_outcome`` fixture (parametrized by the plugin with
the self-test's scenarios) gives each ``test_plant_caught`` its run's outcome. The first of a
workload's runs the whole self-test of that workload once (pytest_nvrx.selftest.run.run_selftest,
the CLI's core): the control and the plants whose tests are selected; its runs are judged runs
of the session like the scenarios' (summary, table, JUnit, report).

The hooks (plugin.py) import from here, never the other way round.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# Only the settings at import: this module loads with the plugin in every session, and a
# project that merely has pytest-nvrx installed must not pay for the launch, the session's
# runs, the evidence or the criteria (benchmarks/bench_plugin_import.py). They are imported
# where a scenario of ours needs them.
from pytest_nvrx.settings import (
    ConfigError,
    NvrxSettings,
    Setting,
    WorkloadKind,
    check_run_timeout,
    option_hint,
    resolve_plugin_settings,
    validate,
)
from pytest_nvrx.settings.plants import PLANTS

if TYPE_CHECKING:
    from pytest_nvrx.criteria.selftest_outcome import PlantOutcome
    from pytest_nvrx.evidence.rundir import RunEvidence
    from pytest_nvrx.selftest.run import SelftestResult
    from pytest_nvrx.session.scenario_pool import ScenarioPool
    from pytest_nvrx.session.scenario_run import ScenarioRun
    from pytest_nvrx.session.scenarios import Scenario

# The fixtures and what plugin.py and the shipped suite take from here.
__all__ = [
    "nvrx_scenario_run",
    "nvrx_selftest_outcome",
    "nvrx_settings",
    "record_judged",
    "resolve_settings",
    "run_of",
    "terminal_writer",
]

SETTINGS_KEY = pytest.StashKey[NvrxSettings]()
# workload -> the evidence of this session's passed baseline scenario
BASELINES_KEY = pytest.StashKey[dict[str, "RunEvidence"]]()
#: workload -> the pool that launches its scenarios side by side (None: one after the other)
POOLS_KEY = pytest.StashKey[dict[str, "ScenarioPool | None"]]()
#: scenario id -> the work dir made for it (before its launch when a pool submitted it)
WORK_DIRS_KEY = pytest.StashKey[dict[str, Path]]()
SCENARIO_FIXTURE = "nvrx_scenario_run"
#: on an xdist worker, the line that refused the session's scenarios before any launched
REFUSED_KEY = pytest.StashKey[str]()
#: the fixture of the self-test's tests (--nvrx-selftest), parametrized by self-test scenarios
SELFTEST_FIXTURE = "nvrx_selftest_outcome"
#: workload -> its self-test of this session, or why it could not run (a failure message)
SELFTESTS_KEY = pytest.StashKey[dict[str, "SelftestResult | str"]]()
#: self-test scenario id -> what its run showed (its test's verdict, its summary entry)
SELFTEST_OUTCOMES_KEY = pytest.StashKey[dict[str, "PlantOutcome"]]()
#: checkpoint payload removals running in the background (_Pruning), joined at session end
PRUNING_KEY = pytest.StashKey[list["_Pruning"]]()
#: Judged runs in the order they finished, for the terminal summary.
JUDGED_KEY = pytest.StashKey[list["ScenarioRun"]]()
#: Judged runs by key (the scenario id, or EXISTING_RUN): what a test item's report reads.
RUNS_KEY = pytest.StashKey[dict[str, "ScenarioRun"]]()
#: Key of an xdist worker's workeroutput: the keys of the runs it judged.
WORKEROUTPUT_JUDGED = "nvrx_judged"


def _lookup(config: pytest.Config, setting: Setting, *, env: bool) -> tuple[Any, str] | None:
    """The first source that sets ``setting``: option, then env var (unless ``env`` is
    False), then ini. (value, source)."""
    value = config.getoption(setting.ini)
    if value is not None:
        return value, setting.plugin_option
    if env and setting.env and os.environ.get(setting.env, "") != "":
        return os.environ[setting.env], f"environment variable {setting.env}"
    try:
        ini = config.getini(setting.ini)  # typed (Setting.ini_type): 5 or "5" for an int
    except (pytest.UsageError, ValueError) as exc:  # "abc" for an int, 5 for a string
        wanted = {"int": "an integer", "float": "a number", "bool": "true or false"}
        raise pytest.UsageError(
            f"pytest-nvrx: ini value {setting.ini} must be"
            f" {wanted.get(setting.ini_type, 'text')}: {exc}"
        ) from None
    if ini is None or ini == "" or ini is False:
        return None
    if setting.flag:
        return ini, f"ini value {setting.ini}"
    # every parser reads text: 5 -> "5", 0.5 -> "0.5" (checked there, as the option's text)
    return str(ini), f"ini value {setting.ini}"


def resolve_settings(config: pytest.Config, *, env: bool = True) -> NvrxSettings:
    """Resolve and check every option; raise pytest.UsageError that says how to fix it.

    ``env=False`` reads only our own options and ini values (what pytest_configure checks in
    every session); environment variables count only once our scenarios are collected
    (nvrx_settings)."""
    try:
        return resolve_plugin_settings(
            lambda setting: _lookup(config, setting, env=env), os.environ if env else None
        )
    except ConfigError as exc:
        raise pytest.UsageError(f"pytest-nvrx: {exc.message_for('plugin')}") from None


def nvrx_settings(config: pytest.Config) -> NvrxSettings:
    """The session's settings, resolved on first use: when our scenarios are parametrized or
    run, never in a session that collects none of them. Until then nothing reads the
    walkthrough's environment variables (TP, PP, MEGATRON_PATH, ... are common names in ML
    shells) and nothing probes the stack, so a project that merely has the plugin installed
    runs as with ``-p no:nvrx``."""
    settings = config.stash.get(SETTINGS_KEY, None)
    if settings is None:
        settings = resolve_settings(config)
        config.stash[SETTINGS_KEY] = settings
    return settings


def record_judged(config: pytest.Config, run: ScenarioRun) -> None:
    config.stash.setdefault(JUDGED_KEY, []).append(run)
    config.stash.setdefault(RUNS_KEY, {})[run.key] = run
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:
        # an xdist worker: the controller learns that something was judged here (its
        # "nothing qualified" rule); the summary itself travels on the test reports
        workeroutput.setdefault(WORKEROUTPUT_JUDGED, []).append(run.key)


def terminal_writer(config: pytest.Config) -> Callable[[str], None]:
    # (printable is imported when a line is written: a session of another project asks for a
    # writer it never uses)
    capman = config.pluginmanager.get_plugin("capturemanager")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        # An xdist worker's terminal is not the user's; its stderr is (inherited from the
        # controller): progress goes there, tagged with the worker, as it happens.
        prefix = f"[{workerinput.get('workerid', 'worker')}] "

        def write_worker(line: str) -> None:
            from pytest_nvrx.evidence.refs import printable

            with (
                contextlib.nullcontext() if capman is None else capman.global_and_fixture_disabled()
            ):
                sys.stderr.write(prefix + printable(line) + "\n")
                sys.stderr.flush()

        return write_worker
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is None:
        return lambda line: None

    def write(line: str) -> None:
        from pytest_nvrx.evidence.refs import printable

        line = printable(line)  # it may quote the run's text: no control character reaches a tty
        # Runs happen inside fixture setup, where output is captured: lift it for our line.
        if capman is None:
            tr.write_line(line)
            return
        with capman.global_and_fixture_disabled():
            tr.write_line(line)

    return write


def progress_writer(config: pytest.Config) -> Callable[[str], None]:
    """Where a run's periodic lines go (cycle, iteration, fault): the terminal, or nowhere
    under ``-q`` (the outcome lines and the summary stay)."""
    if config.get_verbosity() < 0:
        return lambda line: None
    return terminal_writer(config)


def _scenario_of(item: pytest.Item) -> Scenario | None:
    from pytest_nvrx.session.scenarios import Scenario

    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    scenario = callspec.params.get(SCENARIO_FIXTURE, callspec.params.get(SELFTEST_FIXTURE))
    return scenario if isinstance(scenario, Scenario) else None


def prepare_session_checkout(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Before any scenario launches: when Megatron scenarios are selected, what the checkout
    builds at first use is built once (pytest_nvrx.launch.prepare_megatron), and one line says so.
    Called where the header is printed (a session without xdist, or xdist's gw0); the other
    workers' scenarios make sure of it as they plan (scenario_run.plan_launch), waiting for
    this build under its lock.

    An unbuildable checkout is a usage error before any launch. An xdist worker cannot end the
    session with one (xdist reports it as an internal error): it prints the line, and every
    Megatron scenario then fails with it as it plans, launching nothing."""
    if config.option.collectonly:
        return
    if config.stash.get(REFUSED_KEY, None) is not None:
        return  # a refused session launches nothing, so it builds nothing in the checkout
    settings = nvrx_settings(config)
    if settings.megatron_path is None or settings.run_dir is not None:
        return
    if not any((sc := _scenario_of(item)) and sc.workload == "megatron" for item in items):
        return
    from pytest_nvrx.launch.prepare_megatron import ensure_prepared
    from pytest_nvrx.launch.stop_signals import interrupt_on_stop_signals

    workerinput = getattr(config, "workerinput", None)
    who = "pytest session" + (f", xdist {workerinput.get('workerid')}" if workerinput else "")
    try:
        # SIGTERM/SIGHUP stop the build like Ctrl-C: its make and compiler are killed, the
        # claim removed
        with interrupt_on_stop_signals():
            prepared = ensure_prepared(settings.megatron_path, who=who, say=terminal_writer(config))
    except ConfigError as exc:
        message = f"pytest-nvrx: {exc.message_for('plugin')}"
        if workerinput is None:
            raise pytest.UsageError(message) from None
        terminal_writer(config)(message)
        return
    if prepared.line is not None:
        terminal_writer(config)(prepared.line)


def _require_gpu_host(settings: NvrxSettings, scenario: Scenario) -> None:
    """Skip a GPU scenario without a checkout; fail it where a checkout was given but this host
    cannot run GPU scenarios."""
    if not scenario.needs_gpu:
        return
    if settings.megatron_path is None:
        pytest.skip(f"gpu scenario: give {option_hint('megatron-path', 'plugin')}")
    from pytest_nvrx.launch.gpu_slots import gpu_available

    reason = gpu_available()
    if reason is not None:
        # The user asked for a GPU qualification: a host that cannot run it is an error,
        # never a green "skipped" (a CI runner that lost its GPUs must go red).
        pytest.fail(
            f"pytest-nvrx: scenario {scenario.id}: a Megatron checkout was given"
            f" ({settings.megatron_path}) but this host cannot run GPU scenarios: {reason}"
            " (probed with nvidia-smi -L)",
            pytrace=False,
        )


def _under_stop_signals[T](what: str, launch: Callable[[], T]) -> T | str:
    """``launch()`` with SIGTERM (CI cancel, Slurm) and SIGHUP stopping the session like Ctrl-C
    (pytest exits 2) after the runs' whole trees are stopped and result.json written; Ctrl-C
    works even where pytest was started with SIGINT ignored (a background job). A ConfigError
    comes back as the one line to show, ``pytest-nvrx: <what>: ...``, its fix-it hint in the
    plugin's spelling (--nvrx-*, ini nvrx_*), never also the CLI's; the caller fails with it
    outside the handler, so that the report shows the message once."""
    from pytest_nvrx.launch.stop_signals import interrupt_on_stop_signals

    with interrupt_on_stop_signals():
        try:
            return launch()
        except ConfigError as exc:
            message = exc.message_for("plugin")
    return f"pytest-nvrx: {what}: {message}"


def _run_scenario(
    request: pytest.FixtureRequest, settings: NvrxSettings, scenario: Scenario
) -> Iterator[ScenarioRun]:
    config = request.config
    refused = config.stash.get(REFUSED_KEY, None)
    if refused is not None:
        pytest.fail(refused, pytrace=False)
    _require_gpu_host(settings, scenario)
    work_dir = _work_dir(request, settings, scenario)
    write = terminal_writer(config)
    baselines = config.stash.setdefault(BASELINES_KEY, {})

    def launch() -> ScenarioRun:
        from pytest_nvrx.session.scenario_run import run_scenario

        pool = _pool_for(request, settings, scenario)
        if pool is not None and scenario in pool:
            return pool.run(scenario, baselines=baselines)
        progress = progress_writer(config)
        return run_scenario(
            settings, scenario, work_dir, baselines=baselines, write=write, progress=progress
        )

    run = _under_stop_signals(f"scenario {scenario.id}", launch)
    if isinstance(run, str):
        pytest.fail(run, pytrace=False)
    record_judged(config, run)
    yield run
    # Passed or failed, the run dir stays: the summary and JUnit name it and every verdict
    # quotes lines in it. Only checkpoint payload goes, and only from the directory we made
    # under pytest's tmp; --nvrx-keep keeps it, a user's --nvrx-work-dir is left as it is.
    # Unlinking GBs of shards takes seconds: it runs beside the next scenario, and the session
    # waits for it at its end (pytest_sessionfinish), where each scenario's line is written.
    _prune(config, settings, run, work_dir)


class _Pruning:
    """A scenario's checkpoint payload being removed in a thread of its own."""

    def __init__(self, run: ScenarioRun, work_dir: Path) -> None:
        self.key = run.key
        self.line: str | None = None
        self.thread = threading.Thread(
            target=self._prune, args=(run, work_dir), name=f"nvrx-prune-{run.key}"
        )
        self.thread.start()

    def _prune(self, run: ScenarioRun, work_dir: Path) -> None:
        from pytest_nvrx.launch.retention import prune_checkpoint_payload

        try:
            pruned = prune_checkpoint_payload(run.layout, owned_root=work_dir)
            self.line = f"{pruned.describe()} (--nvrx-keep keeps everything)"
        except Exception as exc:  # reported, never lost: the evidence is what matters
            self.line = f"checkpoint payload not removed: {type(exc).__name__}: {exc}"


def _prune_in_background(config: pytest.Config, run: ScenarioRun, work_dir: Path) -> None:
    config.stash.setdefault(PRUNING_KEY, []).append(_Pruning(run, work_dir))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Wait for the payload removals still running; say what each removed."""
    pending = session.config.stash.get(PRUNING_KEY, [])
    if not pending:
        return
    write = terminal_writer(session.config)
    for pruning in pending:
        pruning.thread.join()
        if pruning.line is not None:
            write(f"nvrx {pruning.key}: {pruning.line}")
    pending.clear()


def scenario_key(item: pytest.Item) -> str | None:
    """The key of the run a test item reads (a scenario's id, a self-test run's id, or
    EXISTING_RUN), None for an item of neither fixture."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    if SCENARIO_FIXTURE in callspec.params:
        from pytest_nvrx.session.scenario_run import EXISTING_RUN

        scenario: Scenario | None = callspec.params[SCENARIO_FIXTURE]
        return EXISTING_RUN if scenario is None else scenario.id
    if SELFTEST_FIXTURE in callspec.params:
        return str(callspec.params[SELFTEST_FIXTURE].id)
    return None


def run_of(item: pytest.Item) -> ScenarioRun | None:
    """The judged run a test item of a scenario (or of a self-test run) shares, None for other
    items or while none is judged (its fixture failed or skipped)."""
    key = scenario_key(item)
    if key is None:
        return None
    return item.config.stash.get(RUNS_KEY, {}).get(key)


def selftest_outcome_of(config: pytest.Config, key: str) -> PlantOutcome | None:
    """What the self-test run ``key`` showed, None for a run of no self-test."""
    return config.stash.get(SELFTEST_OUTCOMES_KEY, {}).get(key)


def _work_dir(request: pytest.FixtureRequest, settings: NvrxSettings, scenario: Scenario) -> Path:
    """The scenario's work dir: --nvrx-work-dir, else one made for it under pytest's tmp."""
    if settings.work_dir is not None:
        return settings.work_dir
    made = request.config.stash.setdefault(WORK_DIRS_KEY, {})
    if scenario.id not in made:
        factory = request.getfixturevalue("tmp_path_factory")
        made[scenario.id] = factory.mktemp(f"nvrx-{scenario.id}")
    return made[scenario.id]


def _session_scenarios(
    session: pytest.Session, workload: str, fixture: str = SCENARIO_FIXTURE
) -> list[Scenario]:
    """The scenarios of ``workload`` this session's (selected) tests give ``fixture`` (the
    scenario runs', or the self-test's), in test order."""
    from pytest_nvrx.session.scenarios import Scenario

    seen: dict[str, Scenario] = {}
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        scenario = callspec.params.get(fixture) if callspec is not None else None
        if isinstance(scenario, Scenario) and scenario.workload == workload:
            seen.setdefault(scenario.id, scenario)
    return list(seen.values())


def refuse_infeasible(session: pytest.Session) -> None:
    """Before anything launches: a selected scenario whose run timeout cannot fit the least time
    its faults need to be detected and recovered (settings/feasibility.py) makes the session a
    usage error naming it, in the plugin's spelling. On an xdist worker, where a usage error
    would end the worker as a crash, every scenario of the session fails with that line instead,
    before its launch (each worker collects, and so refuses, the same scenarios). Scenarios that
    will be skipped (megatron without a checkout) are not judged; one that breaks another rule
    is left to its launch, which refuses it with that rule's own message."""
    callspecs = [getattr(item, "callspec", None) for item in session.items]
    ours = [c.params for c in callspecs if c is not None]
    if not any(SCENARIO_FIXTURE in params for params in ours):
        return  # nothing of ours selected: the environment is not even read, nothing imported
    from pytest_nvrx.session.scenario_run import scenario_config, scenario_timeout
    from pytest_nvrx.session.scenarios import Scenario

    scenarios: dict[str, Scenario] = {}
    for params in ours:
        scenario = params.get(SCENARIO_FIXTURE)
        if isinstance(scenario, Scenario):
            scenarios.setdefault(scenario.id, scenario)
    if not scenarios:
        return
    settings = nvrx_settings(session.config)
    work_dir = settings.work_dir or Path.cwd()  # a config to check: nothing is written there
    for scenario in scenarios.values():
        if scenario.needs_gpu and settings.megatron_path is None:
            continue
        try:
            config = scenario_config(settings, scenario, work_dir)
            validate(config)
        except ConfigError:
            continue
        try:
            check_run_timeout(config, scenario_timeout(settings, scenario))
        except ConfigError as exc:
            message = f"pytest-nvrx: scenario {scenario.id}: {exc.message_for('plugin')}"
            if hasattr(session.config, "workerinput"):
                session.config.stash[REFUSED_KEY] = message
                return
            raise pytest.UsageError(message) from None


def _pool_for(
    request: pytest.FixtureRequest, settings: NvrxSettings, scenario: Scenario
) -> ScenarioPool | None:
    """The pool of ``scenario``'s workload, made on the first ask: every scenario of that
    workload in the session is submitted then (--nvrx-parallel; None: one after the other).
    Under pytest-xdist a workload's scenarios all run on one worker (xdist_support), so the
    worker that asks first runs them all. The caller has checked that this workload can run
    here (a GPU and a checkout for megatron): that holds for all its scenarios alike."""
    from pytest_nvrx.launch.gpu_slots import visible_gpus
    from pytest_nvrx.session.scenario_pool import ScenarioPool, parallel_limit

    pools = request.config.stash.setdefault(POOLS_KEY, {})
    if scenario.workload in pools:
        return pools[scenario.workload]
    scenarios = _session_scenarios(request.session, scenario.workload) or [scenario]
    gpus = visible_gpus() if scenario.needs_gpu else []
    limit = parallel_limit(settings, scenarios, gpus)
    pool: ScenarioPool | None = None
    if limit > 1 and len(scenarios) > 1:
        write = terminal_writer(request.config)
        pool = ScenarioPool(
            settings,
            max_parallel=limit,
            write=write,
            gpus=gpus,
            progress=progress_writer(request.config),
        )
        request.config.add_cleanup(pool.stop)
        for each in scenarios:
            pool.submit(each, _work_dir(request, settings, each))
        write(
            f"nvrx {scenario.workload}: {len(scenarios)} scenarios, up to {limit} at once"
            + (f" on GPUs {','.join(gpus)} (share {settings.gpu_share})" if gpus else "")
        )
    pools[scenario.workload] = pool
    return pool


def _run_selftest(
    request: pytest.FixtureRequest, settings: NvrxSettings, workload: WorkloadKind
) -> SelftestResult | str:
    """The self-test of ``workload``: the control and the plants whose tests are selected (the
    control always: the plants are judged against a stack it shows qualifies, and the seeded
    ones start from its checkpoint), through the CLI's core; or why it did not run."""
    from pytest_nvrx.selftest.run import run_selftest, selftest_scenarios

    config = request.config
    selected = {s.id for s in _session_scenarios(request.session, workload, SELFTEST_FIXTURE)}
    plants = tuple(p for p in PLANTS if f"{workload}-selftest-{p.name}" in selected)
    work_dir = _selftest_work_dir(request, settings, workload)
    write = terminal_writer(config)
    names = ", ".join(["control", *(p.name for p in plants)])
    write(f"nvrx {workload} self-test: {names} (runs in {work_dir})")
    progress = progress_writer(config)
    result = _under_stop_signals(
        f"self-test of {workload}",
        lambda: run_selftest(
            settings, workload, work_dir, plants=plants, write=write, progress=progress
        ),
    )
    if isinstance(result, str):
        return result
    outcomes = config.stash.setdefault(SELFTEST_OUTCOMES_KEY, {})
    for scenario, outcome in zip(
        selftest_scenarios(workload, plants), result.outcomes, strict=True
    ):
        outcomes[scenario.id] = outcome
    for key, run in result.runs.items():
        record_judged(config, run)
        if key not in selected:
            # the control of a session whose -k left its test out: no report reads it
            _prune(config, settings, run, work_dir)
    return result


def _selftest_work_dir(
    request: pytest.FixtureRequest, settings: NvrxSettings, workload: str
) -> Path:
    """The work dir of a workload's self-test runs: --nvrx-work-dir, else one made under
    pytest's tmp for them all."""
    if settings.work_dir is not None:
        return settings.work_dir
    made = request.config.stash.setdefault(WORK_DIRS_KEY, {})
    key = f"{workload}-selftest"
    if key not in made:
        made[key] = request.getfixturevalue("tmp_path_factory").mktemp(f"nvrx-{key}")
    return made[key]


def _prune(config: pytest.Config, settings: NvrxSettings, run: ScenarioRun, work_dir: Path) -> None:
    """Remove a judged run's checkpoint payload in the background, unless --nvrx-keep or the
    work dir is the user's (--nvrx-work-dir)."""
    if not settings.keep and settings.work_dir is None:
        _prune_in_background(config, run, work_dir)


def _selftest_of(
    request: pytest.FixtureRequest, settings: NvrxSettings, workload: WorkloadKind
) -> SelftestResult:
    """The session's self-test of ``workload``, run by the first of its tests to ask; a self-test
    that could not run fails each of its tests with the same message (it is not run again)."""
    done = request.config.stash.setdefault(SELFTESTS_KEY, {})
    if workload not in done:
        try:
            done[workload] = _run_selftest(request, settings, workload)
        except Exception as exc:
            # the first test shows the traceback; the others this line, not a second self-test
            done[workload] = f"pytest-nvrx: self-test of {workload}: {type(exc).__name__}: {exc}"
            raise
    found = done[workload]
    if isinstance(found, str):
        pytest.fail(found, pytrace=False)
    return found


@pytest.fixture(scope="session")
def nvrx_selftest_outcome(request: pytest.FixtureRequest) -> Iterator[PlantOutcome]:
    """What one self-test run showed (the control qualified, a plant caught, ...); the self-test
    of its workload runs once, for all of them. Parametrized by the plugin (--nvrx-selftest)."""
    settings = nvrx_settings(request.config)
    scenario: Scenario = request.param
    _require_gpu_host(settings, scenario)
    result = _selftest_of(request, settings, scenario.workload)
    outcome = selftest_outcome_of(request.config, scenario.id)
    if outcome is None:
        pytest.fail(f"pytest-nvrx: the self-test of {result.workload} ran no {scenario.id}")
    yield outcome
    # the run's payload goes after its test's report (which reads its evidence) was made, and
    # only now: run_selftest had finished every run, so no seeded plant needs the control's
    # checkpoint any more
    run = result.runs.get(scenario.id)
    if run is not None:
        work_dir = _selftest_work_dir(request, settings, scenario.workload)
        _prune(request.config, settings, run, work_dir)


@pytest.fixture(scope="session")
def nvrx_scenario_run(request: pytest.FixtureRequest) -> Iterator[ScenarioRun]:
    """The scenario's run, launched once and judged; shared by all its criteria tests."""
    settings = nvrx_settings(request.config)
    scenario: Scenario | None = request.param
    if scenario is None:
        from pytest_nvrx.session.scenario_run import judge_existing

        assert settings.run_dir is not None
        run = judge_existing(settings.run_dir, settings, terminal_writer(request.config))
        record_judged(request.config, run)
        yield run
        return
    yield from _run_scenario(request, settings, scenario)
