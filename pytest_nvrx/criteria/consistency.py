"""Problems no single parser can see: artifacts that contradict each other or themselves.

The parsers report a file that is missing, unreadable or of the wrong type; here the records are
compared with each other. A contradiction that leaves nothing to trust is fatal (the run cannot
be judged, ``verify`` exits 2); one that a criterion judges is a warning shown beside it.
"""

from __future__ import annotations

from pytest_nvrx.evidence.refs import Problem
from pytest_nvrx.evidence.rundir import RunEvidence


def evidence_problems(run: RunEvidence) -> tuple[Problem, ...]:
    """What the run's artifacts say that cannot all be true."""
    problems: list[Problem] = []
    for record in run.cycles:
        if record.start is not None and record.end is not None and record.end < record.start:
            problems.append(
                Problem(
                    "fatal",
                    f"{record.ref.file}: cycle {record.cycle} ends before it starts"
                    f" ({record.end.isoformat()} < {record.start.isoformat()})",
                    record.end_ref or record.ref,
                )
            )
    if run.cycle_infos.exists:
        recorded = sorted({record.cycle for record in run.cycles})
        listed = ", ".join(map(str, recorded)) or "none"
        for log in run.cycle_logs:
            if log.exists and log.cycle not in recorded:
                # no_repeat_injection fails when such a log shows the job ran again
                problems.append(
                    Problem(
                        "warning",
                        f"{log.file} has no cycle record in {run.cycle_infos.dir}/ (the launcher"
                        f" recorded cycles {listed})",
                        log.first_line,
                    )
                )
    return tuple(problems)
