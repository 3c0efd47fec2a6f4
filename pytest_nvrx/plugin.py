"""pytest hooks: options, markers, header, scenario parametrization, reports. Glue only.

Settings resolve as option > walkthrough environment variable > ini value > scenario default.
Nothing here needs a GPU: GPU scenarios are skipped at setup with a reason, so ``--help`` and
``--collect-only`` work anywhere.
"""

from __future__ import annotations

from collections.abc import Generator
from importlib import metadata
from typing import Any

import pytest

from pytest_nvrx.fixtures import (
    JUDGED_KEY,
    WORKEROUTPUT_JUDGED,
    nvrx_settings,
    resolve_settings,
    terminal_writer,
)
from pytest_nvrx.layout import FAULT_WINDOWS, INJECTED_FAULTS, windows_of
from pytest_nvrx.scenario_run import EXISTING_RUN, ScenarioRun
from pytest_nvrx.scenarios import matrix_scenarios
from pytest_nvrx.settings import PLUGIN_SETTINGS

# the fixtures (and the session state the hooks share with them); that module imports nothing
# from this one
pytest_plugins = ["pytest_nvrx.fixtures"]

SCENARIO_FIXTURE = "nvrx_scenario_run"


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
                metavar=setting.name.split("-")[-1].upper(),
                help=text,
            )
            parser.addini(setting.ini, text, default=None)


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
        f"{', '.join(windows_of(fault))}"
        for fault in INJECTED_FAULTS
    },
    **{window: f"scenario window: {WINDOW_HELP[window]}" for window in FAULT_WINDOWS},
}


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
    resolve_settings(config, env=False)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``-n N`` (``--dist load``, xdist's default, or ``loadgroup``): one workload's
    scenarios on one worker, every other test as ``load`` would (pytest_nvrx.xdist_support).
    Other ``--dist`` modes are the user's choice and left alone."""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from pytest_nvrx.xdist_support import ScenarioScheduling

    return ScenarioScheduling(config, log)


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def header_lines(config: pytest.Config) -> list[str]:
    """What the session runs on: versions, the workers' stack for a GPU qualification, where."""
    s = nvrx_settings(config)
    import platform

    versions = ", ".join(
        f"{label} {_dist_version(dist)}"
        for label, dist in (
            ("torch", "torch"),
            ("nvrx", "nvidia-resiliency-ext"),
            ("megatron-core", "megatron-core"),
            ("TE", "transformer-engine"),
            ("apex", "apex"),
        )
    )
    lines = [f"nvrx: python {platform.python_version()}, {versions}"]
    if s.megatron_path is not None and s.run_dir is None:
        # A GPU qualification: the full stack of the workers' interpreter (one ~6 s probe,
        # reused by the scenarios), Megatron's version and revision included. Without a
        # Megatron path (CPU reference runs) each scenario still prints its stack.
        from pytest_nvrx.stack import detect_stack, format_stack_line

        lines.append(format_stack_line(detect_stack(s.megatron_path)))
    where = f"megatron: {s.megatron_path or 'not given'}, work dir: {s.work_dir or 'pytest tmp'}"
    if s.run_dir is not None:
        where += f", judging existing run: {s.run_dir}"
    lines.append(f"nvrx: {where}")
    return lines


HEADER_KEY = pytest.StashKey[bool]()


def _print_header_once(config: pytest.Config) -> None:
    """The header, printed once scenarios are known to be collected (not in pytest's report
    header, which every session prints before collection)."""
    if config.stash.get(HEADER_KEY, False):
        return
    config.stash[HEADER_KEY] = True
    write = terminal_writer(config)
    for line in header_lines(config):
        write(line)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object | None) -> None:
    """A worker's judged runs, for the controller's summary and its "nothing qualified" rule."""
    output = getattr(node, "workeroutput", {})
    if output.get(WORKEROUTPUT_SELECTED):
        node.config.stash[REMOTE_SELECTED_KEY] = True
    node.config.stash.setdefault(REMOTE_JUDGED_KEY, []).extend(output.get(WORKEROUTPUT_JUDGED, []))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if SCENARIO_FIXTURE not in metafunc.fixturenames:
        return
    try:
        s = nvrx_settings(metafunc.config)
    except pytest.UsageError as exc:
        # a bad environment variable of ours, met now that our scenarios are collected: the
        # message alone, as a collection error of this module
        raise pytest.Collector.CollectError(str(exc)) from None
    if s.run_dir is not None:
        params = [pytest.param(None, id=EXISTING_RUN, marks=pytest.mark.xdist_group("nvrx"))]
    else:
        # One xdist group per workload: a scenario's tests run on one worker, so it launches
        # once per session whatever -n is, and the faulted scenarios find their workload's
        # baseline run (training continuity) on the same worker.
        params = [
            pytest.param(
                sc,
                id=sc.id,
                marks=[
                    *(getattr(pytest.mark, m) for m in sc.markers),
                    pytest.mark.xdist_group(f"nvrx-{sc.workload}"),
                ],
            )
            for sc in matrix_scenarios(s.matrix, s.windows, s.workloads)
        ]
    metafunc.parametrize(SCENARIO_FIXTURE, params, indirect=True, scope="session")


# --- reports ------------------------------------------------------------------------------------

OUTCOMES_KEY = pytest.StashKey[dict[str, bool]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    run: ScenarioRun | None = getattr(item, "funcargs", {}).get(SCENARIO_FIXTURE)
    if run is not None and call.when == "call":
        for key, value in run.junit_properties():
            item.user_properties.append((key, value))
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if run is None:
        return
    outcomes = item.config.stash.setdefault(OUTCOMES_KEY, {})
    if report.failed:
        outcomes[run.key] = False
        if call.when == "call":
            for title, text in run.log_tails():
                report.sections.append((title, text))
    else:
        outcomes.setdefault(run.key, True)


#: Under xdist, on the controller: the summary lines of the runs the workers judged.
REMOTE_JUDGED_KEY = pytest.StashKey[list[list[str]]]()
#: Under xdist, on the controller: a worker collected scenarios.
REMOTE_SELECTED_KEY = pytest.StashKey[bool]()
#: Key of an xdist worker's workeroutput: the scenarios it collected.
WORKEROUTPUT_SELECTED = "nvrx_selected"
#: Scenario ids selected to run in this session (after -m/-k deselection).
SELECTED_KEY = pytest.StashKey[list[str]]()


def pytest_collection_finish(session: pytest.Session) -> None:
    selected: list[str] = []
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or SCENARIO_FIXTURE not in callspec.params:
            continue
        scenario = callspec.params[SCENARIO_FIXTURE]
        key = EXISTING_RUN if scenario is None else scenario.id
        if key not in selected:
            selected.append(key)
    config = session.config
    config.stash[SELECTED_KEY] = selected
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        # every xdist worker collects the same items: they tell the controller (its "nothing
        # qualified" rule), and one of them prints the header to the user's terminal
        config.workeroutput[WORKEROUTPUT_SELECTED] = list(selected)  # type: ignore[attr-defined]
        if selected and workerinput.get("workerid") == "gw0":
            _print_header_once(config)
    elif selected:
        _print_header_once(config)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A session that selected scenarios but ran none of them qualified nothing: not green."""
    config = session.config
    if hasattr(config, "workerinput"):
        # an xdist worker sees every selected scenario but runs only its share of them; the
        # controller decides from what all workers judged
        return
    selected = config.stash.get(SELECTED_KEY, [])
    remote = config.stash.get(REMOTE_SELECTED_KEY, False)
    if not (selected or remote) or config.option.collectonly or exitstatus != pytest.ExitCode.OK:
        return
    if JUDGED_KEY in config.stash or config.stash.get(REMOTE_JUDGED_KEY, []):
        return
    write = terminal_writer(config)
    which = f" ({', '.join(selected)})" if selected else ""
    write(
        f"pytest-nvrx: every selected scenario was skipped{which}: nothing was qualified;"
        " exit status 5"
    )
    session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Every judged scenario's verdicts, each with the line that proves it."""
    blocks = [run.summary_lines() for run in config.stash.get(JUDGED_KEY, [])]
    remote: list[list[str]] = config.stash.get(REMOTE_JUDGED_KEY, [])
    blocks.extend(remote)
    if not blocks:
        return
    tr = terminalreporter
    tr.section("nvrx verdicts")
    for block in blocks:
        for line in block:
            tr.write_line(line)
