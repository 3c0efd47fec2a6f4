"""``python -m pytest_nvrx selftest``: plant each known recovery bug into real runs of this stack
and show that the criteria catch every one (pytest_nvrx.selftest.run; docs/selftest.md).

Exit status: 0 every plant caught by its documented criterion and the control qualified; 1 a plant
was missed (its run qualified) or caught only by another criterion; 2 the self-test cannot tell
(bad input, nothing launched; the control not qualified; a plant not applied or not plantable on
this revision; a run that cannot be judged).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from pytest_nvrx.evidence.refs import printable
from pytest_nvrx.launch.prepare_megatron import ensure_prepared
from pytest_nvrx.launch.stop_signals import interrupt_on_stop_signals, interrupt_signal
from pytest_nvrx.layout import RUNS_DIR
from pytest_nvrx.outputs import (
    OutputRefused,
    check_output_paths,
    write_output,
)
from pytest_nvrx.selftest.run import SelftestResult, choose_plants, run_selftest
from pytest_nvrx.settings import (
    PARSERS,
    ConfigError,
    NvrxSettings,
    PartialRunConfig,
    WorkloadKind,
    add_continuity_rtol,
    argparse_type,
    command_parser,
    parse_command_line,
    plugin_setting,
)
from pytest_nvrx.settings.plants import PLANTS

EXIT_USAGE = 2


#: Options parsed by the settings table's row of the same name (a RunConfig field or a plugin
#: setting); not given: the scenarios' value (gpu_share: 1).
TABLE_OPTIONS: tuple[tuple[str, str], ...] = (
    ("gpus_per_node", "ranks per run (default: the scenarios')"),
    ("train_iters", "iterations per run (default: the scenarios')"),
    ("save_interval", "save every N iterations (default: the scenarios')"),
    ("parallel", "runs side by side (default: auto)"),
    ("gpu_share", "runs that may share one GPU (default 1)"),
    ("run_timeout", "seconds one run may take (default: the scenarios')"),
)


def _typed(name: str, option: str) -> Callable[[str], object]:
    """The settings table's parser of ``name`` (a RunConfig field or a plugin setting), as
    argparse's type: the same values and messages as everywhere else."""
    parse = PARSERS[name] if name in PARSERS else plugin_setting(name).parse
    return argparse_type(parse, option)


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "selftest",
        description="Plant each known recovery bug (docs/selftest.md) into a real run of this "
        "stack, one run per plant after an unplanted control, and show which criterion catches "
        "each. A plant that passes means the qualification would pass that bug on this stack.",
        epilog="Exit status: 0 every plant caught as documented and the control qualified; 1 a "
        "plant was missed or caught by another criterion; 2 the self-test cannot tell (bad "
        "input, control not qualified, a plant not applied or not plantable, a run that cannot "
        "be judged). Plants: " + ", ".join(p.name for p in PLANTS) + ".",
    )
    parser.add_argument(
        "--workload",
        choices=("reference", "megatron"),
        default="reference",
        help="the CPU reference workload (default) or Megatron-LM (needs --megatron-path)",
    )
    parser.add_argument("--megatron-path", type=Path, help="Megatron-LM checkout [MEGATRON_PATH]")
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="absolute directory for the runs (default: a new one under the system's temp dir)",
    )
    parser.add_argument(
        "--plant",
        action="append",
        metavar="NAME",
        help="run only this plant (repeatable; default: the whole catalogue)",
    )
    add_continuity_rtol(
        parser, "the tolerance of training_continuity the plants are judged at (default 0: exact)"
    )
    for name, text in TABLE_OPTIONS:
        option = "--" + name.replace("_", "-")
        parser.add_argument(option, type=_typed(name, option), help=text)
    parser.add_argument(
        "--no-distributed-optimizer",
        action="store_true",
        help="Megatron without --use-distributed-optimizer (a stack without TE/Apex needs it to"
        " resume)",
    )
    parser.add_argument(
        "--json",
        dest="json_file",
        metavar="FILE",
        help="also write the outcomes as JSON to FILE; '-': the JSON alone on stdout and the text"
        " on stderr",
    )
    return parser


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> NvrxSettings:
    workload: WorkloadKind = args.workload
    megatron = args.megatron_path
    if workload == "reference":
        megatron = None  # the CPU workload: a MEGATRON_PATH in the environment is not ours
    elif megatron is None and environ.get("MEGATRON_PATH"):
        megatron = Path(environ["MEGATRON_PATH"])
    if workload == "megatron" and megatron is None:
        raise ConfigError("--workload megatron needs --megatron-path (or MEGATRON_PATH)")
    if megatron is not None and not (megatron / "pretrain_gpt.py").is_file():
        raise ConfigError(f"--megatron-path {megatron} holds no pretrain_gpt.py")
    work_dir = args.work_dir
    if work_dir is None:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        work_dir = Path(tempfile.mkdtemp(prefix=f"pytest-nvrx-selftest-{stamp}-"))
    elif not work_dir.is_absolute():
        raise ConfigError(f"--work-dir must be absolute, got {work_dir}")
    return NvrxSettings(
        overrides=PartialRunConfig(
            gpus_per_node=args.gpus_per_node,
            train_iters=args.train_iters,
            save_interval=args.save_interval,
            distributed_optimizer=False if args.no_distributed_optimizer else None,
        ),
        workloads=(workload,),
        megatron_path=megatron if workload == "megatron" else None,
        work_dir=work_dir,
        run_timeout=args.run_timeout,
        continuity_rtol=args.continuity_rtol,
        parallel=args.parallel,
        gpu_share=args.gpu_share or 1,
    )


def print_result(result: SelftestResult, out: TextIO) -> None:
    out.write(f"selftest of {result.workload} at continuity rtol {result.rtol:g}:\n")
    for o in result.outcomes:
        expected = o.plant.caught_by if o.plant is not None else "qualifies"
        out.write(f"  {o.status:<16} {o.name:<20} (expected: {expected})\n")
        out.write(f"      {printable(o.reason)}\n")
        if o.run_dir is not None:
            out.write(f"      run: {o.run_dir}\n")
    out.write(result.summary() + "\n")


def selftest_main(
    argv: Sequence[str], environ: Mapping[str, str] | None = None, stdout: TextIO | None = None
) -> int:
    env = os.environ if environ is None else environ
    out = stdout if stdout is not None else sys.stdout
    args = parse_command_line(build_parser(), argv, EXIT_USAGE)
    if isinstance(args, int):
        return args
    text = sys.stderr if args.json_file == "-" else out
    try:
        plants = choose_plants(args.plant)
        settings = settings_from_args(args, env)
        if args.json_file not in (None, "-"):
            assert settings.work_dir is not None
            check_output_paths(
                [("--json", Path(args.json_file))], [("the runs", settings.work_dir / RUNS_DIR)]
            )
    except (ConfigError, OutputRefused) as exc:
        sys.stderr.write(f"selftest: error: {printable(str(exc))}\n")
        return EXIT_USAGE
    assert settings.work_dir is not None
    text.write(f"selftest: runs in {settings.work_dir}\n")
    text.flush()

    def write(line: str) -> None:
        text.write(printable(line) + "\n")
        text.flush()

    try:
        with interrupt_on_stop_signals():
            if settings.megatron_path is not None:
                # before any run: what the checkout builds at first use, built once
                prepared = ensure_prepared(
                    settings.megatron_path, who="python -m pytest_nvrx selftest"
                )
                if prepared.line is not None:
                    write(prepared.line)
            result = run_selftest(
                settings,
                args.workload,
                settings.work_dir,
                plants=plants,
                write=write,
            )
    except ConfigError as exc:
        sys.stderr.write(f"selftest: error: {printable(str(exc))}\n")
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        sig = interrupt_signal(exc)
        sys.stderr.write(f"selftest: interrupted by {sig.name}; the runs were stopped\n")
        return 128 + int(sig)
    print_result(result, text)
    if args.json_file is not None:
        document = json.dumps(result.as_dict(), indent=2) + "\n"
        if args.json_file == "-":
            out.write(document)
        else:
            write_output(Path(args.json_file), document)
    return result.exit_status
