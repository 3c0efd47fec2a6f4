"""``python -m pytest_nvrx verify RUN_DIR``: judge an existing run directory by the six criteria.

A thin command over :mod:`pytest_nvrx.criteria` (no judgement here, no pytest). Prints one line
per criterion, ``PASS|FAIL|N/A <id>: <reason> [<file:line>]``, with the evidence lines indented
under it. ``N/A`` appears only for a baseline (fault=none) and counts as holding. When the
workers failed before the fault (a setup error), a ``first cause:`` line under the header quotes
that error, and it leads every failing reason and the final ``verify: FAILED: ...`` line
(``first_cause`` and ``summary`` in ``--json``).

A self-test run with a planted bug (any of its labels: run.json's ``config.plant``, the marker's
``plant``, the recorded launch environment's plant variables or plant hook, a plant record, a
self-test run id naming a plant: :mod:`pytest_nvrx.criteria.planted`) is labelled first:
``planted: <name> (<title>): a self-test run ...`` before the header, ``verify: planted: <name>:
...`` as the final line, ``planted`` as the first key of ``--json``, and never exits 0 (1 when
every criterion holds: the plant was missed). run.json, the marker, the environment and
``plant-records/`` naming different plants (or one none) is a contradiction: the run cannot be
judged.

``--json FILE`` also writes the judgement as JSON (``schema_version``
:data:`~pytest_nvrx.criteria.judgement_text.JSON_SCHEMA_VERSION`, fields in docs/criteria.md);
the text and the JSON are :mod:`pytest_nvrx.criteria.judgement_text`'s. ``--json -`` writes the
JSON alone to stdout and moves the text report to stderr, so that ``verify RUN_DIR --json - |
jq`` reads one document.

``--baseline RUN_DIR`` names an uninterrupted run of the same configuration: training_continuity
then also compares every iteration after the restore with it. A run that is none (the judged run
itself, one with a fault or a marker, one that did not finish, one of another world size, TP/PP,
iterations, seed or model: :mod:`pytest_nvrx.criteria.baseline`) is refused (exit 2).
``--continuity-rtol`` admits a relative difference in that criterion's comparisons (default 0:
exact).

Exit status: 0 when all criteria hold (never for a planted run), 1 when any fails or a planted
run's all hold, 2 when the run cannot be judged
(no such directory, unusable marker or run.json, missing --checkpoint-dir, bad arguments), or
when ``--json FILE`` cannot be written or lies (links followed) in the run dir, the checkpoint dir
or the baseline's run dir: refused before judging, it would overwrite the evidence. The file is
written whole or not at all, its missing parent directories made
(:func:`pytest_nvrx.outputs.write_output`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from pytest_nvrx.criteria import FAULT_CHOICES, WINDOW_CHOICES, judge
from pytest_nvrx.criteria.baseline import baseline_refusal
from pytest_nvrx.criteria.judgement_text import json_report, report
from pytest_nvrx.evidence.refs import printable
from pytest_nvrx.evidence.rundir import RunDirError, load_run
from pytest_nvrx.outputs import (
    OutputRefused,
    check_output_paths,
    write_output,
)
from pytest_nvrx.settings import parse_command

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


DESCRIPTION = (
    "Judge a finished run directory (walkthrough layout) by the six recovery criteria and quote "
    "the log lines that prove each verdict."
)
EPILOG = (
    "Exit status: 0 all criteria hold (never for a planted self-test run), 1 a criterion fails "
    "or a planted run passes, 2 the run cannot be judged (missing directory, unusable "
    "marker/run.json, bad arguments) or --json FILE cannot be written or resolves (links "
    "followed) into RUN_DIR, --checkpoint-dir or --baseline (refused before judging)."
)
CONTINUITY_RTOL_HELP = (
    "relative tolerance of training_continuity's comparisons, for stacks that are not bitwise "
    "deterministic (default 0: exact)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """verify's own arguments (settings/values.py's parse_command adds --continuity-rtol)."""
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="the run directory")
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="checkpoint directory when not RUN_DIR/checkpoints (NVRX_CHECKPOINT_DIR runs)",
    )
    parser.add_argument(
        "--json",
        dest="json_file",
        metavar="FILE",
        default=None,
        help="also write the verdicts, stack and timings as JSON to FILE; '-': the JSON alone on "
        "stdout and the text report on stderr",
    )
    parser.add_argument(
        "--expect-fault",
        choices=FAULT_CHOICES,
        default=None,
        help="the fault the run was meant to see; default: run.json's config.fault, else the "
        "injection marker's, else a fault run is expected (a baseline must say 'none')",
    )
    parser.add_argument(
        "--expect-window",
        choices=WINDOW_CHOICES,
        default=None,
        help="the fault window the run was meant to inject in; default: run.json's "
        "config.window, else the marker's own window (a run without windows: none)",
    )
    parser.add_argument(
        "--baseline",
        metavar="RUN_DIR",
        type=Path,
        default=None,
        help="an uninterrupted run of the same configuration: training_continuity also "
        "compares every iteration after the restore with it",
    )


def _write_json(target: str, data: dict[str, Any], out: TextIO) -> str | None:
    text = json.dumps(data, indent=2) + "\n"
    if target == "-":
        out.write(text)
        return None
    try:
        write_output(Path(target), text)
    except OSError as exc:
        return f"cannot write --json {target}: {exc}"
    return None


def _output_refusal(args: argparse.Namespace) -> str | None:
    """Why ``--json FILE`` must not be written: something other than a regular file is there (a
    device, FIFO, symlink: the rename would replace it), or it lies in the run dir judged, its
    checkpoint dir or the baseline's run dir (verify X --json X/logs/launcher.log replaced the
    log)."""
    if args.json_file in (None, "-"):
        return None
    evidence = [("the run dir", args.run_dir)]
    if args.checkpoint_dir is not None:
        evidence.append(("the checkpoint dir", args.checkpoint_dir))
    if args.baseline is not None:
        evidence.append(("the baseline run dir", args.baseline))
    outputs = [("--json", Path(args.json_file))]
    try:
        check_output_paths(outputs, evidence)
    except OutputRefused as exc:
        return str(exc)
    return None


def verify_main(argv: list[str], stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    args = parse_command(
        "verify",
        argv,
        EXIT_USAGE,
        description=DESCRIPTION,
        epilog=EPILOG,
        arguments=add_arguments,
        continuity_rtol=CONTINUITY_RTOL_HELP,
    )
    if isinstance(args, int):
        return args
    refused = _output_refusal(args)
    if refused is not None:
        err.write(f"verify: error: {printable(refused)}\n")
        return EXIT_USAGE
    try:
        run = load_run(args.run_dir, args.checkpoint_dir)
        baseline = (
            load_run(args.baseline, read_checkpoints=False) if args.baseline is not None else None
        )
    except RunDirError as exc:
        err.write(f"verify: error: {printable(str(exc))}\n")
        return EXIT_USAGE
    # a named baseline that is none (the run itself, a fault run, a failed run, another
    # configuration) is the caller's mistake: refused, never silently left out
    why = baseline_refusal(run, baseline) if baseline is not None else None
    if why is not None:
        refusal = f"cannot use --baseline {args.baseline}: {why}"
        err.write(f"verify: error: {printable(refusal)}\n")
        return EXIT_USAGE
    judgement = judge(
        run,
        args.expect_fault,
        source="--expect-fault" if args.expect_fault else "caller",
        baseline=baseline,
        continuity_rtol=args.continuity_rtol,
        expect_window=args.expect_window,
        window_source="--expect-window" if args.expect_window else None,
    )
    # with the JSON on stdout the text goes to stderr: stdout stays one parseable document
    report(judgement, err if args.json_file == "-" else out)
    status = EXIT_PASSED if judgement.passed else EXIT_FAILED
    if judgement.planted is not None and status == EXIT_PASSED:
        # a planted bug that every criterion let through: the plant was missed, and the run is
        # no qualification whatever its verdicts
        err.write(
            f"verify: {printable(str(args.run_dir))} is a planted self-test run"
            f" ({printable(judgement.planted)}): never a qualification, so never exit 0\n"
        )
        status = EXIT_FAILED
    for why in judgement.unjudgeable_reasons:
        err.write(f"verify: error: cannot judge {args.run_dir}: {printable(why)}\n")
        status = EXIT_USAGE
    if args.json_file is not None:
        error = _write_json(args.json_file, json_report(judgement, status), out)
        if error is not None:
            err.write(f"verify: error: {printable(error)}\n")
            return EXIT_USAGE
    return status


if __name__ == "__main__":  # temporary: `python -m pytest_nvrx.verify` until cli wires it
    sys.exit(verify_main(sys.argv[1:]))
