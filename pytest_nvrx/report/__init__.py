"""The recovery report: ``report.json`` and one self-contained offline HTML page (pytest-free).

API (docs/report.md):

* :meth:`ScenarioReport.from_run_dir` judges a run directory as ``verify`` does and derives the
  recovery breakdown, the timeline and the loss series; :meth:`ScenarioReport.from_judgement`
  does it for a run already judged. A report is plain data: :meth:`ScenarioReport.as_dict` /
  :meth:`ScenarioReport.from_dict` (what an xdist worker ships to the controller).
* :func:`report_json` (the versioned document) and :func:`render_html` (the page) over several.
* :func:`write_report` writes either or both (:func:`json_beside`: the JSON's default path);
  :func:`report_main` is the command (``python -m pytest_nvrx.report``).
"""

from __future__ import annotations

from pytest_nvrx.evidence.timeline import MILESTONES, PHASES, Phase
from pytest_nvrx.report.main import build_reports, json_beside, report_main, write_report
from pytest_nvrx.report.model import SCHEMA_VERSION, ScenarioReport
from pytest_nvrx.report.recovery import LostWork, Recovery
from pytest_nvrx.report.render import pair_baselines, render_html, report_json

__all__ = [
    "MILESTONES",
    "PHASES",
    "SCHEMA_VERSION",
    "LostWork",
    "Phase",
    "Recovery",
    "ScenarioReport",
    "build_reports",
    "json_beside",
    "pair_baselines",
    "render_html",
    "report_json",
    "report_main",
    "write_report",
]
