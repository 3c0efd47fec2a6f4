"""Where the wall time of a qualification matrix goes: the launchers, and the harness around them.

Run (the CPU reference matrix, as ./qualify runs it; minutes on 2 cores)::

    flock /tmp/nvrx-heavy.lock .venv/bin/python benchmarks/bench_matrix.py run --out serial.json
    .venv/bin/python benchmarks/bench_matrix.py run --parallel 2 --out parallel.json
    .venv/bin/python benchmarks/bench_matrix.py report serial.json
    .venv/bin/python benchmarks/bench_matrix.py compare serial.json parallel.json

``run`` starts ``python -m pytest --pyargs pytest_nvrx.suite -m "not gpu" -v -rA`` (./qualify's
selection; extra pytest arguments after ``--``, e.g. ``-- -m gpu --nvrx-megatron-path ...``) in a
fresh ``--basetemp``, with this file loaded as a pytest plugin (``-p bench_matrix``). The plugin
changes nothing: it times pytest's phases (configure, collection, each test's setup/call/teardown)
and wraps the harness functions the scenarios spend time in (stack probe, planning, the launch's
wait and stop, kill_tree, evidence loading, judging, retention) with timers that call them
unchanged. Afterwards each run dir's ``result.json`` gives the launcher's own wall (``wall_s``,
``start_time``, ``end_time``: pytest_nvrx.launch.launcher writes it when the launcher exits).

Reported: pytest's wall (this script starts and reaps the process), the sum of the launcher walls,
the overhead ratio ``(pytest wall - sum of launcher walls) / pytest wall``, and where the rest
went. ``--parallel N`` passes ``--nvrx-parallel N`` (N scenarios of a workload side by side; GPU
scenarios on GPU slots of their own, see ``--nvrx-gpu-share``) and records it; ``compare`` gives the
speed-up of one result over another (serial vs parallel), and the union of the launcher intervals
(with scenarios side by side, the launchers' sum can exceed the wall).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: where the plugin (inside pytest) writes its timings; set by ``run``
TIMINGS_VAR = "BENCH_MATRIX_TIMINGS"
#: ./qualify's selection and flags for the CPU reference matrix
QUALIFY_ARGS = ("--pyargs", "pytest_nvrx.suite", "-m", "not gpu", "-v", "-rA")
RESULT_SCHEMA = 1

# Harness functions timed inside pytest: (label, module, attribute path). Each is wrapped where
# it is defined and wherever a pytest_nvrx module bound it by name (``from x import f``), so a
# refactor that moves a caller does not hide it; the ones not found are reported as such.
TIMED: tuple[tuple[str, str, str], ...] = (
    ("stack_probe", "pytest_nvrx.megatron.stack", "detect_stack"),
    ("plan", "pytest_nvrx.launch.planning", "plan_run"),
    ("prepare_run_dir", "pytest_nvrx.launch.run_dir_setup", "prepare_run_dir"),
    ("launch_start", "pytest_nvrx.launch.launcher", "Launch.start"),
    ("launch_wait", "pytest_nvrx.launch.launcher", "Launch.wait"),
    ("launch_stop", "pytest_nvrx.launch.launcher", "Launch.stop"),
    ("kill_tree", "pytest_nvrx.launch.launcher", "kill_tree"),
    ("load_run", "pytest_nvrx.evidence.rundir", "load_run"),
    ("judge", "pytest_nvrx.criteria", "judge"),
    ("retention", "pytest_nvrx.launch.retention", "prune_checkpoint_payload"),
)
#: modules imported before wrapping, so that their by-name bindings are found and wrapped too
CALLERS = ("pytest_nvrx.fixtures", "pytest_nvrx.session.scenario_run", "pytest_nvrx.cli")


# ---------------------------------------------------------------------------------------------
# pure parts: launcher walls from run dirs, intervals, overhead, breakdown


@dataclass(frozen=True)
class LauncherWall:
    """One launch as its result.json records it (epoch seconds)."""

    run_dir: str
    wall_s: float
    start: float | None
    end: float | None
    exit_code: int | None


def _epoch(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo is not None else None


def read_launcher_wall(run_dir: Path) -> LauncherWall | None:
    """The launcher's wall from ``run_dir/result.json``; None without a usable one."""
    try:
        data = json.loads((run_dir / "result.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("wall_s"), int | float):
        return None
    exit_code = data.get("exit_code")
    return LauncherWall(
        run_dir=str(run_dir),
        wall_s=float(data["wall_s"]),
        start=_epoch(data.get("start_time")),
        end=_epoch(data.get("end_time")),
        exit_code=exit_code if isinstance(exit_code, int) else None,
    )


def find_run_dirs(root: Path) -> list[Path]:
    """Every run dir below ``root`` (a directory holding result.json), in name order."""
    return sorted(p.parent for p in root.rglob("result.json"))


def union_s(intervals: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by at least one interval."""
    covered = 0.0
    end = float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        covered += stop - max(start, end)
        end = stop
    return covered


def overhead_ratio(pytest_wall_s: float, launcher_sum_s: float) -> float:
    """``(pytest wall - sum of launcher walls) / pytest wall``."""
    return (pytest_wall_s - launcher_sum_s) / pytest_wall_s if pytest_wall_s > 0 else 0.0


@dataclass(frozen=True)
class Span:
    """One timed call or phase inside pytest (epoch seconds); ``scenario`` when known."""

    label: str
    start: float
    end: float
    scenario: str | None = None

    @property
    def seconds(self) -> float:
        return self.end - self.start


def totals(spans: Iterable[Span]) -> dict[str, float]:
    """Seconds per label, calls nested in a call of the same label counted once."""
    by_label: dict[str, list[tuple[float, float]]] = {}
    for span in spans:
        by_label.setdefault(span.label, []).append((span.start, span.end))
    return {label: round(union_s(v), 3) for label, v in sorted(by_label.items())}


def scenario_of(nodeid: str) -> str | None:
    """The scenario parameter of a suite test id (``...::test_x[reference-kill-save]``)."""
    if "[" not in nodeid or not nodeid.endswith("]"):
        return None
    return nodeid[nodeid.index("[") + 1 : -1]


def run_scenario(run_dir_name: str) -> str:
    """The scenario of a run dir the plugin named ``<scenario>-<YYYYmmddTHHMMSS>-<pid>``."""
    m = re.fullmatch(r"(.+)-\d{8}T\d{6}-\d+", run_dir_name)
    return m[1] if m else run_dir_name


@dataclass
class Breakdown:
    """Where a pytest wall went, in seconds; ``unaccounted`` is what no timer covers."""

    pytest_wall_s: float
    launcher_sum_s: float
    launcher_union_s: float
    overhead_s: float
    overhead_ratio: float
    phases: dict[str, float] = field(default_factory=dict)
    #: per scenario: its tests' setup+call+teardown, the launcher's wall, and the harness calls
    scenarios: dict[str, dict[str, float]] = field(default_factory=dict)
    unaccounted_s: float = 0.0


def breakdown(
    pytest_wall_s: float,
    started: float,
    walls: Sequence[LauncherWall],
    spans: Sequence[Span],
) -> Breakdown:
    """Split ``pytest_wall_s`` (started at epoch ``started``) into the launchers and the rest.

    The phases: ``interpreter_to_configure`` (Python start, imports, plugin loading),
    ``collection``, ``tests`` (every setup/call/teardown), ``session_end`` (after the last test
    to pytest's exit: summary, JUnit, interpreter exit), and inside tests the harness calls by
    label. ``unaccounted`` is the wall that neither the launchers nor a harness call nor
    collection covers (pytest's own per-test work, terminal output, fixtures' glue).
    """
    end = started + pytest_wall_s
    launcher_sum = sum(w.wall_s for w in walls)
    intervals = [(w.start, w.end) for w in walls if w.start is not None and w.end is not None]
    launcher_union = union_s(intervals) if intervals else launcher_sum
    by_label = {s.label: s for s in spans if s.label in ("configure", "collection")}
    tests = [s for s in spans if s.label in ("setup", "call", "teardown")]
    phases: dict[str, float] = {}
    if "configure" in by_label:
        phases["interpreter_to_configure"] = round(by_label["configure"].start - started, 3)
    if "collection" in by_label:
        phases["collection"] = round(by_label["collection"].seconds, 3)
    if tests:
        phases["tests"] = round(union_s((s.start, s.end) for s in tests), 3)
        phases["session_end"] = round(end - max(s.end for s in tests), 3)

    # a suite test's id is <scenario>-<criterion>; the scenarios are the run dirs' names
    names = sorted({run_scenario(Path(w.run_dir).name) for w in walls}, key=len, reverse=True)

    def owner(test_id: str | None) -> str | None:
        if test_id is None:
            return None
        return next((n for n in names if test_id == n or test_id.startswith(f"{n}-")), test_id)

    spans = [Span(s.label, s.start, s.end, owner(s.scenario)) for s in spans]
    tests = [s for s in spans if s.label in ("setup", "call", "teardown")]
    scenarios: dict[str, dict[str, float]] = {}
    for span in tests:
        if span.scenario is None:
            continue
        entry = scenarios.setdefault(span.scenario, {})
        entry[span.label] = round(entry.get(span.label, 0.0) + span.seconds, 3)
    harness = [s for s in spans if s.label not in ("configure", "collection", "session")]
    harness = [s for s in harness if s.label not in ("setup", "call", "teardown")]
    phases.update({f"calls.{k}": v for k, v in totals(harness).items()})
    for span in harness:
        if span.scenario is not None and span.scenario in scenarios:
            entry = scenarios[span.scenario]
            entry[span.label] = round(entry.get(span.label, 0.0) + span.seconds, 3)
    for wall in walls:
        ran = scenarios.get(run_scenario(Path(wall.run_dir).name))
        if ran is not None:
            ran["launcher_wall"] = round(ran.get("launcher_wall", 0.0) + wall.wall_s, 3)

    # what no timer covers: the wall less the union of launchers, collection and harness calls
    covered = [*intervals]
    covered += [(s.start, s.end) for s in harness if s.label not in ("launch_wait",)]
    if "collection" in by_label:
        covered.append((by_label["collection"].start, by_label["collection"].end))
    if "configure" in by_label:
        covered.append((started, by_label["configure"].start))
    if tests:
        covered.append((max(s.end for s in tests), end))
    return Breakdown(
        pytest_wall_s=round(pytest_wall_s, 3),
        launcher_sum_s=round(launcher_sum, 3),
        launcher_union_s=round(launcher_union, 3),
        overhead_s=round(pytest_wall_s - launcher_sum, 3),
        overhead_ratio=round(overhead_ratio(pytest_wall_s, launcher_sum), 4),
        phases=phases,
        scenarios=scenarios,
        unaccounted_s=round(pytest_wall_s - union_s(covered), 3),
    )


def speedup(serial: Mapping[str, Any], parallel: Mapping[str, Any]) -> dict[str, float]:
    """The speed-up of ``parallel`` over ``serial`` (two ``run`` results), and how close the
    parallel wall is to its slowest launcher (the bound a perfect scheduler reaches)."""
    s_wall = float(serial["breakdown"]["pytest_wall_s"])
    p_wall = float(parallel["breakdown"]["pytest_wall_s"])
    slowest = max((float(w["wall_s"]) for w in parallel["launchers"]), default=0.0)
    return {
        "serial_wall_s": s_wall,
        "parallel_wall_s": p_wall,
        "speedup": round(s_wall / p_wall, 3) if p_wall > 0 else 0.0,
        "slowest_launcher_s": slowest,
        "wall_over_slowest": round(p_wall / slowest, 3) if slowest > 0 else 0.0,
    }


def load_spans(paths: Iterable[Path]) -> list[Span]:
    spans: list[Span] = []
    for path in paths:
        for item in json.loads(path.read_text()):
            spans.append(Span(item["label"], item["start"], item["end"], item.get("scenario")))
    return spans


def format_report(result: Mapping[str, Any]) -> str:
    b = result["breakdown"]
    lines = [
        f"machine: {result['machine']}",
        f"command: {' '.join(result['command'])}",
        f"pytest exit {result['exit_code']}, parallel {result['parallel'] or 'no'}",
        f"pytest wall            {b['pytest_wall_s']:8.1f} s",
        f"launcher walls (sum)   {b['launcher_sum_s']:8.1f} s over {len(result['launchers'])} runs"
        f" (union {b['launcher_union_s']:.1f} s)",
        f"overhead               {b['overhead_s']:8.1f} s = {100 * b['overhead_ratio']:.1f} %",
        "where the rest goes:",
    ]
    lines += [f"  {name:28s} {seconds:8.2f} s" for name, seconds in b["phases"].items()]
    lines.append(f"  {'unaccounted':28s} {b['unaccounted_s']:8.2f} s")
    lines.append("per scenario (s):")
    for name, entry in b["scenarios"].items():
        launcher = entry.get("launcher_wall", 0.0)
        tests = sum(entry.get(k, 0.0) for k in ("setup", "call", "teardown"))
        rest = ", ".join(
            f"{k} {v:.2f}"
            for k, v in entry.items()
            if k not in ("setup", "call", "teardown", "launcher_wall")
        )
        lines.append(
            f"  {name:24s} tests {tests:7.2f}  launcher {launcher:7.2f}  "
            f"harness {tests - launcher:6.2f}  ({rest})"
        )
    if result.get("not_instrumented"):
        lines.append(f"not instrumented (absent here): {', '.join(result['not_instrumented'])}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the pytest plugin (loaded inside the measured pytest with -p bench_matrix)

_SPANS: list[dict[str, Any]] = []
_CURRENT: dict[str, str | None] = {"scenario": None}
_COLLECTION_START: list[float] = []
_MISSING: list[str] = []


def _record(label: str, start: float, end: float) -> None:
    _SPANS.append({"label": label, "start": start, "end": end, "scenario": _CURRENT["scenario"]})


def _timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            _record(label, start, time.time())

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def _instrument() -> None:
    import importlib

    for caller in CALLERS:
        with contextlib.suppress(ImportError):
            importlib.import_module(caller)
    for label, module_name, path in TIMED:
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError:
            _MISSING.append(f"{module_name}.{path}")
            continue
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent, None)
        fn = getattr(owner, name, None) if owner is not None else None
        if fn is None or not callable(fn):
            _MISSING.append(f"{module_name}.{path}")
            continue
        wrapper = _timed(label, fn)
        setattr(owner, name, wrapper)
        if parents:
            continue  # a method: every caller reaches it through its class
        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("pytest_nvrx"):
                for attr, value in list(vars(module).items()):
                    if value is fn:
                        setattr(module, attr, wrapper)


def pytest_configure(config: Any) -> None:
    _SPANS.append({"label": "configure", "start": time.time(), "end": time.time()})
    _instrument()


def pytest_collection(session: Any) -> None:
    _COLLECTION_START.append(time.time())


def pytest_collection_finish(session: Any) -> None:
    start = _COLLECTION_START[0] if _COLLECTION_START else time.time()
    _SPANS.append({"label": "collection", "start": start, "end": time.time()})


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _CURRENT["scenario"] = scenario_of(nodeid)


def pytest_runtest_logreport(report: Any) -> None:
    start, stop = getattr(report, "start", None), getattr(report, "stop", None)
    if start is not None and stop is not None:
        _SPANS.append(
            {
                "label": report.when,
                "start": start,
                "end": stop,
                "scenario": scenario_of(report.nodeid),
            }
        )


def pytest_unconfigure(config: Any) -> None:
    target = os.environ.get(TIMINGS_VAR)
    if not target:
        return
    worker = getattr(config, "workerinput", {}).get("workerid")
    path = Path(target if worker is None else f"{target}.{worker}")
    path.write_text(json.dumps(_SPANS))
    if _MISSING and worker is None:
        path.with_suffix(".missing").write_text("\n".join(_MISSING))


# ---------------------------------------------------------------------------------------------
# the command line


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    return f"{platform.node()}: {cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def run(out: Path, parallel: int | None, extra: Sequence[str], keep: Path | None) -> dict[str, Any]:
    scratch = Path(keep) if keep is not None else Path(tempfile.mkdtemp(prefix="bench-matrix-"))
    scratch.mkdir(parents=True, exist_ok=True)
    basetemp = scratch / "basetemp"
    timings = scratch / "timings.json"
    args = [*QUALIFY_ARGS, "-p", "bench_matrix", f"--basetemp={basetemp}"]
    args += [f"--junitxml={scratch / 'junit.xml'}", "-p", "no:cacheprovider"]
    if parallel:
        args += ["--nvrx-parallel", str(parallel)]
    command = [sys.executable, "-m", "pytest", *args, *extra]
    env = dict(os.environ)
    # the plugin (this file), and this checkout's package for pytest and the launched workers
    here = (str(Path(__file__).resolve().parent), str(ROOT), env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in here if p)
    env[TIMINGS_VAR] = str(timings)
    # run dirs under the fresh --basetemp, where they are looked for (a work dir set in the
    # environment, as scripts/device_gpu_suite.sh sets one, would take them elsewhere)
    env.pop("NVRX_WORK_DIR", None)
    print(f"bench_matrix: {' '.join(command)}", file=sys.stderr, flush=True)
    started = time.time()
    t0 = time.monotonic()
    proc = subprocess.run(command, cwd=ROOT, env=env, check=False)
    wall = time.monotonic() - t0
    spans = load_spans([timings, *sorted(scratch.glob("timings.json.*"))])
    missing_file = timings.with_suffix(".missing")
    missing = missing_file.read_text().split() if missing_file.exists() else []
    walls = [w for d in find_run_dirs(basetemp) if (w := read_launcher_wall(d)) is not None]
    result = {
        "schema": RESULT_SCHEMA,
        "machine": machine(),
        "command": command,
        "exit_code": proc.returncode,
        "parallel": parallel,
        "started": started,
        "launchers": [asdict(w) for w in walls],
        "breakdown": asdict(breakdown(wall, started, walls, spans)),
        # labels looked for in places a refactor may have moved them from: not all can exist
        "not_instrumented": missing,
        "scratch": str(scratch),
        # what the breakdown was computed from, to recompute it
        "spans": [asdict(s) for s in spans],
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run the matrix under pytest and measure it")
    p_run.add_argument("--out", type=Path, default=Path("bench-matrix.json"))
    p_run.add_argument("--parallel", type=int, default=None, help="pass --nvrx-parallel N")
    p_run.add_argument("--keep", type=Path, default=None, help="scratch dir to keep (run dirs)")
    p_run.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments")
    p_report = sub.add_parser("report", help="print a result file")
    p_report.add_argument("result", type=Path)
    p_cmp = sub.add_parser("compare", help="speed-up of a parallel result over a serial one")
    p_cmp.add_argument("serial", type=Path)
    p_cmp.add_argument("parallel", type=Path)
    args = parser.parse_args(argv)
    if args.command == "run":
        result = run(args.out, args.parallel, args.pytest_args, args.keep)
        print(format_report(result))
        print(f"bench_matrix: result in {args.out}")
        return 0 if result["exit_code"] in (0, 1) else int(result["exit_code"])
    if args.command == "report":
        print(format_report(json.loads(args.result.read_text())))
        return 0
    serial, parallel = (json.loads(p.read_text()) for p in (args.serial, args.parallel))
    print(json.dumps(speedup(serial, parallel), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
