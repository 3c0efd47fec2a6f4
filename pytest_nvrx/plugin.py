"""pytest hooks: options, markers, header, scenario parametrization, reports. Glue only.

Settings resolve as option > walkthrough environment variable > ini value > scenario default.
Nothing here needs a GPU: GPU scenarios are skipped at setup with a reason, so ``--help`` and
``--collect-only`` work anywhere.

Reports travel the way pytest's own do, so they work under pytest-xdist: the first test report of
each scenario carries the scenario's outcome, summary and (with ``--nvrx-report``) its recovery
report as plain data (``report.nvrx_scenario``; a TestReport's extra attributes survive xdist's
serialization), and :class:`NvrxReporter`, registered on the controller only (as junitxml's
LogXML is), collects them in ``pytest_runtest_logreport``, writes the report at the session's end
and prints the summary (what they add up to, without pytest: session/summary.py).
"""

from __future__ import annotations

import os
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# Only what every session needs (options, markers, the hooks' cheap checks): a project that
# merely has pytest-nvrx installed must not pay for the criteria, the evidence parsers, the
# session's runs or the report (benchmarks/bench_plugin_import.py,
# tests/session/test_plugin_imports.py). They are imported where a scenario of ours or an
# --nvrx-* option needs them.
from pytest_nvrx.fixtures import (
    JUDGED_KEY,
    SCENARIO_FIXTURE,
    SELFTEST_FIXTURE,
    WORKEROUTPUT_JUDGED,
    nvrx_settings,
    prepare_session_checkout,
    refuse_infeasible,
    resolve_settings,
    run_of,
    scenario_key,
    selftest_outcome_of,
    terminal_writer,
)
from pytest_nvrx.layout import FAULT_WINDOWS, INJECTED_FAULTS, windows_of
from pytest_nvrx.settings import (
    PLUGIN_SETTINGS,
    ConfigError,
    NvrxSettings,
    SessionPaths,
)

if TYPE_CHECKING:
    from pytest_nvrx.compare import Side
    from pytest_nvrx.session.scenario_run import ScenarioRun
    from pytest_nvrx.session.scenarios import Scenario
    from pytest_nvrx.session.summary import SessionSummary

# the fixtures (and the session state the hooks share with them); that module imports nothing
# from this one
pytest_plugins = ["pytest_nvrx.fixtures"]

#: the marker of the shipped suite's downtime test, collected only with --nvrx-max-downtime
DOWNTIME_GATE = "nvrx_downtime_gate"
#: the marker of the self-test's runs; the shipped suite's test of them is collected only with
#: --nvrx-selftest
SELFTEST_MARKER = "selftest"
#: the controller's report plugin, by name (config.pluginmanager.get_plugin)
REPORTER_NAME = "nvrx-reporter"

# --- the session's state (config.stash; the fixtures' keys are in fixtures.py) -----------------

#: The header was printed (once per session, by the controller or xdist worker gw0).
HEADER_KEY = pytest.StashKey[bool]()
#: Scenarios whose run-wide JUnit properties were given (to their first testcase), by key.
PROPERTIES_GIVEN_KEY = pytest.StashKey[set[str]]()
#: Scenarios whose entry (outcome, summary, report data) a test report already carries, by key.
SHIPPED_KEY = pytest.StashKey[set[str]]()
#: Under xdist, on the controller: the keys of the runs the workers judged.
REMOTE_JUDGED_KEY = pytest.StashKey[list[str]]()
#: Under xdist, on the controller: a worker collected scenarios.
REMOTE_SELECTED_KEY = pytest.StashKey[bool]()
#: Key of an xdist worker's workeroutput: the scenarios it collected.
WORKEROUTPUT_SELECTED = "nvrx_selected"
#: A test of ours (a scenario's or a self-test run's) was collected, deselected or not (on the
#: xdist controller: by a worker).
COLLECTED_OURS_KEY = pytest.StashKey[bool]()
#: Key of an xdist worker's workeroutput: it collected a test of ours.
WORKEROUTPUT_COLLECTED = "nvrx_collected"
#: Scenario ids selected to run in this session (after -m/-k deselection).
SELECTED_KEY = pytest.StashKey[list[str]]()
#: How many tests -m/-k deselected (pytest's "N deselected", explained in the header).
DESELECTED_KEY = pytest.StashKey[int]()
#: --nvrx-compare's report, read at configure time (on every process: JUnit properties are
#: given where a scenario is judged)
COMPARE_KEY = pytest.StashKey["Side"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Every plugin row of the settings table (pytest_nvrx.settings.SETTINGS): an option and
    its ini mirror with the same help."""
    group = parser.getgroup("nvrx", "fault-recovery qualification (pytest-nvrx)")
    for setting in PLUGIN_SETTINGS:
        text = setting.plugin_help()
        if setting.flag:
            group.addoption(
                setting.plugin_option,
                action="store_true",
                default=None,
                dest=setting.ini,
                help=text,
            )
            parser.addini(setting.ini, text, type="bool", default=False)
        else:
            group.addoption(
                setting.plugin_option,
                dest=setting.ini,
                default=None,
                metavar=setting.metavar,
                help=text,
            )
            parser.addini(setting.ini, text, type=setting.ini_type, default=None)


#: What one rank gets, by fault marker.
FAULT_HELP: dict[str, str] = {
    "kill": "SIGKILL to one rank",
    "hang": "SIGSTOP to one rank (detected by the open section's deadline)",
    "term": "SIGTERM to one rank",
    "segv": "SIGSEGV to one rank (a native crash)",
    "exception": "an uncaught InjectedFault raised on one rank's training thread",
    "ckpt-worker": "SIGKILL to one rank's persistent checkpoint worker while a save is in flight",
}
#: Where the fault lands, by window marker.
WINDOW_HELP: dict[str, str] = {
    "step": "fault in a training step, after a checkpoint completed",
    "save": "fault while checkpoint N is prepared (before its submit), after an earlier one "
    "completed",
    "finalize": "fault after save N was submitted, before its finalization advanced the tracker",
}
MARKERS: dict[str, str] = {
    "gpu": "needs NVIDIA GPUs and a Megatron-LM checkout (--nvrx-megatron-path); skipped with "
    "a reason otherwise",
    "baseline": "uninterrupted scenario, no fault injected",
    **{
        fault: f"scenario with fault {fault}: {FAULT_HELP[fault]}; windows "
        f"{', '.join(windows_of(fault))}; every fault-schedule scenario with this fault too"
        for fault in INJECTED_FAULTS
    },
    **{
        window: f"scenario window: {WINDOW_HELP[window]}; also every fault-schedule scenario"
        " with a fault in that window"
        for window in FAULT_WINDOWS
    },
    "schedule": "a fault-schedule scenario: several faults, one per cycle, each recovery judged "
    "(--nvrx-schedules; docs/windows.md); it carries the markers of all its faults and windows, "
    "so -m kill selects every schedule with a kill",
    "restore": "a fault-schedule scenario with a fault in a replacement while it loads its "
    "checkpoint (window restore)",
    SELFTEST_MARKER: "a self-test run (--nvrx-selftest): the unplanted control, or one planted "
    "recovery bug that its documented criterion must catch (docs/selftest.md)",
    DOWNTIME_GATE: "the scenario's downtime held to --nvrx-max-downtime and --nvrx-max-phase "
    "(collected only when one is given)",
}


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> None:
    """Refuse to judge a run dir from inside it, before pytest reads anything there: pytest
    would load its ``conftest.py`` (code from the run under judgement) and write into it
    (``.pytest_cache``, other plugins' files, ``--debug`` logs)."""
    run_dir = _cli_value(args, "--nvrx-run-dir")
    if run_dir is None:
        return
    here = os.path.realpath(early_config.invocation_params.dir)
    judged = os.path.realpath(os.path.join(here, os.path.expanduser(run_dir)))

    def inside(path: str | os.PathLike[str] | None) -> bool:
        if path is None:
            return False
        real = os.path.realpath(path)
        return real == judged or real.startswith(judged.rstrip(os.sep) + os.sep)

    if inside(here):
        raise pytest.UsageError(
            f"pytest-nvrx: --nvrx-run-dir {run_dir} holds the directory pytest runs in: pytest"
            " would run its conftest.py and write into it (.pytest_cache, ...); run pytest from"
            f" outside it (cd {os.path.dirname(judged)})"
        )
    # pytest takes the option's value for a path of the session before our option exists: a
    # pytest.ini or tox.ini in the run dir then configures the session that judges it
    # (addopts = --nvrx-gate-shared-gpu turned a gated run QUALIFIED)
    for what, path in (("configuration", early_config.inipath), ("rootdir", early_config.rootpath)):
        if inside(path):
            raise pytest.UsageError(
                f"pytest-nvrx: pytest took its {what} from the run dir it judges ({path}): a run"
                " dir must not configure its own judgement; write --nvrx-run-dir=DIR (with '=')"
                " and give pytest its own -c / --rootdir outside it, or judge it with"
                " python -m pytest_nvrx verify DIR (which runs nothing from it)"
            )


def _cli_value(args: Sequence[str], option: str) -> str | None:
    """The last value ``args`` give ``option`` (``--opt V`` or ``--opt=V``), before any ``--``."""
    found = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == option and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(option + "="):
            found = arg[len(option) + 1 :]
    return found


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    # Our scenario tests carry xdist_group marks (see pytest_generate_tests); declare the marker
    # ourselves so --strict-markers accepts them where pytest-xdist is not installed.
    config.addinivalue_line(
        "markers", "xdist_group(name): pytest-xdist sends the tests of one group to one worker"
    )
    # Our own --nvrx-* options and nvrx_* ini values are checked now (a typo is a usage error
    # whatever is collected); the environment only once scenarios are (nvrx_settings).
    settings = resolve_settings(config, env=False)
    refused = output_refusal(config, SessionPaths.of(settings))
    if refused is not None:
        raise pytest.UsageError(f"pytest-nvrx: {refused}")
    if settings.selftest and settings.run_dir is not None:
        raise pytest.UsageError(
            "pytest-nvrx: --nvrx-selftest launches the self-test's runs; it is incompatible with"
            " --nvrx-run-dir (judge an existing run); drop one of them (python -m pytest_nvrx"
            " report DIR... shows a self-test run's outcome)"
        )
    if settings.compare_fail and settings.compare is None:
        raise pytest.UsageError(
            "pytest-nvrx: --nvrx-compare-fail gates the comparison with an earlier report.json;"
            " give that too (--nvrx-compare REPORT_JSON)"
        )
    if settings.compare is not None:
        config.stash[COMPARE_KEY] = previous_report(config, settings.compare, settings.report)
    if not hasattr(config, "workerinput"):
        # the controller (or a session without xdist) collects the scenarios' reports
        config.pluginmanager.register(NvrxReporter(config, settings), REPORTER_NAME)


def previous_report(config: pytest.Config, path: Path, report: Path | None) -> Side:
    """--nvrx-compare's report.json, read now: a file that cannot be compared is a usage error
    before anything launches, and one of the session's own outputs is refused (the report
    would replace last night's before it was read)."""
    from dataclasses import replace

    from pytest_nvrx.compare import CompareInputError, load_side
    from pytest_nvrx.evidence.refs import printable
    from pytest_nvrx.session.output_paths import report_outputs

    here = config.invocation_params.dir
    ours: list[tuple[str, Path | None]] = [("--junitxml", junit_path(config))]
    if report is not None:
        ours += report_outputs(here / report, compare=True)
    for what, out in ours:
        if out is not None and os.path.realpath(out) == os.path.realpath(here / path):
            raise pytest.UsageError(
                f"pytest-nvrx: --nvrx-compare {path} is where {what} is written: the session"
                " would replace the report it compares with; keep last night's elsewhere"
            )
    try:
        side = load_side(here / path, "--nvrx-compare")
    except CompareInputError as exc:
        raise pytest.UsageError(printable(f"pytest-nvrx: {exc}")) from None
    return replace(side, label="OLD", source=str(path))


def pytest_unconfigure(config: pytest.Config) -> None:
    reporter = config.pluginmanager.get_plugin(REPORTER_NAME)
    if reporter is not None:
        config.pluginmanager.unregister(reporter)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``-n N`` (``--dist load``, xdist's default, or ``loadgroup``): one workload's
    scenarios on one worker, every other test as ``load`` would
    (pytest_nvrx.session.xdist_scheduling). Other ``--dist`` modes are the user's choice and left
    alone."""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from pytest_nvrx.session.xdist_scheduling import ScenarioScheduling

    return ScenarioScheduling(config, log)


def _print_header_once(config: pytest.Config) -> None:
    """The header, printed once scenarios are known to be collected (not in pytest's report
    header, which every session prints before collection)."""
    if config.stash.get(HEADER_KEY, False):
        return
    config.stash[HEADER_KEY] = True
    from pytest_nvrx.session.header import header_lines, selection_lines

    settings = nvrx_settings(config)
    selected: list[str] = config.stash.get(SELECTED_KEY, [])
    deselected = config.stash.get(DESELECTED_KEY, 0)
    write = terminal_writer(config)
    for line in [*header_lines(settings), *selection_lines(settings, selected, deselected)]:
        write(line)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object | None) -> None:
    """A worker's judged runs, for the controller's summary and its "nothing qualified" rule."""
    output = getattr(node, "workeroutput", {})
    if output.get(WORKEROUTPUT_SELECTED):
        node.config.stash[REMOTE_SELECTED_KEY] = True
    if output.get(WORKEROUTPUT_COLLECTED):
        node.config.stash[COLLECTED_OURS_KEY] = True
    node.config.stash.setdefault(REMOTE_JUDGED_KEY, []).extend(output.get(WORKEROUTPUT_JUDGED, []))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if SELFTEST_FIXTURE in metafunc.fixturenames:
        _parametrize_selftest(metafunc)
    if SCENARIO_FIXTURE not in metafunc.fixturenames:
        return
    try:
        settings = nvrx_settings(metafunc.config)
    except pytest.UsageError as exc:
        # a bad environment variable of ours, met now that our scenarios are collected: the
        # message alone, as a collection error of this module
        raise pytest.Collector.CollectError(str(exc)) from None
    from pytest_nvrx.session.scenario_run import EXISTING_RUN
    from pytest_nvrx.session.scenarios import session_scenarios

    if settings.run_dir is not None:
        params = [pytest.param(None, id=EXISTING_RUN, marks=pytest.mark.xdist_group("nvrx"))]
    else:
        # One xdist group per workload: a scenario's tests run on one worker, so it launches
        # once per session whatever -n is, and the faulted scenarios find their workload's
        # baseline run (training continuity) on the same worker.
        params = [_scenario_param(sc) for sc in session_scenarios(settings)]
    metafunc.parametrize(SCENARIO_FIXTURE, params, indirect=True, scope="session")


def _scenario_param(sc: Scenario) -> Any:
    """A scenario as a parameter: its id, its markers, its workload's xdist group."""
    marks = [
        *(getattr(pytest.mark, m) for m in sc.markers),
        pytest.mark.xdist_group(f"nvrx-{sc.workload}"),
    ]
    return pytest.param(sc, id=sc.id, marks=marks)


def _parametrize_selftest(metafunc: pytest.Metafunc) -> None:
    """One test per self-test run of each selected workload, in the catalogue's order, in its
    workload's xdist group (the self-test runs once, on the worker that has all its tests)."""
    from pytest_nvrx.selftest.run import selftest_scenarios
    from pytest_nvrx.session.scenarios import WORKLOAD_ORDER

    try:
        settings = nvrx_settings(metafunc.config)
    except pytest.UsageError as exc:
        raise pytest.Collector.CollectError(str(exc)) from None
    params = [
        _scenario_param(sc)
        for workload in WORKLOAD_ORDER
        if workload in settings.workloads
        for sc in selftest_scenarios(workload)
    ]
    metafunc.parametrize(SELFTEST_FIXTURE, params, indirect=True, scope="session")


# --- reports ------------------------------------------------------------------------------------


def _marked(obj: object, name: str) -> bool:
    return any(getattr(m, "name", None) == name for m in getattr(obj, "pytestmark", []))


def _requests(obj: object, fixture: str) -> bool:
    """Whether a test function takes ``fixture`` as an argument."""
    code = getattr(obj, "__code__", None)
    if code is None:
        return False
    return fixture in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> Any:
    """The downtime gate's tests exist only when a limit is given, the self-test's only with
    --nvrx-selftest: otherwise they are not collected at all (neither counted nor "deselected":
    nothing the user asked for is left out)."""
    gate, selftest = _marked(obj, DOWNTIME_GATE), _requests(obj, SELFTEST_FIXTURE)
    if not (gate or selftest):
        return None
    try:
        settings = nvrx_settings(collector.config)
    except pytest.UsageError:
        return None  # pytest_generate_tests reports it as this module's collection error
    if selftest:
        return None if settings.selftest else []
    from pytest_nvrx.session.scenario_run import Limits

    return None if Limits.of(settings).given else []


def _junit_properties(item: pytest.Item, run: ScenarioRun) -> list[tuple[str, str]]:
    """The run's own properties on its first testcase, its run dir on the others; a criterion's
    testcase also gets its verdict, the downtime test the measured value and the limit."""
    from pytest_nvrx.criteria import CRITERIA_IDS
    from pytest_nvrx.session import junit
    from pytest_nvrx.session.scenario_run import Limits

    given = item.config.stash.setdefault(PROPERTIES_GIVEN_KEY, set())
    outcome = selftest_outcome_of(item.config, run.key)
    if run.key not in given:
        given.add(run.key)
        # a self-test run is held to no time limit (session/console.py)
        limits = Limits.of(nvrx_settings(item.config)) if outcome is None else None
        props = junit.run_properties(run, limits) + _compare_properties(item.config, run)
    else:
        props = [("nvrx_run_dir", str(run.layout.run_dir))]
    callspec = getattr(item, "callspec", None)
    criterion = callspec.params.get("criterion") if callspec is not None else None
    if criterion in CRITERIA_IDS:
        props += junit.criterion_properties(run, str(criterion))
    if outcome is not None:
        props += junit.selftest_properties(outcome)
    if item.get_closest_marker(DOWNTIME_GATE) is not None:
        props += junit.downtime_properties(run, Limits.of(nvrx_settings(item.config)))
    return props


def _compare_properties(config: pytest.Config, run: ScenarioRun) -> list[tuple[str, str]]:
    """The scenario against --nvrx-compare's report (nvrx_compare_*); none without it."""
    previous = config.stash.get(COMPARE_KEY, None)
    if previous is None or selftest_outcome_of(config, run.key) is not None:
        return []
    from pytest_nvrx.compare.session import scenario_properties
    from pytest_nvrx.session.scenario_run import Limits

    settings = nvrx_settings(config)
    try:
        report = run.report(Limits.of(settings))
        return scenario_properties(
            previous, report, settings.compare_fail, gate_noise=settings.gate_shared_gpu
        )
    except Exception as exc:  # a comparison bug must not cost the qualification: say it
        return [("nvrx_compare_error", f"{type(exc).__name__}: {exc}")]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    run = run_of(item)
    if run is None:
        yield  # not a test of ours
        return
    from pytest_nvrx.evidence.refs import printable

    if call.when == "call":
        # JUnit text, like the terminal's, shows the run's control characters escaped
        item.user_properties.extend(
            (name, printable(value)) for name, value in _junit_properties(item, run)
        )
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    shipped = item.config.stash.setdefault(SHIPPED_KEY, set())
    if run.key not in shipped:
        # the scenario's first report (its run just ended): the outcome now, and the entry for
        # the controller's summary and report
        shipped.add(run.key)
        from pytest_nvrx.session.console import scenario_entry
        from pytest_nvrx.session.scenario_run import Limits

        settings = nvrx_settings(item.config)
        entry = scenario_entry(
            run,
            Limits.of(settings),
            selftest_outcome_of(item.config, run.key),
            with_report=settings.report is not None or settings.compare is not None,
        )
        report.nvrx_scenario = entry  # type: ignore[attr-defined]
        terminal_writer(item.config)(entry["outcome"])


def _cache_dir(config: pytest.Config) -> Path | None:
    """Where pytest's cache plugin will write (its ``cache_dir`` rule), None without it."""
    if not config.pluginmanager.has_plugin("cacheprovider"):
        return None
    named = Path(os.path.expanduser(os.path.expandvars(str(config.getini("cache_dir")))))
    return named if named.is_absolute() else config.rootpath / named


def output_refusal(config: pytest.Config, paths: SessionPaths) -> str | None:
    """Why the session's outputs (``paths``' and --junitxml) must not be written
    (session/output_paths.py), pytest's own where pytest will write them. --junitxml's
    directory is checked in every session; the rest only where there is an output or evidence
    of ours."""
    junit = junit_path(config)
    if junit is not None and junit.parent.exists() and not junit.parent.is_dir():
        return f"--junitxml {junit}: {junit.parent} is not a directory; give another path"
    if paths.empty():
        return None  # no output of ours, no evidence to keep pytest's outputs out of
    from pytest_nvrx.session import output_paths

    here = config.invocation_params.dir
    return output_paths.output_refusal(here, paths, junit=junit, cache=_cache_dir(config))


def junit_path(config: pytest.Config) -> Path | None:
    """Where pytest's junitxml will write, found as it finds it (``$VAR`` and ``~`` expanded,
    then made absolute and normalized): checked as it will be written."""
    xmlpath = getattr(config.option, "xmlpath", None)
    if not xmlpath:
        return None
    here = config.invocation_params.dir
    expanded = os.path.expanduser(os.path.expandvars(xmlpath))
    return Path(os.path.normpath(os.path.join(here, expanded)))


class NvrxReporter:
    """The scenarios' outcomes and recovery report, on the controller (as junitxml's LogXML):
    fed from test reports, written at the session's end (--nvrx-report), announced in the
    terminal summary. What they add up to is session/summary.py's (made at the first entry, or
    where the session's end needs it: a session without our scenarios imports nothing); here,
    pytest's side: the exit status and the terminal."""

    def __init__(self, config: pytest.Config, settings: NvrxSettings) -> None:
        self.config = config
        self.settings = settings
        self.summary: SessionSummary | None = None

    def _summary(self) -> SessionSummary:
        if self.summary is None:
            from pytest_nvrx.session.summary import SessionSummary

            path = self.settings.report
            html = None if path is None else self.config.invocation_params.dir / path
            self.summary = SessionSummary(html)
        return self.summary

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = getattr(report, "nvrx_scenario", None)
        if entry is not None:
            self._summary().add(entry)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """The session's status from what was qualified, then the report."""
        summary, ok = self.summary, session.exitstatus == pytest.ExitCode.OK
        if summary is not None and ok and summary.fail_unqualified():
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self._fail_nothing_qualified(session)
        previous = self.config.stash.get(COMPARE_KEY, None)
        if summary is not None and previous is not None and not self.config.option.collectonly:
            passed = session.exitstatus == pytest.ExitCode.OK
            rules, noise = self.settings.compare_fail, self.settings.gate_shared_gpu
            verbose = self.config.get_verbosity() >= 1
            if summary.compare(previous, rules, gate_noise=noise, verbose=verbose, passed=passed):
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.settings.report is not None and not self.config.option.collectonly:
            summary = self._summary()
            compare = summary.comparison is not None
            status = summary.write_report(
                lambda judged: output_refusal(
                    self.config, SessionPaths(summary.html, judged=judged, compare=compare)
                )
            )
            if status == "refused":
                session.exitstatus = pytest.ExitCode.USAGE_ERROR
            elif status == "failed":
                session.exitstatus = pytest.ExitCode.INTERNAL_ERROR

    def _fail_nothing_qualified(self, session: pytest.Session) -> None:
        """A session that selected scenarios but ran none of them qualified nothing: not green.
        (Here, on the controller: an xdist worker sees every selected scenario but runs only its
        share of them; the controller decides from what all workers judged.)"""
        config = session.config
        selected = config.stash.get(SELECTED_KEY, [])
        remote = config.stash.get(REMOTE_SELECTED_KEY, False)
        if not (selected or remote) or config.option.collectonly:
            return
        if session.exitstatus != pytest.ExitCode.OK:
            return
        if JUDGED_KEY in config.stash or config.stash.get(REMOTE_JUDGED_KEY, []):
            return
        which = f" ({', '.join(selected)})" if selected else ""
        terminal_writer(config)(
            f"pytest-nvrx: every selected scenario was skipped{which}: nothing was qualified;"
            " exit status 5"
        )
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int) -> None:
        """The summary's (session/summary.py: the verdicts of every scenario that did not
        qualify, the closing table, where the outputs went), after the one line for a session
        given --nvrx-* options that collected nothing: how to collect the scenarios."""
        hint = suite_hint(self.config, exitstatus)
        if hint is not None:
            terminalreporter.write_line(hint, yellow=True, bold=True)
        judged: list[ScenarioRun] = self.config.stash.get(JUDGED_KEY, [])
        if self.summary is None and not judged:
            return  # nothing of ours to say (a project's own session: nothing imported)
        from pytest_nvrx.session.scenario_run import Limits

        limits = Limits.of(nvrx_settings(self.config)) if judged else None
        self._summary().write_terminal(
            terminalreporter,
            judged,
            limits,
            verbosity=self.config.get_verbosity(),
            width=self.config.get_terminal_writer().fullwidth,
            junit=junit_path(self.config),
        )


def pytest_itemcollected(item: pytest.Item) -> None:
    if scenario_key(item) is not None:
        item.config.stash[COLLECTED_OURS_KEY] = True


def options_given(config: pytest.Config) -> list[str]:
    """The --nvrx-* options on the command line (ini values and the environment aside)."""
    return [s.plugin_option for s in PLUGIN_SETTINGS if config.getoption(s.ini, None) is not None]


def suite_hint(config: pytest.Config, exitstatus: int) -> str | None:
    """The one line for a session given --nvrx-* options that collected nothing, none of ours
    among it: the shipped scenarios are a package, collected only with --pyargs (``pytest -m
    gpu --nvrx-megatron-path X`` from a project's directory collected 0 items, exit 5, no
    word why)."""
    if exitstatus != pytest.ExitCode.NO_TESTS_COLLECTED:
        return None
    given = options_given(config)
    if not given or config.stash.get(COLLECTED_OURS_KEY, False):
        return None
    return (
        f"pytest-nvrx: {', '.join(given)} given, but no pytest-nvrx scenario was collected: add"
        " --pyargs pytest_nvrx.suite to collect them (pytest --pyargs pytest_nvrx.suite -m gpu"
        " --nvrx-megatron-path PATH)"
    )


def pytest_deselected(items: Sequence[pytest.Item]) -> None:
    if items:
        config = items[0].config
        config.stash[DESELECTED_KEY] = config.stash.get(DESELECTED_KEY, 0) + len(items)


def _item_scenarios(items: Sequence[pytest.Item]) -> list[Scenario]:
    """The scenarios (and self-test runs) the items read, once each, in order."""
    callspecs = [getattr(item, "callspec", None) for item in items]
    ours = [
        c.params[fixture]
        for c in callspecs
        if c is not None
        for fixture in (SCENARIO_FIXTURE, SELFTEST_FIXTURE)
        if fixture in c.params
    ]
    if not ours:
        return []  # a session without our tests imports nothing of the scenarios
    from pytest_nvrx.session.scenarios import Scenario

    scenarios: dict[str, Scenario] = {}
    for scenario in ours:
        if isinstance(scenario, Scenario):
            scenarios.setdefault(scenario.id, scenario)
    return list(scenarios.values())


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: Sequence[str]) -> None:
    """Under xdist the controller holds the selected scenarios to the rules, from the test ids
    a worker collected (a worker's usage error would crash it): before any is scheduled."""
    from pytest_nvrx.selftest.run import selftest_scenarios
    from pytest_nvrx.session.scenarios import WORKLOAD_ORDER, session_scenarios

    config = node.config
    try:
        settings = nvrx_settings(config)
    except pytest.UsageError:
        return  # a bad value of the environment: the workers' collection error
    known = {sc.id: sc for sc in session_scenarios(settings)}
    known.update(
        (sc.id, sc)
        for w in WORKLOAD_ORDER
        if w in settings.workloads
        for sc in selftest_scenarios(w)
    )
    scenarios: dict[str, Scenario] = {}
    for nodeid in ids:
        param = nodeid.rpartition("[")[2].rstrip("]")
        # test_recovery_criterion[<scenario>-<criterion>]: criterion ids hold no hyphen
        scenario = known.get(param) or known.get(param.rpartition("-")[0])
        if scenario is not None:
            scenarios.setdefault(scenario.id, scenario)
    _check_scenarios(config, list(scenarios.values()))


def _check_scenarios(config: pytest.Config, scenarios: Sequence[Scenario]) -> None:
    """The selected scenarios' settings held to the walkthrough's rules now, once -k and -m
    chose them and before anything launches: a value they break is the usage error every bad
    option gets (exit 4), not an error of each scenario's run."""
    if not scenarios:
        return
    from pytest_nvrx.session.scenario_run import check_scenarios

    try:
        settings = nvrx_settings(config)
    except pytest.UsageError:
        return  # a bad value of the environment: already its module's collection error
    # a GPU scenario without a Megatron checkout is skipped when it runs, never launched
    runnable = [s for s in scenarios if not (s.needs_gpu and settings.megatron_path is None)]
    # only the form of the work dir is a rule: the scenarios' own are made when they run
    work_dir = settings.work_dir or config.rootpath
    try:
        check_scenarios(settings, runnable, work_dir)
    except ConfigError as exc:
        raise pytest.UsageError(f"pytest-nvrx: {exc.message_for('plugin')}") from None


def pytest_collection_finish(session: pytest.Session) -> None:
    refuse_infeasible(session)
    selected: list[str] = []
    for item in session.items:
        key = scenario_key(item)
        if key is not None and key not in selected:
            selected.append(key)
    config = session.config
    if not hasattr(config, "workerinput"):
        # (an xdist worker leaves it to the controller: pytest_xdist_node_collection_finished)
        _check_scenarios(config, _item_scenarios(session.items))
    config.stash[SELECTED_KEY] = selected
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        # every xdist worker collects the same items: they tell the controller (its "nothing
        # qualified" rule), and one of them prints the header to the user's terminal
        config.workeroutput[WORKEROUTPUT_SELECTED] = list(selected)  # type: ignore[attr-defined]
        config.workeroutput[WORKEROUTPUT_COLLECTED] = config.stash.get(  # type: ignore[attr-defined]
            COLLECTED_OURS_KEY, False
        )
        if selected and workerinput.get("workerid") == "gw0":
            _print_header_once(config)
            prepare_session_checkout(config, session.items)
    elif selected:
        _print_header_once(config)
        prepare_session_checkout(config, session.items)
