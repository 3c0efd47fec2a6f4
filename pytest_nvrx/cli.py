"""``python -m pytest_nvrx run | verify | report | selftest | compare``: the core without pytest.

``run``'s arguments come from the settings table (:mod:`pytest_nvrx.settings.cli_args`: with
``--workload reference`` a value neither an option nor the walkthrough's environment variable
gives is the plugin's reference scenario default); ``run`` then plans and launches through
:mod:`pytest_nvrx.launch.run`.

Exit status of ``run``: the launcher's own (0 = the run finished); 2 for bad input (nothing
launched); 124 when ``--timeout`` killed the run; 128 + N when signal N (SIGINT 130, SIGTERM 143,
SIGHUP 129) stopped it, after the whole tree was stopped and result.json written; 1 when the
launcher could not be started.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_nvrx.evidence.progress import Progress
from pytest_nvrx.evidence.refs import printable
from pytest_nvrx.launch.launcher import Launch
from pytest_nvrx.launch.run import launch_run, plan_launch
from pytest_nvrx.launch.slurm import slurm_preview
from pytest_nvrx.launch.stop_signals import interrupt_on_stop_signals, interrupt_signal
from pytest_nvrx.layout import RESULT_NAME
from pytest_nvrx.outputs import full_disk_note
from pytest_nvrx.settings import ConfigError, add_run_arguments, run_request

__all__ = ["build_parser", "main"]

USAGE_ERROR = 2
#: ``run`` killed by its own --timeout (what coreutils' timeout(1) returns)
TIMED_OUT = 124
#: the launcher could not be started
LAUNCH_ERROR = 1


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
        # resolve, validate (the run's faults within --timeout too), create the run dirs and
        # build the recipe (nothing launched)
        request = run_request(args, environ)
        planned = plan_launch(
            request.config,
            dry_run=request.dry_run,
            port=args.log_server_port,
            run_timeout=args.timeout,
        )
    except ConfigError as exc:
        # messages may quote a claim's or a file's content: shown escaped (refs.printable)
        print(printable(f"pytest-nvrx run: error: {exc.message_for('cli')}"), file=sys.stderr)
        return USAGE_ERROR
    recipe = planned.recipe
    print(f"Run artifacts: {recipe.layout.run_dir}")
    print(f"Checkpoint directory: {recipe.layout.checkpoint_dir}")
    if request.dry_run:
        if recipe.config.launcher == "slurm":
            print(slurm_preview(recipe))
        else:
            print(recipe.shell_command())
        return 0
    from pytest_nvrx.megatron.stack import format_stack_line

    if planned.stack is not None:
        print(format_stack_line(planned.stack), file=sys.stderr)
    if planned.first_use is not None and planned.first_use.line is not None:
        print(planned.first_use.line, file=sys.stderr)
    for note in planned.notes:
        print(f"note: {note}", file=sys.stderr)

    def show(progress: Progress) -> None:
        # a progress line that cannot be written (stdout on a full disk) never stops the run
        with contextlib.suppress(OSError):
            print(progress.describe(), flush=True)

    def started(launch: Launch) -> None:
        if launch.slurm is not None:
            slurm = launch.slurm
            print(
                f"Slurm job {slurm.job_id}{' (allocated here)' if slurm.owned else ''}: "
                f"{len(slurm.nodes)} ft_launcher(s) on {', '.join(slurm.nodes)}, "
                f"rendezvous {slurm.endpoint}",
                flush=True,
            )

    try:
        outcome = launch_run(planned, args.timeout, on_progress=show, on_start=started)
    except KeyboardInterrupt as exc:
        return interrupted(exc, recipe.layout.run_dir)
    except ConfigError as exc:  # nothing launched (a full disk at run.json)
        print(printable(f"pytest-nvrx run: error: {exc.message_for('cli')}"), file=sys.stderr)
        return USAGE_ERROR
    except (RuntimeError, OSError) as exc:
        print(printable(f"pytest-nvrx run: error: {exc}"), file=sys.stderr)
        return LAUNCH_ERROR
    result = outcome.result
    if result is None:
        print(f"pytest-nvrx run: {outcome.timed_out}", file=sys.stderr)
    else:
        print(f"ft_launcher exited with {result.exit_code} after {result.wall_s:.1f}s")
    # a run that filled its disk says little about it itself (its logs are cut short)
    full = full_disk_note([recipe.layout.run_dir, recipe.layout.checkpoint_dir])
    if full is not None:
        print(printable(f"pytest-nvrx run: {full}"), file=sys.stderr)
    if result is None:
        return TIMED_OUT
    return result.exit_code if result.exit_code is not None else 1


def version_line() -> str:
    """``pytest-nvrx 0.1.0 (NVRx 0.7.0, torch 2.15.0, Python 3.12.1)``, read from installed
    metadata: nothing is imported."""
    import importlib.metadata
    import platform

    from pytest_nvrx import __version__

    def installed(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return (
        f"pytest-nvrx {__version__} (NVRx {installed('nvidia-resiliency-ext')}, torch"
        f" {installed('torch')}, Python {platform.python_version()})"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_nvrx",
        description="Qualify fault recovery of Megatron-LM GPT training under NVRx ft_launcher.",
    )
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="launch the GPT recovery recipe (or print it with --dry-run)",
        description="Launch the recovery recipe. Options override the walkthrough's "
        "environment variables (shown in brackets, with the walkthrough's default). With "
        "--workload reference a value neither gives is the plugin's reference scenario default "
        "(shown as 'reference: ...'); a Megatron run keeps the walkthrough's.",
    )
    add_run_arguments(run)
    sub.add_parser("verify", help="judge an existing run directory", add_help=False)
    sub.add_parser(
        "selftest",
        help="plant known recovery bugs into real runs and show the criteria catch each one "
        "([--workload reference|megatron] [--plant NAME] [--json FILE])",
        add_help=False,
    )
    sub.add_parser(
        "report",
        help="judge run directories and write one offline HTML recovery report and its "
        "report.json (RUN_DIR... [-o report.html] [--json report.json])",
        add_help=False,
    )
    sub.add_parser(
        "compare",
        help="compare two qualifications (report.json or run dirs) and gate on it "
        "(OLD NEW [--fail-on verdict,downtime:+20%%] [--json FILE] [-o compare.html])",
        add_help=False,
    )
    return parser


#: Errors of writing our own output (stdout on a full disk, a closed pipe): one line, exit 2.
OUTPUT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EPIPE)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    try:
        return _main(argv, environ)
    except OSError as exc:
        if exc.errno not in OUTPUT_ERRNOS:
            raise
        # stdout may be what failed: leave it (no second error when Python flushes it at exit)
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(
            printable(f"python -m pytest_nvrx: error: cannot write its output: {exc}"),
            file=sys.stderr,
        )
        return USAGE_ERROR


def _main(argv: Sequence[str] | None, environ: Mapping[str, str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if environ is None else environ
    if args_list[:1] == ["verify"]:
        from pytest_nvrx.verify import verify_main

        return verify_main(args_list[1:])
    if args_list[:1] == ["selftest"]:
        from pytest_nvrx.selftest.cli import selftest_main

        return selftest_main(args_list[1:], env)
    if args_list[:1] == ["report"]:
        from pytest_nvrx.report import report_main

        return report_main(args_list[1:])
    if args_list[:1] == ["compare"]:
        from pytest_nvrx.compare import compare_main

        return compare_main(args_list[1:])
    parser = build_parser()
    args = parser.parse_args(args_list)
    return cmd_run(args, env)
