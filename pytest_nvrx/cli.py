"""``python -m pytest_nvrx run | verify``: the core without pytest.

Exit status of ``run``: the launcher's own (0 = the run finished); 2 for bad input (nothing
launched); 124 when ``--timeout`` killed the run; 128 + N when signal N (SIGINT 130, SIGTERM 143,
SIGHUP 129) stopped it, after the whole tree was stopped and result.json written; 1 when the
launcher could not be started.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_nvrx.launch import (
    Launch,
    RunTimeout,
    interrupt_on_stop_signals,
    interrupt_signal,
    slurm_preview,
)
from pytest_nvrx.layout import RESULT_NAME
from pytest_nvrx.planning import Plan, plan_run
from pytest_nvrx.recipe import prepare_run_dir
from pytest_nvrx.settings import (
    DRY_RUN_ENV,
    FAULT_KINDS,
    FAULT_WINDOW_KINDS,
    LAUNCHER_KINDS,
    WORKLOAD_KINDS,
    ConfigError,
    RunConfig,
    SectionTimeouts,
    argparse_type,
    dry_run_requested,
    parse_port,
    parse_seconds,
    resolve,
)

USAGE_ERROR = 2
#: ``run`` killed by its own --timeout (what coreutils' timeout(1) returns)
TIMED_OUT = 124
#: the launcher could not be started
LAUNCH_ERROR = 1


def find_launcher() -> str:
    """ft_launcher of the interpreter running us (its workers use the same Python)."""
    beside = Path(sys.executable).parent / "ft_launcher"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("ft_launcher")
    if found is None:
        raise ConfigError(
            "ft_launcher not found beside the interpreter or on PATH; install "
            "nvidia-resiliency-ext 0.7.x into this environment"
        )
    return found


def _section_timeouts(text: str) -> SectionTimeouts:
    try:
        return SectionTimeouts.parse(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``run``; each falls back to the walkthrough's environment variable."""
    p = parser.add_argument
    p("--workload", choices=WORKLOAD_KINDS, help="megatron (default) or the CPU reference")
    p("--megatron-path", type=Path, help="Megatron-LM checkout [MEGATRON_PATH]")
    p("--work-dir", type=Path, help="absolute work directory [NVRX_WORK_DIR]")
    p("--run-id", help="unique run ID, [A-Za-z0-9_-]+ [NVRX_RUN_ID]")
    p("--nnodes", help="number of nodes [NNODES, 1]")
    p("--gpus-per-node", help="processes per node [GPUS_PER_NODE, 2]")
    p("--tp", help="tensor-parallel size [TP, 1]")
    p("--pp", help="pipeline-parallel size [PP, 1]")
    p("--train-iters", help="training iterations [TRAIN_ITERS, 100]")
    p("--save-interval", help="checkpoint interval [SAVE_INTERVAL, 5]")
    p("--fault", choices=FAULT_KINDS, help="fault to inject [NVRX_DEMO_FAULT, kill]")
    p(
        "--window",
        choices=FAULT_WINDOW_KINDS,
        help="where the fault lands: a training step, a save's preparation, or while its "
        "background write is finalized [step; ckpt-worker: finalize only; none for --fault none]",
    )
    p("--fault-rank", help="rank that receives the fault [NVRX_FAULT_RANK, 1]")
    p("--checkpoint-dir", type=Path, help="checkpoint dir [NVRX_CHECKPOINT_DIR]")
    p("--rdzv-endpoint", help="rendezvous host:port [RDZV_ENDPOINT, localhost:0]")
    p(
        "--launcher",
        choices=LAUNCHER_KINDS,
        help="local: ft_launcher here; slurm: one per node through srun, in this allocation or "
        "one made with salloc [NVRX_LAUNCHER; slurm with --nnodes > 1 inside an allocation, "
        "else local]",
    )
    p(
        "--node-index",
        help="this start's node of a multinode run started by hand, 0..NNODES-1; node 0 hosts "
        "the rendezvous, each node claims and writes its own files, and nodes sharing the "
        "endpoint's host may run side by side [NVRX_NODE_INDEX; unset: one start per host]",
    )
    p("--section-timeouts", type=_section_timeouts, help="setup:900,step:120,checkpointing:600")
    p("--out-of-section-timeout", help="seconds out of any section [180]")
    p("--max-restarts", help="launcher restarts [3]")
    p("--workload-check-interval", help="ft_launcher's workload check interval, seconds")
    p(
        "--log-server-port",
        type=argparse_type(parse_port, "--log-server-port"),
        help="ft_launcher log server port [a free one]",
    )
    p(
        "--no-distributed-optimizer",
        action="store_true",
        help="drop Megatron's --use-distributed-optimizer (qualify without it)",
    )
    te = parser.add_mutually_exclusive_group()
    te.add_argument(
        "--no-te-profile",
        dest="no_te_profile",
        action="store_const",
        const=True,
        help="force the Megatron flags for a stack without Transformer Engine/Apex",
    )
    te.add_argument(
        "--default-profile",
        dest="no_te_profile",
        action="store_const",
        const=False,
        help="force the walkthrough's flags even where TE/Apex are missing",
    )
    p(
        "--dry-run",
        action="store_true",
        help=f"print the command and stop [{DRY_RUN_ENV}=1/true/yes/on]",
    )
    p(
        "--timeout",
        type=argparse_type(parse_seconds, "--timeout"),
        default=3600.0,
        help="kill the run after this many seconds",
    )
    p("extra", nargs="*", help="extra workload arguments (after --)")


#: CLI option → RunConfig field, for options given as text and parsed like environment values.
_TEXT_OPTIONS = (
    "nnodes",
    "gpus_per_node",
    "tp",
    "pp",
    "train_iters",
    "save_interval",
    "fault_rank",
    "out_of_section_timeout",
    "max_restarts",
    "workload_check_interval",
    "node_index",
)


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> RunConfig:
    from pytest_nvrx.settings import parse_value

    explicit: dict[str, Any] = {
        "workload": args.workload,
        "megatron_path": args.megatron_path,
        "work_dir": args.work_dir,
        "run_id": args.run_id,
        "fault": args.fault,
        "window": args.window,
        "checkpoint_dir": args.checkpoint_dir,
        "rdzv_endpoint": args.rdzv_endpoint,
        "launcher": args.launcher,
        "section_timeouts": args.section_timeouts,
        "no_te_profile": args.no_te_profile,
        "extra_args": tuple(args.extra) if args.extra else None,
    }
    if args.no_distributed_optimizer:
        explicit["distributed_optimizer"] = False
    for name in _TEXT_OPTIONS:
        raw = getattr(args, name)
        if raw is not None:
            explicit[name] = parse_value(name, raw, "--" + name.replace("_", "-"))
    return resolve(explicit, environ)


def plan(args: argparse.Namespace, environ: Mapping[str, str]) -> Plan:
    """Resolve, validate, create the run dirs and build the recipe (nothing launched)."""
    config = config_from_args(args, environ)
    prepare_run_dir(config, claim=not args.dry_run)
    launcher = "ft_launcher" if args.dry_run else find_launcher()
    return plan_run(
        config, launcher_exe=launcher, port=args.log_server_port, probe=not args.dry_run
    )


def interrupted(exc: BaseException, run_dir: Path | None = None) -> int:
    """One line for a stop signal (never a traceback); 128 + the signal's number."""
    sig = interrupt_signal(exc)
    if run_dir is None:
        where = "; nothing was launched"
    else:
        where = "; the run's processes were stopped"
        if (run_dir / RESULT_NAME).is_file():
            where += f", result.json is in {run_dir}"
    print(f"pytest-nvrx run: interrupted by {sig.name}{where}", file=sys.stderr, flush=True)
    return 128 + int(sig)


def cmd_run(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    # SIGTERM (CI cancel, Slurm) and SIGHUP stop a run like Ctrl-C, and Ctrl-C works even where
    # this process was started with SIGINT ignored.
    with interrupt_on_stop_signals():
        try:
            return _cmd_run(args, environ)
        except KeyboardInterrupt as exc:
            return interrupted(exc)


def _cmd_run(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    try:
        if dry_run_requested(environ):
            args.dry_run = True
        planned = plan(args, environ)
    except ConfigError as exc:
        print(f"pytest-nvrx run: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    recipe = planned.recipe
    print(f"Run artifacts: {recipe.layout.run_dir}")
    print(f"Checkpoint directory: {recipe.layout.checkpoint_dir}")
    if args.dry_run:
        if recipe.config.launcher == "slurm":
            print(slurm_preview(recipe))
        else:
            print(recipe.shell_command())
        return 0
    from pytest_nvrx.stack import format_stack_line

    if planned.stack is not None:
        print(format_stack_line(planned.stack), file=sys.stderr)
    for note in planned.notes:
        print(f"note: {note}", file=sys.stderr)

    def show(progress: Any) -> None:
        print(progress.describe(), flush=True)

    try:
        with Launch(recipe, stack=planned.manifest_stack()) as launch:
            if launch.slurm is not None:
                slurm = launch.slurm
                print(
                    f"Slurm job {slurm.job_id}{' (allocated here)' if slurm.owned else ''}: "
                    f"{len(slurm.nodes)} ft_launcher(s) on {', '.join(slurm.nodes)}, "
                    f"rendezvous {slurm.endpoint}",
                    flush=True,
                )
            result = launch.wait(args.timeout, on_progress=show)
    except KeyboardInterrupt as exc:
        return interrupted(exc, recipe.layout.run_dir)
    except RunTimeout as exc:
        print(f"pytest-nvrx run: {exc}", file=sys.stderr)
        return TIMED_OUT
    except (RuntimeError, OSError) as exc:
        print(f"pytest-nvrx run: error: {exc}", file=sys.stderr)
        return LAUNCH_ERROR
    print(f"ft_launcher exited with {result.exit_code} after {result.wall_s:.1f}s")
    return result.exit_code if result.exit_code is not None else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_nvrx",
        description="Qualify fault recovery of Megatron-LM GPT training under NVRx ft_launcher.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="launch the GPT recovery recipe (or print it with --dry-run)",
        description="Launch the recovery recipe. Options override the walkthrough's "
        "environment variables (shown in brackets).",
    )
    add_run_arguments(run)
    sub.add_parser("verify", help="judge an existing run directory", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if environ is None else environ
    if args_list[:1] == ["verify"]:
        from pytest_nvrx.verify import verify_main

        return verify_main(args_list[1:])
    parser = build_parser()
    args = parser.parse_args(args_list)
    return cmd_run(args, env)
