"""The session's summary on the controller, without pytest: what the judged scenarios' entries
(session/console.py's, shipped on their first test reports) add up to at the session's end.

Why a session whose selected tests passed still fails (a NOT QUALIFIED scenario, a comparison
gate that failed), the comparison with --nvrx-compare's report, the report written
(--nvrx-report) and the console's closing summary: the verdicts, the verdict table, where the
outputs went. The plugin feeds it, turns a failure it reports into pytest's exit status, and
hands it the terminal to write to (a :class:`Writer`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pytest_nvrx.compare import Comparison, Incomparable, Side, compare
from pytest_nvrx.compare.render import document_json, section_html, text
from pytest_nvrx.compare.session import session_side
from pytest_nvrx.evidence.refs import printable
from pytest_nvrx.outputs import write_output
from pytest_nvrx.report import ScenarioReport, json_beside, write_report
from pytest_nvrx.session.output_paths import compare_json_path
from pytest_nvrx.session.scenario_run import Limits, ScenarioRun
from pytest_nvrx.session.verdict_table import Row, fit, verdict_table
from pytest_nvrx.settings.compare_gate import GateRule

#: how writing the report went: written, nothing to write, refused (a usage error), failed
ReportStatus = Literal["written", "none", "refused", "failed"]


class Writer(Protocol):
    """The part of pytest's terminal reporter the summary writes with."""

    def section(self, title: str) -> None: ...

    def write_sep(self, sep: str, title: str) -> None: ...

    def write_line(self, line: str, **markup: bool) -> None: ...


@dataclass
class SessionSummary:
    """The judged scenarios' entries, by key (the first report of each carries it), and what the
    session's end made of them."""

    #: --nvrx-report's page (absolute); None: no report asked for
    html: Path | None
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: where the report went, or why it did not
    outcome: str | None = None
    comparison: Comparison | None = None
    #: the comparison's lines for the terminal (or why there is none)
    compare_lines: list[str] = field(default_factory=list)
    #: why the session failed although its tests passed
    failures: list[str] = field(default_factory=list)

    @property
    def json_path(self) -> Path | None:
        """Where --nvrx-report's report.json goes: beside the page, named after it
        (``out/a.html`` -> ``out/a.json``, the ``report -o`` rule)."""
        return None if self.html is None else json_beside(self.html)

    def add(self, entry: object) -> None:
        """A test report's scenario entry; the first of each scenario counts."""
        if isinstance(entry, dict) and isinstance(entry.get("key"), str):
            self.entries.setdefault(entry["key"], entry)

    def block_keys(self, judged: Sequence[ScenarioRun]) -> list[str]:
        """The scenario of each of :meth:`blocks`, in its order."""
        return [*self.entries, *(run.key for run in judged if run.key not in self.entries)]

    def blocks(self, judged: Sequence[ScenarioRun]) -> list[list[str]]:
        """Each scenario's summary block, led by its outcome line; runs judged here (``judged``)
        whose entry no report carried (none should be) still show their verdicts."""
        blocks = [[entry["outcome"], *entry["lines"]] for entry in self.entries.values()]
        blocks += [run.summary_lines() for run in judged if run.key not in self.entries]
        return blocks

    def not_qualified(self) -> list[tuple[str, str]]:
        """(scenario, first cause) of every judged scenario that did not qualify."""
        return [
            (key, str(entry["cause"]))
            for key, entry in self.entries.items()
            if entry.get("cause") is not None
        ]

    def rows(self, judged: Sequence[ScenarioRun], limits: Limits | None) -> list[Row]:
        """The verdict table's rows: the entries', then those of runs judged here that no
        report carried, held to ``limits``."""
        rows = [Row.from_dict(e["row"]) for e in self.entries.values() if e.get("row")]
        rows += [run.table_row(limits) for run in judged if run.key not in self.entries]
        return rows

    def reports(self) -> list[dict[str, Any]]:
        """The recovery reports' data the entries carry (those asked for and built)."""
        return [e["report"] for e in self.entries.values() if e.get("report") is not None]

    def fail_unqualified(self) -> bool:
        """A NOT QUALIFIED scenario fails the session even when every test that ran passed
        (``-k prior_checkpoint``, ``--lf`` after a failed session, ``-m`` of a few criteria):
        a retry of the failed tests never turns a broken stack green. Call it for a session
        that passed; True: it fails now, :attr:`failures` say why."""
        failed = self.not_qualified()
        if not failed:
            return False
        self.failures = [
            f"pytest-nvrx: scenario {key} is NOT QUALIFIED although every selected test of it"
            f" passed: {cause}"
            for key, cause in failed
        ]
        return True

    def compare(
        self,
        previous: Side,
        rules: Sequence[GateRule],
        *,
        gate_noise: bool,
        verbose: bool,
        passed: bool,
    ) -> bool:
        """The session against --nvrx-compare's report (``previous``), after every scenario was
        judged: its lines (the details, every phase of every scenario, only ``verbose``). A gate
        that fails (or cannot judge: nothing in common) fails a session that ``passed``; True:
        it fails now, :attr:`failures` say why."""
        data = self.reports()
        if not data:
            return False
        reports = [ScenarioReport.from_dict(d) for d in data]
        try:
            result = compare(previous, session_side(reports), rules, gate_noise=gate_noise)
        except Incomparable as exc:
            why = f"cannot compare with {previous.source}: {exc}"
            self.compare_lines = [why]
            if rules and passed:
                self.failures.append(f"pytest-nvrx: --nvrx-compare-fail: {why}")
                return True
            return False
        self.comparison = result
        lines = text(result).splitlines()
        if not verbose:
            lines = [line for line in lines if not line.startswith("  ") or "verdict" in line]
        self.compare_lines = lines
        if not (result.gate_failed and passed):
            return False
        joined = ",".join(str(r) for r in result.rules)
        self.failures += [
            f"pytest-nvrx: --nvrx-compare-fail {joined}: {failure}" for failure in result.failures
        ]
        return True

    def write_report(self, refusal: Callable[[Sequence[Path]], str | None]) -> ReportStatus:
        """The report (--nvrx-report) of the scenarios judged, with the comparison's section and
        its document beside it; :attr:`outcome` says where it went or why not. ``refusal``: why
        the outputs must not be written, given the run dirs judged (known only now: the work
        dir may come from the environment, unread when the options were checked)."""
        html, json_path = self.html, self.json_path
        if html is None or json_path is None:
            return "none"
        data = self.reports()
        if not data:
            self.outcome = f"no scenario was judged: {html} not written"
            return "none"
        refused = refusal([Path(d["run_dir"]) for d in data if isinstance(d.get("run_dir"), str)])
        if refused is not None:
            self.outcome = f"not written: {refused}"
            return "refused"
        sections = []
        if self.comparison is not None:
            title = f"Compared with {self.comparison.old.source}"
            sections.append((title, section_html(self.comparison)))
        try:
            write_report(
                [ScenarioReport.from_dict(d) for d in data],
                html=html,
                json_path=json_path,
                sections=sections,
            )
            if self.comparison is not None:
                write_output(compare_json_path(html), document_json(self.comparison))
        except OSError as exc:
            self.outcome = f"cannot write the report: {exc}"
            return "failed"
        count = f"{len(data)} scenario{'' if len(data) == 1 else 's'}"
        self.outcome = f"{html} and {json_path} ({count})"
        return "written"

    def write_terminal(
        self,
        tr: Writer,
        judged: Sequence[ScenarioRun],
        limits: Limits | None,
        *,
        verbosity: int,
        width: int,
        junit: Path | None,
    ) -> None:
        """The verdicts, each with the line that proves it, of every scenario that did not
        qualify (of all with -vv); then the closing table, one row per scenario; then where
        the report and the JUnit XML went, the comparison and why the session failed.
        ``judged``: the runs judged on this process (``limits``: what they are held to)."""
        if not (self.entries or judged or self.outcome or self.compare_lines or self.failures):
            return
        failed = {key for key, _ in self.not_qualified()}
        blocks = []
        for key, block in zip(self.block_keys(judged), self.blocks(judged), strict=True):
            if key in failed or key not in self.entries or verbosity >= 2:
                blocks.append((key, block))  # the whole reasons: they are what to read
            elif verbosity >= 0:  # -q: only the scenarios that did not qualify
                # the outcome and the run dir whole (a path to copy), each verdict in a line
                # (at least 120 characters: a narrow terminal wraps rather than loses it)
                head, verdicts = block[:2], block[2:]
                blocks.append((key, [*head, *(fit(line, max(width, 120)) for line in verdicts)]))
        if blocks:
            tr.section("nvrx verdicts")
            for key, block in blocks:
                for line in block:
                    tr.write_line(printable(line))
                # how a failed run ended, once, after its verdicts (never once per failed test)
                for title, tail in self.entries.get(key, {}).get("tails") or ():
                    tr.write_sep("-", printable(title))
                    tr.write_line(printable(tail, lines=True))
        rows = self.rows(judged, limits)
        if rows:
            tr.section("nvrx verdict table")
            for line in verdict_table(rows, width=width):
                tr.write_line(printable(line))
        for entry in self.entries.values():
            if entry.get("report_error"):
                left_out = f"nvrx report: {entry['key']} left out: {entry['report_error']}"
                tr.write_line(printable(left_out))
        where = []
        if self.outcome is not None:
            where.append(f"report: {self.outcome}")
        elif rows and self.html is None:
            where.append("report: none (--nvrx-report PATH writes one)")
        if rows and junit is not None:
            where.append(f"JUnit: {junit}")
        if where:
            tr.write_line(printable("nvrx " + "; ".join(where)))
        if self.compare_lines:
            tr.section("nvrx compare")
            for line in self.compare_lines:
                tr.write_line(printable(line))
        for line in self.failures:
            tr.write_line(printable(line), red=True, bold=True)
