"""Build and write reports of run directories; the ``report`` command's body (no pytest).

``python -m pytest_nvrx report RUN_DIR... [-o report.html] [--json report.json]
[--continuity-rtol RTOL]`` (also ``python -m pytest_nvrx.report``; the JSON defaults to the HTML
file's name with ``.json``). Over self-test runs (run.json's
``config.selftest``) the report has a self-test section, and a line on stdout, saying of each
plant whether it was caught at that tolerance (docs/report.md). A RUN_DIR that is a file (a
README a glob matched) is skipped with a note on stderr. Exit status, over the run
directories: 0 every scenario qualified, 1 one did not or one is planted (a planted self-test run
is never a qualification), 2 no run directory remains, a path does
not exist or is no run directory, an output cannot be written, or an output would land in a
RUN_DIR (links followed) or on the other output.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from pytest_nvrx.evidence.refs import printable
from pytest_nvrx.evidence.rundir import RunDirError
from pytest_nvrx.outputs import (
    OutputRefused,
    check_output_paths,
    write_output,
)
from pytest_nvrx.report.model import ScenarioReport
from pytest_nvrx.report.render import render_html, report_json, selftest_section
from pytest_nvrx.settings import (
    add_continuity_rtol,
    command_parser,
    parse_command_line,
    run_command,
)

EXIT_QUALIFIED = 0
EXIT_NOT_QUALIFIED = 1
EXIT_USAGE = 2


def build_reports(
    run_dirs: Sequence[Path], *, continuity_rtol: float = 0.0
) -> list[ScenarioReport]:
    """One report per run directory, named after it (a repeated name gets ``-2``, ``-3``...),
    each judged at ``continuity_rtol`` (training_continuity's relative tolerance)."""
    reports: list[ScenarioReport] = []
    names: set[str] = set()
    for run_dir in run_dirs:
        name = Path(run_dir).resolve().name
        unique, n = name, 1
        while unique in names:
            n += 1
            unique = f"{name}-{n}"
        names.add(unique)
        reports.append(
            ScenarioReport.from_run_dir(run_dir, name=unique, continuity_rtol=continuity_rtol)
        )
    return reports


def json_beside(html: Path) -> Path:
    """Where the report.json of the HTML page ``html`` goes by default: beside it, named after it
    (``out/a.html`` -> ``out/a.json``), so a second report in the same directory does not replace
    the first one's JSON. A page already named ``*.json`` would collide with its own JSON: the
    output checks refuse that (two outputs on one file)."""
    return html.with_suffix(".json")


def write_report(
    reports: Sequence[ScenarioReport],
    *,
    html: Path | None = None,
    json_path: Path | None = None,
    stack: dict[str, Any] | None = None,
    sections: Sequence[tuple[str, str]] = (),
) -> None:
    """Write the HTML page and/or report.json; raises OSError when a file cannot be written.
    ``sections``: extra (title, HTML) sections of the page (render_html)."""
    # each whole or not at all: a full disk leaves an earlier report as it was
    if html is not None:
        write_output(html, render_html(reports, stack, sections=sections))
    if json_path is not None:
        write_output(json_path, json.dumps(report_json(reports, stack), indent=1) + "\n")


def output_refusal(outputs: Sequence[tuple[str, Path]], run_dirs: Sequence[Path]) -> str | None:
    """Why the outputs must not be written: something other than a regular file lies at one (a
    device, FIFO, symlink: the rename would replace it), one resolves into a RUN_DIR being
    judged (``report X -o X/run.json`` replaced the manifest with HTML) or two are one file."""
    try:
        check_output_paths(outputs, [("run dir", Path(d)) for d in run_dirs])
    except OutputRefused as exc:
        return str(exc)
    return None


def run_dirs_among(paths: Sequence[Path], err: TextIO) -> list[Path]:
    """``paths`` less the files among them, each named on ``err``: a shell glob over a matrix
    (``tests/data/cpu/*``) also matches the README beside the runs, and one file must not cost
    the report of the rest. A path that does not exist stays, to fail as no run directory (a
    mistyped RUN_DIR is an error, not a skip)."""
    kept = []
    for path in paths:
        if path.exists() and not path.is_dir():
            err.write(printable(f"report: skipped {path}: not a directory") + "\n")
        else:
            kept.append(path)
    return kept


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "report",
        description="Judge run directories and write one self-contained HTML recovery report "
        "(matrix, timeline, recovery cost, loss curve) and its report.json.",
        epilog="A baseline run (fault=none) among the RUN_DIRs is drawn under the loss curve of "
        "each faulted run of the same workload and length; a RUN_DIR that is a file is skipped "
        "with a note. Exit status: 0 all qualified, 1 one not qualified or planted, 2 bad "
        "arguments, no "
        "run directory, unwritable output, or an output inside a RUN_DIR (links followed) or "
        "on the other output (refused before anything is written).",
    )
    parser.add_argument("run_dirs", metavar="RUN_DIR", type=Path, nargs="+")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("report.html"),
        help="HTML file (default report.html)",
    )
    parser.add_argument(
        "--json",
        dest="json_path",
        type=Path,
        default=None,
        help="report.json path (default: beside the HTML file, named after it: "
        "-o out/a.html writes out/a.json)",
    )
    add_continuity_rtol(
        parser,
        "relative tolerance of training_continuity's comparisons, every run judged at it "
        "(default 0: exact); over self-test runs, the self-test section shows which planted "
        "bugs this tolerance lets through (missed)",
    )
    return parser


def report_main(
    argv: Sequence[str], stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    args = parse_command_line(build_parser(), argv, EXIT_USAGE)
    return run_command(args, _report, stdout, stderr)


def _report(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    html: Path = args.output
    json_path: Path = args.json_path or json_beside(html)
    json_flag = "--json" if args.json_path is not None else "--json (default)"
    run_dirs = run_dirs_among(args.run_dirs, err)
    if not run_dirs:
        err.write("report: error: no run directory among the RUN_DIRs\n")
        return EXIT_USAGE
    refused = output_refusal([("-o", html), (json_flag, json_path)], run_dirs)
    if refused is not None:
        err.write(f"report: error: {printable(refused)}\n")
        return EXIT_USAGE
    try:
        reports = build_reports(run_dirs, continuity_rtol=args.continuity_rtol)
    except RunDirError as exc:
        err.write(f"report: error: {printable(str(exc))}\n")
        return EXIT_USAGE
    try:
        write_report(reports, html=html, json_path=json_path)
    except OSError as exc:
        err.write(printable(f"report: error: cannot write the report: {exc}") + "\n")
        return EXIT_USAGE
    for r in reports:
        down = f" ({r.downtime_text()})" if r.downtime_s is not None else ""
        out.write(printable(f"{r.name}: {r.outcome}{down}") + "\n")  # the run's text, escaped
    section = selftest_section(reports)
    if section is not None:
        rtol = section["continuity_rtol"]
        at = f" at continuity rtol {rtol:g}" if rtol is not None else ""
        shown = ", ".join(f"{row['plant']} {row['status']}" for row in section["rows"])
        out.write(printable(f"report: self-test{at}: {shown}") + "\n")
    out.write(printable(f"report: wrote {html} and {json_path}") + "\n")
    # a planted run is never a qualification, even one whose plant every criterion let through
    qualified = all(r.passed and r.planted is None for r in reports)
    return EXIT_QUALIFIED if qualified else EXIT_NOT_QUALIFIED
