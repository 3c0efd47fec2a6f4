"""Evidence that several criteria quote: clock times, the marker, the launcher's last word."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from pytest_nvrx.criteria.verdict import CriterionId, Verdict, failing
from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.launcher_log import LauncherEvent, LauncherEventKind
from pytest_nvrx.evidence.refs import EvidenceRef, absent, split_rank_prefix
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.timeline import CLOCK_SLACK, logs_from
from pytest_nvrx.evidence.workload import LOAD_FAILURES, WorkloadError
from pytest_nvrx.layout import MARKER_NAME

# The exit status of a rank that dies of an uncaught Python exception.
EXCEPTION_EXIT_CODE = 1
# The faults whose signal the rank sends itself and cannot outlive (SIGKILL, SIGSEGV's default).
SELF_FATAL = frozenset({"kill", "segv"})
# How far a line stamped on the faulted rank's host may read before the marker's time and still
# come after it: one clock, and the workloads cut their stamps to the millisecond.
SAME_HOST_STAMP = timedelta(milliseconds=1)


def or_none(value: object) -> str:
    """A value for a reason's text; "none" where there is none."""
    return "none" if value is None else str(value)


def clock(value: datetime | None) -> str:
    """``11:56:22.787``: the time of day the logs show, to the millisecond ("?" when unknown)."""
    return value.strftime("%H:%M:%S.%f")[:-3] if value is not None else "?"


def stamp(value: datetime) -> str:
    """``2026-11-30 11:56:22.787`` UTC: a clock with its date, for times that may be days apart."""
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def marker_ref(run: RunEvidence, key: str | None = None) -> EvidenceRef:
    """The marker's line for ``key`` (its file when no key); its absence when there is none."""
    if run.marker is None:
        return absent(MARKER_NAME, "absent: no fault was injected")
    return run.marker.ref(key)


def launcher_words(ref: EvidenceRef) -> str:
    """What a launcher line says, without its logging prefix (``... launcher.py:636] ``)."""
    return ref.text.split("] ")[-1].strip()


def launcher_outcome(run: RunEvidence) -> EvidenceRef:
    """The launcher's last word: its success/failure line, else its last timestamped line."""
    finals = run.launcher.of_kind(
        LauncherEventKind.RUN_OK,
        LauncherEventKind.GROUP_SUCCEEDED,
        LauncherEventKind.AGENT_EXIT,
        LauncherEventKind.RUN_FAILED,
        LauncherEventKind.NO_RESTART,
        LauncherEventKind.EARLY_TERMINATION,
    )
    if finals:
        return finals[-1].ref
    if run.launcher.last.ref is not None:
        return run.launcher.last.ref
    return absent(run.launcher.file)


def nproc_per_node(run: RunEvidence) -> int | None:
    """Ranks per node: run.json's gpus_per_node, else the launcher's nproc_per_node."""
    nproc = run.launcher.nproc_per_node
    if run.manifest is not None and run.manifest.gpus_per_node is not None:
        value = run.manifest.gpus_per_node.value
        nproc = value if isinstance(value, int) and value > 0 else nproc
    return nproc


def on_faulted_node(run: RunEvidence, events: Sequence[LauncherEvent]) -> list[LauncherEvent]:
    """The events of the faulted rank's node (group rank = rank // ranks per node), and those
    that name no node. On several nodes every node has a local rank 0: a section timeout or a
    worker failure of local rank 0 on node 0 is not the faulted rank 1's on node 1 (a two-node
    hang whose other rank timed out first was judged by it)."""
    marker = run.marker
    nproc = nproc_per_node(run)
    if marker is None or marker.rank is None or not nproc:
        return list(events)
    node = marker.rank // nproc
    return [e for e in events if e.node is None or e.node == node]


def timed_out_failure(criterion: CriterionId, run: RunEvidence, ending: str) -> Verdict | None:
    """Whatever the logs show, a run our deadline stopped (result.json: timed_out true) did not
    end as it must (``ending`` says how it must); None when it did not time out."""
    manifest = run.manifest
    timed_out = manifest.timed_out if manifest is not None else None
    if timed_out is None or timed_out.value is not True:
        return None
    exit_code = manifest.exit_code if manifest is not None else None
    return failing(
        criterion,
        "the launch timed out (result.json: timed_out true): the launch deadline stopped the"
        f" launcher, the run did not {ending}",
        timed_out.ref,
        exit_code.ref if exit_code is not None else None,
        launcher_outcome(run),
    )


def workload_failures(run: RunEvidence, from_cycle: int | None) -> list[EvidenceRef]:
    """Errors and load failures the workload itself logged, in cycles from ``from_cycle`` on."""
    return [
        e.ref
        for log in logs_from(run, from_cycle)
        for e in log.events
        if isinstance(e, (WorkloadError, *LOAD_FAILURES))
    ]


def rank_of(ref: EvidenceRef) -> int | None:
    """The rank whose NVRx prefix a cycle log's line carries (None: none)."""
    return split_rank_prefix(ref.text)[0]


def rank_lines(log: CycleLog, rank: int) -> list[EvidenceRef]:
    """The lines of ``rank`` in ``log`` that say something of their own, in line order: its
    events, iterations and injector lines (a traceback's frames are part of its error)."""
    refs = [e.ref for e in log.events] + [e.ref for e in log.iterations]
    refs += [line.ref for line in log.injector]
    return sorted(
        (r for r in refs if r.line is not None and rank_of(r) == rank), key=lambda r: r.line or 0
    )


def until_restart(run: RunEvidence, after: EvidenceRef) -> list[LauncherEvent]:
    """The launcher's events after the line ``after`` and before the next ``starting workers``
    or NVRx's ``worker_start_started`` event (a replacement's start, in either launcher's
    words; the log's end where none follows)."""
    at = after.line or 0
    out: list[LauncherEvent] = []
    for e in run.launcher.events:
        line = e.ref.line or 0
        if line <= at:
            continue
        if e.kind is LauncherEventKind.WORKERS_STARTING or (
            e.kind is LauncherEventKind.PROFILING and e.name == "worker_start_started"
        ):
            break
        out.append(e)
    return out


def one_node(run: RunEvidence) -> bool:
    """Whether the run had one node, so one launcher wrote every launcher line: run.json's
    nnodes 1, else (a run made by hand) the launcher's own min_nodes = max_nodes = 1."""
    manifest = run.manifest
    if manifest is not None and manifest.nnodes is not None:
        return bool(manifest.nnodes.value == 1)
    return run.launcher.config.get("min_nodes") == run.launcher.config.get("max_nodes") == "1"


def same_launcher(run: RunEvidence, a: LauncherEvent, b: LauncherEvent) -> bool:
    """Whether two launcher lines come from one launcher: always on one node (a line there
    that names another launcher pid is not another launcher's); else the same node id, else the
    same pid of the launcher that wrote them. Unknown (neither says): they may, so True."""
    if one_node(run):
        return True
    if a.node is not None and b.node is not None:
        return a.node == b.node
    if a.launcher_pid is not None and b.launcher_pid is not None:
        return a.launcher_pid == b.launcher_pid
    return True


def node_host(run: RunEvidence, node: int | None) -> str | None:
    """The host node ``node`` ran on, where the run says: run.json's ``host`` for the node its
    harness started, the marker's for the faulted rank's node; None where neither says."""
    manifest, marker = run.manifest, run.marker
    if node is None:
        return None
    if manifest is not None and manifest.host is not None:
        own = manifest.node_index.value if manifest.node_index is not None else 0
        if own == node and isinstance(manifest.host.value, str):
            return manifest.host.value
    nproc = nproc_per_node(run)
    if marker is not None and marker.rank is not None and nproc and marker.rank // nproc == node:
        return marker.host
    return None


def one_host(run: RunEvidence) -> bool:
    """Whether every node of the run ran on one host, where a pid names one process: one node,
    or every node's host known (run.json's, the marker's) and the same."""
    if one_node(run):
        return True
    manifest = run.manifest
    nodes = manifest.nnodes.value if manifest is not None and manifest.nnodes is not None else None
    if not isinstance(nodes, int) or nodes < 1:
        return False
    hosts = {node_host(run, n) for n in range(nodes)}
    return None not in hosts and len(hosts) == 1


def same_host(run: RunEvidence, a: LauncherEvent, b: LauncherEvent) -> bool:
    """Whether the launchers that wrote two lines ran on one host, where a pid names one
    process: one launcher, or two nodes the run places on one host. On several hosts the same
    number may name two processes."""
    return same_launcher(run, a, b) or _hosts_agree(run, a.node, b.node)


def _hosts_agree(run: RunEvidence, a: int | None, b: int | None) -> bool:
    """Whether the run places nodes ``a`` and ``b`` on one known host."""
    host = node_host(run, a)
    return host is not None and host == node_host(run, b)


def clock_allowance(run: RunEvidence, rank: int | None) -> timedelta:
    """How far a line of ``rank`` may be stamped before the marker's time and still come after
    it: a stamp's millisecond on the faulted rank's host (one clock; the workloads cut their
    stamps to the millisecond), :data:`CLOCK_SLACK` on another host or where unknown."""
    marker = run.marker
    nproc = nproc_per_node(run)
    if marker is None or marker.rank is None or rank is None or not nproc:
        return CLOCK_SLACK
    node, faulted = rank // nproc, marker.rank // nproc
    if one_node(run) or node == faulted or _hosts_agree(run, node, faulted):
        return SAME_HOST_STAMP
    return CLOCK_SLACK
