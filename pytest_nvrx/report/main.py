"""Build and write reports of run directories; the ``report`` command's body (no pytest).

``python -m pytest_nvrx report RUN_DIR... [-o report.html] [--json report.json]`` (also
``python -m pytest_nvrx.report``). Exit status: 0 every scenario qualified, 1 one
did not, 2 a path is not a run directory or an output cannot be written.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from pytest_nvrx.evidence.rundir import RunDirError
from pytest_nvrx.report.model import ScenarioReport
from pytest_nvrx.report.render import render_html, report_json

EXIT_QUALIFIED = 0
EXIT_NOT_QUALIFIED = 1
EXIT_USAGE = 2


def build_reports(run_dirs: Sequence[Path]) -> list[ScenarioReport]:
    """One report per run directory, named after it (a repeated name gets ``-2``, ``-3``...)."""
    reports: list[ScenarioReport] = []
    names: set[str] = set()
    for run_dir in run_dirs:
        name = Path(run_dir).resolve().name
        unique, n = name, 1
        while unique in names:
            n += 1
            unique = f"{name}-{n}"
        names.add(unique)
        reports.append(ScenarioReport.from_run_dir(run_dir, name=unique))
    return reports


def write_report(
    reports: Sequence[ScenarioReport],
    *,
    html: Path | None = None,
    json_path: Path | None = None,
    stack: dict[str, Any] | None = None,
) -> None:
    """Write the HTML page and/or report.json; raises OSError when a file cannot be written."""
    if html is not None:
        html.write_text(render_html(reports, stack), encoding="utf-8")
    if json_path is not None:
        text = json.dumps(report_json(reports, stack), indent=1) + "\n"
        json_path.write_text(text, encoding="utf-8")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_nvrx report",
        description="Judge run directories and write one self-contained HTML recovery report "
        "(matrix, timeline, recovery cost, loss curve) and its report.json.",
        epilog="A baseline run (fault=none) among the RUN_DIRs is drawn under the loss curve of "
        "each faulted run of the same workload and length. Exit status: 0 all qualified, 1 one "
        "not qualified, 2 bad arguments or unwritable output.",
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
        help="report.json path (default: beside the HTML file, named report.json)",
    )
    return parser


def report_main(
    argv: Sequence[str], stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    try:
        args = build_parser().parse_args(list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        reports = build_reports(args.run_dirs)
    except RunDirError as exc:
        err.write(f"report: error: {exc}\n")
        return EXIT_USAGE
    html: Path = args.output
    json_path: Path = args.json_path or html.with_name("report.json")
    try:
        write_report(reports, html=html, json_path=json_path)
    except OSError as exc:
        err.write(f"report: error: cannot write the report: {exc}\n")
        return EXIT_USAGE
    for r in reports:
        down = f" (downtime {r.downtime_s:.1f} s)" if r.downtime_s is not None else ""
        out.write(f"{r.name}: {r.outcome}{down}\n")
    out.write(f"report: wrote {html} and {json_path}\n")
    return EXIT_QUALIFIED if all(r.passed for r in reports) else EXIT_NOT_QUALIFIED
