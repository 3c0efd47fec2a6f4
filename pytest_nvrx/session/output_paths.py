"""Where a pytest session's outputs go, and why one must not be written, without pytest.

Ours (--nvrx-report's page, its report.json beside it, with --nvrx-compare the comparison's
document) are renamed over their paths; pytest's own (--junitxml, its cache dir) are written in
place. None may lie where something other than a regular file is (a device, FIFO, symlink), or
resolve (links followed) into a run dir judged (--nvrx-run-dir, the work dir's runs/, a run
judged this session) or onto another output. The plugin finds pytest's paths as pytest will
(--junitxml's directory it checks first, in every session) and asks here.
"""

from __future__ import annotations

from pathlib import Path

from pytest_nvrx.layout import RUNS_DIR
from pytest_nvrx.outputs import (
    OutputRefused,
    check_in_place_output,
    check_output_targets,
    check_outputs,
)
from pytest_nvrx.report.main import json_beside
from pytest_nvrx.settings import SessionPaths


def compare_json_path(html: Path) -> Path:
    """Where --nvrx-compare's document goes: beside the page, named after it (``out/a.html`` ->
    ``out/a.compare.json``), as report.json is (``out/a.json``): two reports in one directory
    keep both."""
    return html.with_suffix(".compare.json")


def report_outputs(html: Path, *, compare: bool) -> list[tuple[str, Path]]:
    """--nvrx-report's files (the page, its JSON, with ``compare`` the comparison's JSON), each
    with the option that names it."""
    ours = [("--nvrx-report", html), ("--nvrx-report's JSON", json_beside(html))]
    if compare:
        ours.append(("--nvrx-report's comparison JSON", compare_json_path(html)))
    return ours


def output_refusal(
    here: Path, paths: SessionPaths, *, junit: Path | None, cache: Path | None
) -> str | None:
    """Why the session's outputs must not be written (module doc), or None. ``here``: the
    directory pytest was invoked in (``paths``' relative ones are from it); ``junit``,
    ``cache``: where pytest's junitxml and cache plugin will write (None: they will not)."""
    # ours, renamed over their paths (pytest writes --junitxml and its cache in place)
    report = paths.report
    ours = report_outputs(here / report, compare=paths.compare) if report is not None else []
    outputs = list(ours)
    if junit is not None:
        outputs.append(("--junitxml", junit))
    if cache is not None:
        # judging --nvrx-run-dir . from inside the run dir made .pytest_cache/ there
        outputs.append(
            (
                "pytest's cache dir (move it: -o cache_dir=DIR; or drop it: -p no:cacheprovider)",
                cache,
            )
        )
    evidence = [("the run dir", Path(d)) for d in paths.judged]
    if paths.run_dir is not None:
        evidence.append(("--nvrx-run-dir", here / paths.run_dir))
    if paths.work_dir is not None:
        evidence.append(("the scenarios' run dirs", paths.work_dir / RUNS_DIR))
    try:
        check_outputs(outputs, evidence)
        check_output_targets(ours)
        if junit is not None:
            # pytest truncates it in place: a hard link of run.json would be overwritten
            check_in_place_output("--junitxml", junit, evidence)
    except OutputRefused as exc:
        return str(exc)
    return None
