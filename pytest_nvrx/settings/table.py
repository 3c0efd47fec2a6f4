"""The settings table: every setting declared once.

The plugin's --nvrx-* options and nvrx_* ini values (plugin.py), the arguments of
``python -m pytest_nvrx run`` (cli.py), the parsers and walkthrough variables of
:func:`pytest_nvrx.settings.resolve`, the scenarios' per-workload defaults and the options table
of docs/options.md (:func:`options_table`) are all generated from it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from pytest_nvrx.layout import FAULT_WINDOWS, PHASE_IDS, FaultWindow
from pytest_nvrx.settings.compare_gate import parse_gate_setting
from pytest_nvrx.settings.record import (
    FAULT_KINDS,
    LAUNCHER_KINDS,
    WORKLOAD_KINDS,
    PartialRunConfig,
    SectionTimeouts,
    WorkloadKind,
)
from pytest_nvrx.settings.schedule import ScheduledFault, parse_schedule
from pytest_nvrx.settings.setting import Setting
from pytest_nvrx.settings.values import (
    DRY_RUN_ENV,
    ConfigError,
    EntryPoint,
    choice_parser,
    named_seconds,
    parse_bool,
    parse_non_negative_int,
    parse_path,
    parse_port,
    parse_positive_int,
    parse_rtol,
    parse_seconds,
    quote,
    show_path,
)

#: The plugin's environment variables for the matrix and the windows (no walkthrough names).
MATRIX_ENV = "NVRX_FAULT_MATRIX"
WINDOW_ENV = "NVRX_FAULT_WINDOW"
MATRICES = ("default", "full")
#: The plugin's fault-schedule scenarios besides one schedule given (pytest_nvrx.session.scenarios).
SCHEDULES_ENV = "NVRX_SCHEDULES"
SCHEDULE_MATRICES = ("default", "none")


def parse_matrix(raw: str, what: str) -> str:
    """``default`` or ``full``; errors name ``what`` (the option, variable or ini value)."""
    text = raw.strip()
    if text not in MATRICES:
        raise ConfigError(
            f"{what} must be one of {', '.join(MATRICES)} (default: every fault and every window "
            f"at least once; full: every fault in every window), got {quote(raw)}"
        )
    return text


def parse_schedules(raw: str, what: str) -> str | tuple[ScheduledFault, ...]:
    """``default``, ``none``, or one schedule (pytest_nvrx.settings.schedule)."""
    text = raw.strip()
    if text in SCHEDULE_MATRICES:
        return text
    return parse_schedule(text, what)


def parse_windows(raw: str, what: str) -> tuple[FaultWindow, ...]:
    """A comma-separated list of windows, e.g. ``save,finalize`` (repeats dropped)."""
    names = [part.strip() for part in raw.split(",")]
    bad = [name for name in names if name not in FAULT_WINDOWS]
    if not raw.strip() or bad:
        shown = f"{quote(bad[0])} in {quote(raw)}" if bad and bad[0] != raw else quote(raw)
        raise ConfigError(
            f"{what} must be one or more of {', '.join(FAULT_WINDOWS)}, separated by "
            f"commas (e.g. save,finalize), got {shown}"
        )
    return tuple(cast(FaultWindow, name) for name in dict.fromkeys(names))


def _one_workload(raw: str, what: str) -> tuple[str, ...]:
    if raw not in WORKLOAD_KINDS:
        raise ConfigError(f"{what}: must be one of {', '.join(WORKLOAD_KINDS)}, got {raw!r}")
    return (raw,)


def _megatron_checkout(raw: str, what: str) -> Path:
    path = parse_path(raw, what).resolve()
    if not (path / "pretrain_gpt.py").is_file():
        raise ConfigError(
            f"{what}: pretrain_gpt.py not found in {path}; point it at a Megatron-LM checkout"
        )
    return path


def _absolute_dir(raw: str, what: str) -> Path:
    path = parse_path(raw, what)
    if not path.is_absolute():
        # as typed: a Path's repr (PosixPath('rel/work')) is Python's spelling, not the user's
        raise ConfigError(f"{what}: must be an absolute path, got {show_path(raw)}")
    return path


def _lock_dir(raw: str, what: str) -> Path:
    """The GPU locks' directory: absolute, an existing directory, writable (each lock is a file
    made there), so a bad one is refused before a scenario waits on it."""
    path = _absolute_dir(raw, what)
    if not path.is_dir():
        raise ConfigError(
            f"{what}: {show_path(raw)} is not a directory; give one that every session sharing"
            " the GPUs sees (a host directory mounted into each container)"
        )
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{what}: {show_path(raw)} is not writable: each GPU's lock is a file made there"
        )
    return path


def parse_parallel(raw: str, what: str) -> int | None:
    """``auto`` (None: as many as fit) or a positive number of scenarios at once."""
    if raw.strip().lower() == "auto":
        return None
    return parse_positive_int(raw, what)


def _existing_dir(raw: str, what: str) -> Path:
    path = Path(raw).resolve()
    if not path.is_dir():
        raise ConfigError(f"{what}: {path} is not a directory")
    return path


def _existing_file(raw: str, what: str) -> Path:
    path = parse_path(raw, what)
    if not path.resolve().is_file():
        raise ConfigError(f"{what}: {path} is not a file (give last night's report.json)")
    return path


def parse_phase_limits(raw: str, what: str) -> dict[str, float]:
    """``PHASE=S[,PHASE=S...]``: seconds per phase of the recovery report."""
    return named_seconds(
        raw,
        "=",
        PHASE_IDS,
        refused=lambda part: (
            f"{what} must be PHASE=SECONDS[,PHASE=SECONDS...] with PHASE one of "
            f"{', '.join(PHASE_IDS)}; got {quote(part)}"
        ),
        twice=lambda name: f"{what} gives phase {name} twice; give each phase one limit",
        what=lambda name: f"{what} {name}",
    )


def _section_timeouts(raw: str, what: str) -> SectionTimeouts:
    return SectionTimeouts.parse(raw)


def _count(name: str, help: str, env: str, **more: Any) -> Setting:
    """A walkthrough integer of both entry points (``--tp``, ``TP``), its default in the help."""
    more.setdefault("parse", parse_positive_int)
    return Setting(
        name, help, name.replace("-", "_"), env=env, show_default=True, doc_value="N", **more
    )


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "megatron-path",
        "Megatron-LM checkout to qualify (enables the gpu scenarios)",
        "megatron_path",
        parse_path,
        env="MEGATRON_PATH",
        attr="megatron_path",
        plugin_parse=_megatron_checkout,
        cli_help="Megatron-LM checkout",
        cli_form="path",
        doc_value="PATH",
        doc="Megatron-LM checkout (must hold `pretrain_gpt.py`); enables the `gpu` scenarios",
    ),
    Setting(
        "work-dir",
        "absolute directory for run dirs (default: pytest's tmp dir)",
        "work_dir",
        parse_path,
        env="NVRX_WORK_DIR",
        attr="work_dir",
        plugin_parse=_absolute_dir,
        cli_help="absolute work directory",
        cli_form="path",
        doc_value="DIR",
        doc="absolute directory; runs go to `DIR/runs/<scenario>-<time>-<n>/` and are always kept",
        doc_default="pytest's tmp dir",
    ),
    Setting(
        "workload",
        "megatron | reference: only this workload's scenarios (default: both; "
        "megatron ones skip without a GPU and --nvrx-megatron-path)",
        parse=_one_workload,
        where="plugin",
        attr="workloads",
        doc_value="megatron\\|reference",
        doc="only this workload's scenarios",
        doc_default="both",
    ),
    Setting(
        "workload",
        "megatron (default) or the CPU reference",
        "workload",
        choice_parser(WORKLOAD_KINDS),
        where="cli",
        choices=WORKLOAD_KINDS,
        cli_note="",
        cli_form="choice",
    ),
    Setting(
        "matrix",
        "default | full: the fault scenarios per workload (default: every fault and every "
        "window at least once; full: every fault in every window it exists in)",
        parse=parse_matrix,
        env=MATRIX_ENV,
        where="plugin",
        attr="matrix",
        doc_value="default\\|full",
        doc="the fault scenarios per workload: `default` covers every fault and every window at "
        "least once (6 runs), `full` is every fault in every window it exists in (16 runs); see "
        "[Matrices](#matrices)",
        doc_default="`default`",
    ),
    Setting(
        "window",
        "step,save,finalize (one or more, comma-separated): every fault in these windows "
        "instead of the matrix (baselines stay)",
        parse=parse_windows,
        env=WINDOW_ENV,
        where="plugin",
        attr="windows",
        doc_value="W[,W...]",
        doc="`step`, `save`, `finalize`, comma-separated: every fault in these windows instead "
        "of the matrix (the baselines stay)",
    ),
    Setting(
        "schedules",
        "default | none | FAULT@WINDOW[,...] | random:N,seed=S: the fault schedule scenarios "
        "per workload, several faults one per cycle (default: kill@step,kill@restore; "
        "hang@finalize,ckpt-worker@finalize; a schedule longer than its restart budget)",
        parse=parse_schedules,
        env=SCHEDULES_ENV,
        where="plugin",
        attr="schedules",
        doc_value="default\\|none\\|S",
        doc="the fault-schedule scenarios per workload (marker `schedule`, plus the marker of "
        "every fault and window it holds: `-m kill` selects each schedule with a kill, "
        "`restore` each whose fault strikes a replacement's checkpoint load): `default` runs "
        "three, `none` none, a "
        "schedule (`kill@step,kill@restore`) or a seeded random one (`random:4,seed=7`, for soak "
        "runs) runs that one; see [windows.md](windows.md#fault-schedules)",
        doc_default="`default`",
    ),
    Setting(
        "run-id",
        "unique run ID, [A-Za-z0-9_-]+",
        "run_id",
        env="NVRX_RUN_ID",
        where="cli",
    ),
    _count("nnodes", "number of nodes", "NNODES"),
    # one GPU per Megatron scenario unless the user gives a shape (the plugin's 1-GPU matrix)
    _count(
        "gpus-per-node",
        "processes per node",
        "GPUS_PER_NODE",
        defaults={"reference": 2, "megatron": 1},
    ),
    _count(
        "tp",
        "tensor-parallel size",
        "TP",
        doc="tensor-parallel size; the world must divide by TP x PP and TP divide the 8 heads",
    ),
    _count(
        "pp",
        "pipeline-parallel size",
        "PP",
        doc="pipeline-parallel size; the world must divide by TP x PP and PP divide the 4 layers",
    ),
    # the reference's step window needs a step after its second save: > 2 x save interval
    _count("train-iters", "training iterations", "TRAIN_ITERS", defaults={"reference": 20}),
    _count(
        "save-interval",
        "checkpoint interval in iterations",
        "SAVE_INTERVAL",
        defaults={"reference": 5},
    ),
    Setting(
        "fault",
        "fault to inject",
        "fault",
        choice_parser(FAULT_KINDS),
        env="NVRX_DEMO_FAULT",
        where="cli",
        choices=FAULT_KINDS,
        cli_form="choice",
    ),
    Setting(
        "window",
        "where the fault lands: a training step, a save's preparation, or while its "
        "background write is finalized",
        "window",
        choice_parser(FAULT_WINDOWS),
        where="cli",
        choices=FAULT_WINDOWS,
        cli_note="step; ckpt-worker: finalize only; none for --fault none",
        cli_form="choice",
    ),
    Setting(
        "schedule",
        "several faults, one per cycle, in order: FAULT@WINDOW[,FAULT@WINDOW...] (window "
        "restore: a replacement while it loads, from the second fault on) or random:N,seed=S",
        "schedule",
        parse_schedule,
        env="NVRX_SCHEDULE",
        where="cli",
        cli_note="none: the one fault of --fault and --window",
        cli_form="typed",
    ),
    _count(
        "fault-rank",
        "rank that receives the fault",
        "NVRX_FAULT_RANK",
        parse=parse_non_negative_int,
        defaults={"reference": 1},
        default_note="1 (0 when the run has one rank in all)",
    ),
    Setting(
        "checkpoint-dir",
        "checkpoint dir",
        "checkpoint_dir",
        parse_path,
        env="NVRX_CHECKPOINT_DIR",
        where="cli",
        cli_form="path",
    ),
    Setting(
        "section-timeouts",
        "NVRx section deadlines, all three names, seconds",
        "section_timeouts",
        _section_timeouts,
        # Megatron: a 30 s step deadline so that a hang is detected in ~30 s rather than 120 s
        # (measured on the H200: the first step well under that). Both: a 30 s checkpointing
        # deadline (the walkthrough's 600) for a hang while a save is prepared or finalized: a
        # hang in the save/finalize window stops the rank inside that section. Reference: 15 s,
        # still 125x its longest checkpointing section under CI load (0.12 s of 282 measured).
        defaults={
            "reference": SectionTimeouts(setup=120, step=10, checkpointing=15),
            "megatron": SectionTimeouts(setup=900, step=30, checkpointing=30),
        },
        show_default=True,
        cli_form="typed",
        doc_value="setup:S,step:S,checkpointing:S",
        doc="NVRx section deadlines (all three names, seconds)",
    ),
    Setting(
        "out-of-section-timeout",
        "seconds allowed outside sections",
        "out_of_section_timeout",
        parse_seconds,
        defaults={"reference": 60.0},
        show_default=True,
        doc_value="S",
        doc="seconds outside any section",
    ),
    Setting(
        "rdzv-endpoint",
        "rendezvous host:port for multinode runs",
        "rdzv_endpoint",
        env="RDZV_ENDPOINT",
        show_default=True,
        doc_value="H:P",
        doc="rendezvous endpoint (needed for `nnodes > 1` with the local launcher; the slurm "
        "launcher picks the first node and a free port)",
    ),
    Setting(
        "node-index",
        "this session's node in a multinode run started by hand, one session per node with the "
        "same NVRX_RUN_ID and --nvrx-rdzv-endpoint (0 hosts the rendezvous)",
        "node_index",
        parse_non_negative_int,
        env="NVRX_NODE_INDEX",
        cli_help="this start's node of a multinode run started by hand, 0..NNODES-1; node 0 "
        "hosts the rendezvous, each node claims and writes its own files, and nodes sharing the "
        "endpoint's host may run side by side",
        cli_note="NVRX_NODE_INDEX; unset: one start per host",
        doc_value="I",
        doc="this session's node of a multinode run started by hand, `0 <= I < NNODES`, one "
        "session per node with the same `NVRX_RUN_ID` and rendezvous endpoint (node 0 hosts the "
        "rendezvous; [slurm.md](slurm.md))",
        doc_default="unset: one node, or one start per host",
    ),
    Setting(
        "launcher",
        "local | slurm: ft_launcher started here, or one per node through srun in this "
        "allocation (or one made with salloc); default slurm when --nvrx-nnodes > 1 inside an "
        "allocation, else local",
        "launcher",
        choice_parser(LAUNCHER_KINDS),
        env="NVRX_LAUNCHER",
        choices=LAUNCHER_KINDS,
        cli_help="local: ft_launcher here; slurm: one per node through srun, in this allocation "
        "or one made with salloc",
        cli_note="NVRX_LAUNCHER; slurm with --nnodes > 1 inside an allocation, else local",
        cli_form="choice",
        doc_value="local\\|slurm",
        doc="`slurm`: one `ft_launcher` per node through one `srun` step, in this allocation or "
        "one made with `salloc` ([slurm.md](slurm.md))",
        doc_default="slurm when `nnodes > 1` inside an allocation (not inside a step), else local",
    ),
    Setting(
        "max-restarts",
        "launcher restarts",
        "max_restarts",
        parse_non_negative_int,
        where="cli",
    ),
    Setting(
        "workload-check-interval",
        "ft_launcher's workload check interval, seconds",
        "workload_check_interval",
        parse_seconds,
        where="cli",
        defaults={"reference": 1.0, "megatron": 1.0},
    ),
    Setting(
        "log-server-port",
        "ft_launcher log server port",
        parse=parse_port,
        where="cli",
        cli_note="a free one",
        cli_form="typed",
    ),
    Setting(
        "no-distributed-optimizer",
        "qualify without Megatron's --use-distributed-optimizer",
        "distributed_optimizer",
        parse_bool,
        flag=True,
        flag_value=False,
        doc="drop Megatron's `--use-distributed-optimizer` (see [gpu.md](gpu.md))",
        doc_default="off",
    ),
    Setting(
        "no-te-profile",
        "force the Megatron flags for a stack without Transformer Engine/Apex",
        "no_te_profile",
        parse_bool,
        where="cli",
        flag=True,
        cli_off=("default-profile", "force the walkthrough's flags even where TE/Apex are missing"),
    ),
    Setting(
        "run-dir",
        "judge this existing run directory instead of launching",
        parse=_existing_dir,
        where="plugin",
        attr="run_dir",
        doc_value="DIR",
    ),
    Setting(
        "run-timeout",
        "seconds before a scenario run is killed",
        parse=parse_seconds,
        where="plugin",
        attr="run_timeout",
        defaults={"reference": 600.0, "megatron": 1800.0},
        show_default=True,
        doc_value="S",
        doc="wall-clock limit of one scenario run; the whole process tree is killed after it. A "
        "scenario whose faults cannot be detected and recovered within it is refused before "
        "anything launches ([A run timeout its faults cannot "
        "fit](#a-run-timeout-its-faults-cannot-fit))",
    ),
    Setting(
        "keep",
        "keep the checkpoint shards too (run dirs are always kept; without it the checkpoint "
        "payload of run dirs under pytest's tmp dir is removed, metadata and tracker stay; "
        "with --nvrx-work-dir nothing is removed, shards included)",
        where="plugin",
        flag=True,
        attr="keep",
        doc="keep the checkpoint shards too; without it every scenario's run dir is kept but its "
        "checkpoint payload (`*.distcp`) is removed, only where the plugin made the run dir "
        "under pytest's tmp dir: with `--nvrx-work-dir` (or `NVRX_WORK_DIR`) the runs are yours "
        "and nothing is removed, with or without `--nvrx-keep` ([Run directories after the "
        "session](#run-directories-after-the-session))",
        doc_default="off",
    ),
    Setting(
        "continuity-rtol",
        "relative tolerance of training_continuity for stacks that are not bitwise "
        "deterministic (default 0: exact)",
        parse=parse_rtol,
        where="plugin",
        attr="continuity_rtol",
        doc_value="R",
        doc="relative tolerance of `training_continuity` for stacks that are not bitwise "
        "deterministic (0 <= R < 1); reported in the verdict. A passed baseline scenario of the "
        "session is the continuity reference of the same workload's fault scenarios (every fault "
        "and window) judged after it",
        doc_default="0 (exact)",
    ),
    Setting(
        "parallel",
        "scenarios of one workload run at once: a number, or auto (GPU scenarios: as many as "
        "the visible GPUs hold, see --nvrx-gpu-share; reference: 3, or half the CPUs)",
        parse=parse_parallel,
        where="plugin",
        attr="parallel",
        doc_value="N\\|auto",
        doc="how many scenarios of one workload run at once; each GPU scenario gets GPUs of its "
        "own (`CUDA_VISIBLE_DEVICES`, one file lock per GPU slot, shared with other sessions and "
        "xdist workers), its own ports, TMPDIR and run dir. `auto`: GPU scenarios as many as the "
        "visible GPUs hold, reference scenarios 3 at once (half the CPUs on hosts with more than "
        "6) ([Scenarios side by side](#scenarios-side-by-side))",
        doc_default="auto",
    ),
    Setting(
        "gpu-share",
        "GPU scenarios that may use one GPU at once (default 1: every scenario on GPUs of its own)",
        parse=parse_positive_int,
        where="plugin",
        attr="gpu_share",
        doc_value="K",
        doc="how many GPU scenarios may use one GPU at once; 1 keeps scenarios on disjoint GPUs. "
        "A small GPT run leaves most of an H200 idle: 2 runs a 3-scenario 1-GPU matrix at once "
        "on a 2-GPU host",
        doc_default="1",
    ),
    Setting(
        "gpu-lock-dir",
        "absolute directory of the GPU locks, shared by every session on the host's GPUs "
        "(default: /tmp; containers of one host: a host directory mounted into each)",
        parse=_lock_dir,
        env="NVRX_GPU_LOCK_DIR",
        where="plugin",
        attr="gpu_lock_dir",
        doc_value="DIR",
        doc="an existing, writable absolute directory for the GPU locks "
        "(`DIR/pytest-nvrx-gpu-<device>.lock`): sessions that use one directory never share a "
        "GPU; containers of one host each have their own `/tmp`, so give them a host directory "
        "mounted into each ([Scenarios side by side](#scenarios-side-by-side))",
        doc_default="`/tmp`",
    ),
    Setting(
        "report",
        "write the recovery report of the session's scenarios: one offline HTML page at PATH "
        "and its report.json beside it, named after it (a.html -> a.json)",
        parse=parse_path,
        where="plugin",
        attr="report",
        doc_value="PATH",
        doc="write the recovery report of the session's scenarios: one self-contained offline "
        "HTML page at `PATH` (matrix, timelines, recovery cost, loss curves) and its "
        "`report.json` beside it, named after it (`out/a.html` → `out/a.json`, as `report -o` "
        "names it: a second report in that directory keeps the first one's) "
        "([report.md](report.md)); also under pytest-xdist",
    ),
    Setting(
        "max-downtime",
        "fail a fault scenario whose downtime (fault to the first step committed after the "
        "restore) exceeds S seconds, or cannot be measured (test_recovery_downtime)",
        parse=parse_seconds,
        where="plugin",
        attr="max_downtime",
        doc_value="S",
        doc="the downtime gate: each fault scenario gets a `test_recovery_downtime` test that "
        "fails when its downtime (the fault's instant to the first step committed after the "
        "restore, report.json's `downtime_s`) exceeds `S` seconds or cannot be measured; the "
        "message has the measured value, the limit and the breakdown ([Downtime "
        "gate](#downtime-gate))",
        doc_default="none (no gate)",
    ),
    Setting(
        "max-phase",
        "fail a fault scenario whose recovery phase takes longer than its limit, or cannot be "
        "measured: PHASE=S[,PHASE=S...] with PHASE detection, termination, gpu_reclaim, "
        "rendezvous, worker_start, checkpoint_load, first_step",
        parse=parse_phase_limits,
        where="plugin",
        attr="max_phases",
        doc_value="P=S[,P=S...]",
        doc="per-phase limits of the downtime gate, seconds per phase of the recovery report "
        "(`detection`, `termination`, `gpu_reclaim`, `rendezvous`, `worker_start`, "
        "`checkpoint_load`, `first_step`); a phase the evidence cannot measure fails its "
        "limit ([Downtime gate](#downtime-gate))",
        doc_default="none",
    ),
    Setting(
        "gate-shared-gpu",
        "hold scenarios that shared their GPU (--nvrx-gpu-share > 1) to --nvrx-max-downtime / "
        "--nvrx-max-phase anyway (by default refused: their timings include the other runs')",
        where="plugin",
        flag=True,
        attr="gate_shared_gpu",
        doc="hold scenarios that shared a GPU (`--nvrx-gpu-share` above 1) to the downtime gate "
        "anyway. Without it the gate refuses them: NVRx waits until the whole GPU's memory is "
        "reclaimed, the other runs' included, and the runs load each other, so their recovery "
        "timings are not the stack's ([Downtime gate](#downtime-gate))",
        doc_default="off",
    ),
    Setting(
        "compare",
        "compare the session's scenarios with an earlier qualification's report.json (last "
        "night's artifact): verdicts and recovery phases old -> new, in the terminal, the HTML "
        "report and JUnit",
        parse=_existing_file,
        where="plugin",
        attr="compare",
        doc_value="REPORT_JSON",
        doc="compare the session's scenarios, matched by key, with an earlier qualification's "
        "`report.json` (any schema pytest-nvrx wrote; read before anything launches): the "
        "stacks, each verdict and recovery phase old → new, in the terminal summary, as a "
        "section of the `--nvrx-report` page (and in `a.compare.json` beside `a.html`) and as "
        "`nvrx_compare_*` JUnit properties ([compare.md](compare.md))",
        doc_default="none",
    ),
    Setting(
        "compare-fail",
        "fail the session, after every scenario is judged, when the comparison with "
        "--nvrx-compare fails this gate, the rules of compare --fail-on (comma-joined): verdict, "
        "missing, downtime:+10s, phase:load:+5s, a percentage as downtime:+20 then a percent sign",
        parse=parse_gate_setting,
        where="plugin",
        attr="compare_fail",
        doc_value="SPEC",
        doc="the gate on `--nvrx-compare`: `verdict` (a scenario QUALIFIED before is not now), "
        "`missing` (a scenario of the earlier report is not in this session), "
        "`downtime:+20%` or `downtime:+10s`, `phase:NAME:+5s` (comma-joined); the session fails "
        "after every scenario was judged when a rule fails. Scenarios that shared a GPU are not "
        "gated without `--nvrx-gate-shared-gpu` ([compare.md](compare.md#the-gate))",
        doc_default="none (shown, not gated)",
    ),
    Setting(
        "selftest",
        "also run the self-test: plant each known recovery bug and require the criteria to "
        "catch it (docs/selftest.md)",
        where="plugin",
        flag=True,
        attr="selftest",
        doc="also run the self-test of each selected workload (megatron as its GPU scenarios "
        "are: with `--nvrx-megatron-path` on GPUs): the unplanted control, then each planted "
        "recovery bug, once per session; one `test_plant_caught` per run "
        "(`reference-selftest-control`, `reference-selftest-rng`, ...; marker `selftest`), "
        "passed when the control qualifies and the plant is caught by its documented "
        "criterion. `-m selftest` runs the self-test alone; `-k` picks plants (the control "
        "always runs) ([selftest.md](selftest.md))",
        doc_default="off",
    ),
    Setting(
        "dry-run",
        "print the command and stop",
        env=DRY_RUN_ENV,
        where="cli",
        flag=True,
        cli_note=f"{DRY_RUN_ENV}=1/true/yes/on",
    ),
    Setting(
        "timeout",
        "kill the run after this many seconds",
        parse=parse_seconds,
        where="cli",
        cli_form="typed",
        cli_default=3600.0,
    ),
)
PLUGIN_SETTINGS: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.in_plugin)
CLI_SETTINGS: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.in_cli)

#: How a text value (from the environment, an ini file or a CLI string) becomes a field value.
PARSERS: dict[str, Callable[[str, str], Any]] = {
    s.field: s.parse for s in SETTINGS if s.field is not None
}
#: The walkthrough's environment variables (and pytest-nvrx's own), by RunConfig field.
ENV_VARS: dict[str, str] = {
    s.field: s.env for s in SETTINGS if s.field is not None and s.env is not None
}


def parse_value(name: str, raw: str, source: str) -> Any:
    """Parse one text value for field ``name``; errors name the ``source`` (e.g. ``TP``)."""
    return PARSERS[name](raw, source)


def plugin_setting(key: str) -> Setting:
    """The plugin's row that sets ``key`` (a RunConfig field or an NvrxSettings attribute)."""
    for setting in PLUGIN_SETTINGS:
        if key in (setting.field, setting.attr):
            return setting
    raise KeyError(key)


def default_text(key: str) -> str:
    """A setting's default in the scenarios, as ``--help`` and docs/options.md show it."""
    return plugin_setting(key).default_text()


def option_hint(name: str, entry: EntryPoint, value: str | None = None) -> str:
    """How a fix-it hint names the setting ``name`` (an option without its prefix) to a user of
    ``entry``: that entry point's row (:meth:`Setting.hint`), ``--nvrx-save-interval
    (SAVE_INTERVAL, ini nvrx_save_interval)`` or ``--save-interval (SAVE_INTERVAL)``. A setting
    ``entry`` has no option for is named by its variable, else as the other entry point has it."""
    rows = [s for s in SETTINGS if s.name == name]
    if not rows:
        raise KeyError(name)
    for row in rows:
        if row.in_plugin if entry == "plugin" else row.in_cli:
            return row.hint(entry, value)
    row = rows[0]
    if row.env is not None:
        return row.env if value is None else f"{row.env}={value}"
    return row.hint("cli" if entry == "plugin" else "plugin", value)


def workload_defaults(workload: WorkloadKind) -> PartialRunConfig:
    """RunConfig values a scenario of ``workload`` uses unless the user gives them
    (option > env > ini > these): the rows' per-workload defaults."""
    return PartialRunConfig.of(
        {
            s.field: s.defaults[workload]
            for s in SETTINGS
            if s.field is not None and s.defaults and workload in s.defaults
        }
    )


OPTIONS_TABLE_HEAD = "| option | env | default | meaning |\n|---|---|---|---|"


def options_table() -> str:
    """docs/options.md's table of the plugin's options (tests/settings/test_settings_table.py holds
    the committed one equal to this)."""
    return "\n".join([OPTIONS_TABLE_HEAD, *(s.doc_row() for s in PLUGIN_SETTINGS)])
