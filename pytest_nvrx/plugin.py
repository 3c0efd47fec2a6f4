"""pytest hooks: options, markers, header, scenario parametrization, reports. Glue only.

Settings resolve as option > walkthrough environment variable > ini value > scenario default.
Nothing here needs a GPU: GPU scenarios are skipped at setup with a reason, so ``--help`` and
``--collect-only`` work anywhere.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.layout import FAULT_WINDOWS, INJECTED_FAULTS, windows_of
from pytest_nvrx.scenarios import (
    MATRIX_ENV,
    WINDOW_ENV,
    Scenario,
    default_text,
    matrix_scenarios,
    parse_matrix,
    parse_windows,
)
from pytest_nvrx.settings import (
    ENV_VARS,
    WORKLOAD_KINDS,
    ConfigError,
    SectionTimeouts,
    default_launcher,
    parse_rtol,
    parse_value,
)

pytest_plugins = ["pytest_nvrx.fixtures"]

SCENARIO_FIXTURE = "nvrx_scenario_run"


@dataclass(frozen=True)
class Option:
    """One ``--nvrx-*`` option, its ini mirror and (where the walkthrough had one) env var."""

    name: str  # without the --nvrx- prefix
    help: str
    field: str | None = None  # RunConfig field it sets
    flag: bool = False
    env_var: str | None = None  # an environment variable of the plugin's own (not a field's)

    @property
    def dest(self) -> str:
        return "nvrx_" + self.name.replace("-", "_")

    @property
    def env(self) -> str | None:
        if self.env_var is not None:
            return self.env_var
        return ENV_VARS.get(self.field) if self.field else None


OPTIONS: tuple[Option, ...] = (
    Option(
        "megatron-path",
        "Megatron-LM checkout to qualify (enables the gpu scenarios)",
        "megatron_path",
    ),
    Option("work-dir", "absolute directory for run dirs (default: pytest's tmp dir)", "work_dir"),
    Option(
        "workload",
        "megatron | reference: only this workload's scenarios (default: both; "
        "megatron ones skip without a GPU and --nvrx-megatron-path)",
    ),
    Option(
        "matrix",
        "default | full: the fault scenarios per workload (default: every fault and every "
        "window at least once; full: every fault in every window it exists in)",
        env_var=MATRIX_ENV,
    ),
    Option(
        "window",
        "step,save,finalize (one or more, comma-separated): every fault in these windows "
        "instead of the matrix (baselines stay)",
        env_var=WINDOW_ENV,
    ),
    Option("nnodes", "nodes", "nnodes"),
    Option("gpus-per-node", "processes per node", "gpus_per_node"),
    Option("tp", "tensor-parallel size", "tp"),
    Option("pp", "pipeline-parallel size", "pp"),
    Option("train-iters", "training iterations", "train_iters"),
    Option("save-interval", "checkpoint interval in iterations", "save_interval"),
    Option("fault-rank", "rank that receives the fault", "fault_rank"),
    Option(
        "section-timeouts",
        "NVRx section deadlines, all three names, seconds",
        "section_timeouts",
    ),
    Option(
        "out-of-section-timeout",
        "seconds allowed outside sections",
        "out_of_section_timeout",
    ),
    Option("rdzv-endpoint", "rendezvous host:port for multinode runs", "rdzv_endpoint"),
    Option(
        "node-index",
        "this session's node in a multinode run started by hand, one session per node with the "
        "same NVRX_RUN_ID and --nvrx-rdzv-endpoint (0 hosts the rendezvous)",
        "node_index",
    ),
    Option(
        "launcher",
        "local | slurm: ft_launcher started here, or one per node through srun in this "
        "allocation (or one made with salloc); default slurm when --nvrx-nnodes > 1 inside an "
        "allocation, else local",
        "launcher",
    ),
    Option(
        "no-distributed-optimizer",
        "qualify without Megatron's --use-distributed-optimizer",
        flag=True,
    ),
    Option("run-dir", "judge this existing run directory instead of launching"),
    Option("run-timeout", "seconds before a scenario run is killed (megatron 1800, reference 600)"),
    Option(
        "keep",
        "keep the checkpoint shards too (run dirs are always kept; without it their checkpoint "
        "payload is removed, metadata and tracker stay)",
        flag=True,
    ),
    Option(
        "continuity-rtol",
        "relative tolerance of training_continuity for stacks that are not bitwise "
        "deterministic (default 0: exact)",
    ),
)


@dataclass
class NvrxSettings:
    """The resolved plugin settings (stored in config.stash)."""

    overrides: dict[str, Any] = field(default_factory=dict)  # RunConfig fields the user set
    workloads: tuple[str, ...] = WORKLOAD_KINDS
    matrix: str = "default"
    #: None: the matrix decides; else every fault in these windows
    windows: tuple[str, ...] | None = None
    megatron_path: Path | None = None
    work_dir: Path | None = None
    run_dir: Path | None = None
    run_timeout: float | None = None
    keep: bool = False
    continuity_rtol: float = 0.0

    def scenarios(self) -> list[Scenario]:
        return list(matrix_scenarios(self.matrix, self.windows, self.workloads))


SETTINGS_KEY = pytest.StashKey[NvrxSettings]()


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


#: Options whose help shows the scenarios' default (scenarios.default_text: the same text as the
#: default column of docs/options.md, tests/test_plugin.py compares them).
DEFAULTED = (
    "nnodes",
    "gpus_per_node",
    "tp",
    "pp",
    "train_iters",
    "save_interval",
    "fault_rank",
    "section_timeouts",
    "out_of_section_timeout",
    "rdzv_endpoint",
)


def option_help(opt: Option) -> str:
    if opt.field in DEFAULTED:
        return f"{opt.help} (default: {default_text(opt.field)})"
    return opt.help


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nvrx", "fault-recovery qualification (pytest-nvrx)")
    for opt in OPTIONS:
        env = f" [env {opt.env}]" if opt.env else ""
        if opt.flag:
            group.addoption(
                f"--nvrx-{opt.name}",
                action="store_true",
                default=None,
                dest=opt.dest,
                help=opt.help,
            )
            parser.addini(opt.dest, opt.help, type="bool", default=False)
        else:
            group.addoption(
                f"--nvrx-{opt.name}",
                dest=opt.dest,
                default=None,
                metavar=opt.name.split("-")[-1].upper(),
                help=option_help(opt) + env,
            )
            parser.addini(opt.dest, option_help(opt) + env, default=None)


def _lookup(config: pytest.Config, opt: Option, *, env: bool = True) -> tuple[Any, str] | None:
    """The first source that sets ``opt``: option, then env var (unless ``env`` is False), then
    ini. (value, source)."""
    value = config.getoption(opt.dest)
    if value is not None:
        return value, f"--nvrx-{opt.name}"
    if env and opt.env and os.environ.get(opt.env, "") != "":
        return os.environ[opt.env], f"environment variable {opt.env}"
    ini = config.getini(opt.dest)
    if ini not in (None, "", [], False):
        return ini, f"ini value {opt.dest}"
    return None


def resolve_settings(config: pytest.Config, *, env: bool = True) -> NvrxSettings:
    """Resolve and check every option; raise pytest.UsageError that says how to fix it.

    ``env=False`` reads only our own options and ini values (what pytest_configure checks in
    every session); environment variables count only once our scenarios are collected
    (nvrx_settings)."""
    s = NvrxSettings()
    try:
        for opt in OPTIONS:
            found = _lookup(config, opt, env=env)
            if found is None:
                continue
            raw, source = found
            value: Any
            if opt.flag:
                value = bool(raw)
            elif opt.field is not None:
                value = parse_value(opt.field, str(raw), source)
            else:
                value = str(raw)
            if opt.field is not None and opt.field not in ("megatron_path", "work_dir"):
                s.overrides[opt.field] = value
            if opt.name == "megatron-path":
                s.megatron_path = Path(value).resolve()
                if not (s.megatron_path / "pretrain_gpt.py").is_file():
                    raise ConfigError(
                        f"{source}: pretrain_gpt.py not found in {s.megatron_path}; point it "
                        "at a Megatron-LM checkout"
                    )
            elif opt.name == "work-dir":
                if not Path(value).is_absolute():
                    raise ConfigError(f"{source}: must be an absolute path, got {value!r}")
                s.work_dir = Path(value)
            elif opt.name == "workload":
                if value not in WORKLOAD_KINDS:
                    raise ConfigError(
                        f"{source}: must be one of {', '.join(WORKLOAD_KINDS)}, got {value!r}"
                    )
                s.workloads = (value,)
            elif opt.name == "matrix":
                s.matrix = parse_matrix(value, source)
            elif opt.name == "window":
                s.windows = parse_windows(value, source)
            elif opt.name == "run-dir":
                path = Path(value).resolve()
                if not path.is_dir():
                    raise ConfigError(f"{source}: {path} is not a directory")
                s.run_dir = path
            elif opt.name == "run-timeout":
                s.run_timeout = parse_value("out_of_section_timeout", value, source)
            elif opt.name == "keep":
                s.keep = value
            elif opt.name == "continuity-rtol":
                s.continuity_rtol = parse_rtol(value, source)
            elif opt.name == "no-distributed-optimizer" and value:
                s.overrides["distributed_optimizer"] = False
        if env and "launcher" not in s.overrides:
            # a multinode session inside an allocation launches through srun (the CLI's rule)
            nnodes = int(s.overrides.get("nnodes", 1))
            if default_launcher(nnodes, os.environ) == "slurm":
                s.overrides["launcher"] = "slurm"
        if "section_timeouts" in s.overrides:
            assert isinstance(s.overrides["section_timeouts"], SectionTimeouts)
    except ConfigError as exc:
        raise pytest.UsageError(f"pytest-nvrx: {exc}") from None
    return s


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
        params = [pytest.param(None, id="existing-run", marks=pytest.mark.xdist_group("nvrx"))]
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
            for sc in s.scenarios()
        ]
    metafunc.parametrize(SCENARIO_FIXTURE, params, indirect=True, scope="session")


# --- reports ------------------------------------------------------------------------------------

OUTCOMES_KEY = pytest.StashKey[dict[str, bool]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    run = getattr(item, "funcargs", {}).get(SCENARIO_FIXTURE)
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


#: Judged runs in the order they finished, for the terminal summary.
JUDGED_KEY = pytest.StashKey[list[Any]]()
#: Under xdist, on the controller: the summary lines of the runs the workers judged.
REMOTE_JUDGED_KEY = pytest.StashKey[list[list[str]]]()
#: Under xdist, on the controller: a worker collected scenarios.
REMOTE_SELECTED_KEY = pytest.StashKey[bool]()
#: Keys of an xdist worker's workeroutput: its judged runs' summaries, the scenarios it collected.
WORKEROUTPUT_JUDGED = "nvrx_judged"
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
        key = "existing-run" if scenario is None else scenario.id
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
    if config.stash.get(JUDGED_KEY, []) or config.stash.get(REMOTE_JUDGED_KEY, []):
        return
    write = terminal_writer(config)
    which = f" ({', '.join(selected)})" if selected else ""
    write(
        f"pytest-nvrx: every selected scenario was skipped{which}: nothing was qualified;"
        " exit status 5"
    )
    session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED


def summary_lines(run: Any) -> list[str]:
    """A judged run in the terminal summary: where it is, the launcher's end, every verdict
    with the line that proves it."""
    wall = f", launcher {run.result.wall_s:.1f}s exit {run.result.exit_code}" if run.result else ""
    lines = [f"{run.key}: {run.layout.run_dir}{wall}"]
    lines += [f"  {verdict.headline()}" for verdict in run.judgement.verdicts]
    return lines


def record_judged(config: pytest.Config, run: Any) -> None:
    config.stash.setdefault(JUDGED_KEY, []).append(run)
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:
        # an xdist worker: the controller prints the summary (pytest_testnodedown)
        workeroutput.setdefault(WORKEROUTPUT_JUDGED, []).append(summary_lines(run))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Every judged scenario's verdicts, each with the line that proves it."""
    blocks = [summary_lines(run) for run in config.stash.get(JUDGED_KEY, [])]
    remote: list[list[str]] = config.stash.get(REMOTE_JUDGED_KEY, [])
    blocks.extend(remote)
    if not blocks:
        return
    tr = terminalreporter
    tr.section("nvrx verdicts")
    for block in blocks:
        for line in block:
            tr.write_line(line)


def terminal_writer(config: pytest.Config) -> Callable[[str], None]:
    capman = config.pluginmanager.get_plugin("capturemanager")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        # An xdist worker's terminal is not the user's; its stderr is (inherited from the
        # controller): progress goes there, tagged with the worker, as it happens.
        prefix = f"[{workerinput.get('workerid', 'worker')}] "

        def write_worker(line: str) -> None:
            with (
                contextlib.nullcontext() if capman is None else capman.global_and_fixture_disabled()
            ):
                sys.stderr.write(prefix + line + "\n")
                sys.stderr.flush()

        return write_worker
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is None:
        return lambda line: None

    def write(line: str) -> None:
        # Runs happen inside fixture setup, where output is captured: lift it for our line.
        if capman is None:
            tr.write_line(line)
            return
        with capman.global_and_fixture_disabled():
            tr.write_line(line)

    return write
