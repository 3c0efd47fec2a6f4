"""``python -m pytest_nvrx compare OLD NEW``: the command's body (no pytest).

Exit status: 0 nothing fails the gate (no gate: the sides could be compared), 1 the gate fails,
2 the inputs cannot be compared (unreadable or newer input, different workloads, no scenario in
common), bad arguments, or an output that cannot or must not be written; each says why in one
line on stderr. Outputs go only to a regular file or a new path, never onto or into a side.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from pytest_nvrx.compare.diff import Incomparable, compare
from pytest_nvrx.compare.render import document_json, html, text
from pytest_nvrx.compare.side import CompareInputError, is_run_dir, load_side
from pytest_nvrx.evidence.refs import printable
from pytest_nvrx.outputs import OutputRefused, check_output_paths, write_output
from pytest_nvrx.settings import ConfigError, command_parser, parse_command_line, run_command
from pytest_nvrx.settings.compare_gate import parse_gate

EXIT_OK = 0
EXIT_GATE = 1
EXIT_CANNOT_COMPARE = 2


def _min_samples(text: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 6 or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "compare",
        description="Compare two qualifications: the stacks, each scenario's verdict and "
        "recovery timings old -> new, matched by scenario key; optionally gate on it.",
        epilog="OLD and NEW: a report.json (any schema this pytest-nvrx wrote) or a folder of "
        "run dirs (judged now). Exit status: 0 nothing fails the gate, 1 the gate fails, 2 the "
        "inputs cannot be compared or an output cannot be written (why, in one line).",
    )
    parser.add_argument("old", metavar="OLD", type=Path)
    parser.add_argument("new", metavar="NEW", type=Path)
    parser.add_argument(
        "--fail-on",
        metavar="SPEC",
        action="append",
        default=[],
        help="gate rule, repeatable or comma-joined: verdict, missing, downtime:+20%%, "
        "downtime:+10s, phase:load:+5s (a phase id or one word of it)",
    )
    parser.add_argument(
        "--min-samples",
        metavar="N",
        type=_min_samples,
        default=1,
        help="a scenario with fewer runs than N on a side is noise (default 1)",
    )
    parser.add_argument(
        "--gate-noise",
        action="store_true",
        help="gate timings flagged as noise too (a shared GPU, too few samples)",
    )
    parser.add_argument(
        "--json",
        dest="json_path",
        metavar="FILE",
        default=None,
        help="write the comparison as JSON to FILE ('-': stdout alone, text on stderr)",
    )
    parser.add_argument("-o", "--output", metavar="HTML", type=Path, help="write an HTML page")
    return parser


def _evidence_dirs(sides: Sequence[tuple[str, Path]]) -> list[tuple[str, Path]]:
    """Each directory side, and each run dir a folder side holds (a link into it included:
    its run dir may live anywhere); check_outputs adds their checkpoints/."""
    out = []
    for what, path in sides:
        if not path.is_dir():
            continue
        out.append((what, path))
        if is_run_dir(path):
            continue
        try:
            entries = sorted(path.iterdir())
        except OSError:
            continue  # load_side says why it cannot be listed
        out += [(f"{what}'s run dir", p) for p in entries if p.is_dir() and is_run_dir(p)]
    return out


def compare_main(
    argv: Sequence[str], stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    args = parse_command_line(build_parser(), argv, EXIT_CANNOT_COMPARE)
    return run_command(args, _compare, stdout, stderr)


def _compare(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    json_to_stdout = args.json_path == "-"
    outputs = [("-o", args.output)] if args.output is not None else []
    if args.json_path is not None and not json_to_stdout:
        outputs.append(("--json", Path(args.json_path)))
    sides = [(f"{label} side", p) for label, p in (("OLD", args.old), ("NEW", args.new))]
    try:
        check_output_paths(outputs, _evidence_dirs(sides))
        for flag, path in outputs:
            for what, side in sides:
                if side.is_file() and path.resolve() == side.resolve():
                    raise OutputRefused(f"{flag} {path} is the {what}: give another path")
    except OutputRefused as exc:
        err.write(printable(f"compare: error: {exc}") + "\n")
        return EXIT_CANNOT_COMPARE
    try:
        # the gate's specs first: a bad --fail-on is named before a side is read
        rules = parse_gate(list(args.fail_on))
        result = compare(
            load_side(args.old, "OLD"),
            load_side(args.new, "NEW"),
            rules,
            min_samples=args.min_samples,
            gate_noise=args.gate_noise,
        )
    except ConfigError as exc:
        err.write(printable(f"compare: error: {exc}") + "\n")
        return EXIT_CANNOT_COMPARE
    except (CompareInputError, Incomparable) as exc:
        err.write(printable(f"compare: cannot compare: {exc}") + "\n")
        return EXIT_CANNOT_COMPARE
    try:
        if args.output is not None:
            write_output(args.output, html(result))
        if args.json_path is not None and not json_to_stdout:
            write_output(args.json_path, document_json(result))
    except OSError as exc:
        err.write(printable(f"compare: error: cannot write the comparison: {exc}") + "\n")
        return EXIT_CANNOT_COMPARE
    (err if json_to_stdout else out).write(text(result))
    if json_to_stdout:
        out.write(document_json(result))
    return EXIT_GATE if result.gate_failed else EXIT_OK
