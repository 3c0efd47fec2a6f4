#!/usr/bin/env python
"""Record real ft_launcher runs of the CPU reference workload for the evidence parsers.

Three cases, 2 ranks over gloo, 40 iterations, a save every 10:

* ``baseline`` -- no fault, the workload started with ``ft_launcher -m``;
* ``kill`` -- pytest_nvrx/injector.py SIGKILLs rank 1 once the tracker advances;
* ``hang`` -- the injector SIGSTOPs rank 1 once the tracker advances; the ``step`` section
  timeout (10 s, checked every 1 s) must find it.

Each run lives in ``<work>/runs/reference-<case>/`` (the walkthrough's layout). The trimmed copy
written to ``--out`` keeps logs/, cycle_infos/, the marker, run.json, result.json and the
tracker, drops checkpoint shards and TMPDIR, turns symlinks into files naming their target and
rewrites absolute paths (see docs/reference-workload.md).

The launcher argv is written out by hand here on purpose (it mirrors pytest_nvrx.recipe); the
process tree is stopped with pytest_nvrx.launch.kill_tree after every run, and the script checks
that nothing of the run is left.

    .venv/bin/python scripts/record_reference_runs.py [--case kill] [--out tests/data/cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pytest_nvrx.launch import TAG_VAR, kill_tree, tagged  # noqa: E402
from pytest_nvrx.layout import RunLayout  # noqa: E402

WORKLOAD = "pytest_nvrx.workloads.reference"
INJECTOR = REPO / "pytest_nvrx" / "injector.py"
FT_LAUNCHER = REPO / ".venv" / "bin" / "ft_launcher"
# What absolute paths in the recorded files are rewritten to (like /work/shared/gpu-evidence).
RECORDED_RUNS_ROOT = "/shared/nvrx-ref/runs"
RECORDED_REPO = "/workspace/pytest-nvrx"

TRAIN_ITERS = 40
SAVE_INTERVAL = 10
SECTION_TIMEOUTS = "setup:120,step:10,checkpointing:60"
OUT_OF_SECTION_TIMEOUT = 60
WORKLOAD_CHECK_INTERVAL = 1
MAX_RESTARTS = 3
RUN_TIMEOUT_S = 420.0


@dataclass(frozen=True)
class Case:
    name: str
    fault: str  # none | kill | hang
    fault_rank: int = 1


CASES = {c.name: c for c in (Case("baseline", "none"), Case("kill", "kill"), Case("hang", "hang"))}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_argv(
    case: Case, layout: RunLayout, run_id: str, port: int
) -> tuple[list[str], list[str]]:
    launcher = [
        str(FT_LAUNCHER),
        "--nnodes=1",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost:0",
        f"--rdzv-id={run_id}",
        f"--max-restarts={MAX_RESTARTS}",
        f"--ft-rank-section-timeouts={SECTION_TIMEOUTS}",
        f"--ft-rank-out-of-section-timeout={OUT_OF_SECTION_TIMEOUT}",
        f"--ft-workload-check-interval={WORKLOAD_CHECK_INTERVAL}",
        f"--ft-checkpoint-iteration-file={layout.tracker}",
        f"--ft-cycle-info-dir={layout.cycle_infos}",
        f"--ft-per-cycle-applog-prefix={layout.applog_prefix}",
        f"--ft-nvrx-logfile={layout.launcher_log}",
        f"--ft-log-server-port={port}",
    ]
    ckpt = str(layout.checkpoint_dir)
    work = [
        f"--train-iters={TRAIN_ITERS}",
        f"--save-interval={SAVE_INTERVAL}",
        f"--save={ckpt}",
        f"--load={ckpt}",
        "--log-interval=1",
    ]
    if case.fault == "none":
        workload = ["-m", WORKLOAD, *work]  # ft_launcher runs it like python -m
    else:
        workload = [
            str(INJECTOR),
            f"--checkpoint-dir={ckpt}",
            f"--fault-marker={layout.marker}",
            f"--fault={case.fault}",
            f"--fault-rank={case.fault_rank}",
            "--module",
            WORKLOAD,
            "--",
            *work,
        ]
    return launcher, workload


def utc_now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat(timespec="milliseconds")


def run_case(case: Case, work: Path) -> dict[str, Any]:
    run_id = f"reference-{case.name}"
    layout = RunLayout.for_run(work / "runs" / run_id)
    if layout.run_dir.exists():
        shutil.rmtree(layout.run_dir)
    for d in (layout.logs, layout.cycle_infos, layout.checkpoint_dir, layout.tmp):
        d.mkdir(parents=True)
    port = free_port()
    launcher, workload = build_argv(case, layout, run_id, port)
    env_add = {"TMPDIR": str(layout.tmp), "NVRX_RUN_ID": run_id, "PYTHONUNBUFFERED": "1"}
    manifest = {
        "schema": 1,
        "tool": {"name": "pytest-nvrx", "script": "scripts/record_reference_runs.py"},
        "run_id": run_id,
        "config": {
            "workload": "reference",
            "fault": case.fault,
            "fault_rank": case.fault_rank if case.fault != "none" else None,
            "nnodes": 1,
            "nproc_per_node": 2,
            "train_iters": TRAIN_ITERS,
            "save_interval": SAVE_INTERVAL,
            "section_timeouts": SECTION_TIMEOUTS,
            "out_of_section_timeout": OUT_OF_SECTION_TIMEOUT,
            "workload_check_interval": WORKLOAD_CHECK_INTERVAL,
            "max_restarts": MAX_RESTARTS,
        },
        "launcher_argv": launcher,
        "workload_argv": workload,
        "command": " ".join(
            [f"{k}={shlex.quote(v)}" for k, v in sorted(env_add.items())]
            + [shlex.quote(a) for a in launcher + workload]
        ),
        "env": env_add,
        "log_server_port": port,
        "host": socket.gethostname(),
        "start_time": utc_now(),
    }
    layout.manifest.write_text(json.dumps(manifest, indent=2) + "\n")
    tag = uuid.uuid4().hex
    env = {**os.environ, **env_add, TAG_VAR: tag}
    console = layout.logs / "launcher.console.log"
    start_time = utc_now()
    t0 = time.monotonic()
    timed_out = False
    with console.open("wb") as out:
        proc = subprocess.Popen(
            launcher + workload,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(REPO),
            start_new_session=True,
        )
        try:
            proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            timed_out = True
        except KeyboardInterrupt:
            kill_tree(proc.pid, tag)
            raise
        finally:
            wall = time.monotonic() - t0
            # The launcher's workers and log server are in other sessions: stop all of them.
            kill_tree(proc.pid, tag, grace_s=5.0)
            proc.wait(timeout=10)
    left = tagged(tag)
    result = {
        "exit_code": None if timed_out else proc.returncode,
        "wall_s": round(wall, 3),
        "timed_out": timed_out,
        "interrupted": False,
        "start_time": start_time,
        "end_time": utc_now(),
    }
    (layout.run_dir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return {
        "case": case.name,
        "run_dir": str(layout.run_dir),
        "left_behind": sorted(left),
        **result,
    }


def trim_copy(run_dir: Path, dest: Path, case: str) -> None:
    """Copy what the parsers need, without shards or TMPDIR, with stable absolute paths."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    layout = RunLayout.for_run(run_dir)
    recorded_run = f"{RECORDED_RUNS_ROOT}/reference-{case}"
    keep: list[Path] = [layout.logs, layout.cycle_infos, layout.marker, layout.manifest]
    keep += [run_dir / "result.json", layout.tracker]
    for src in keep:
        if not src.exists() and not src.is_symlink():
            continue
        files = sorted(src.rglob("*")) if src.is_dir() else [src]
        for f in files:
            rel = f.relative_to(run_dir)
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if f.is_symlink():
                target.write_text(os.readlink(f))  # as in gpu-evidence: a file naming the target
            elif f.is_file():
                text = f.read_text(errors="replace")
                text = text.replace(str(run_dir), recorded_run).replace(str(REPO), RECORDED_REPO)
                target.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="repeatable")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "cpu")
    parser.add_argument("--work", type=Path, help="keep the full run dirs here (default: temp)")
    ns = parser.parse_args()
    names = ns.case or ["baseline", "kill", "hang"]
    work = ns.work or Path(tempfile.mkdtemp(prefix="nvrx-ref-"))
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    summary = []
    for name in names:
        print(f"== {name}: running (work dir {work})", flush=True)
        res = run_case(CASES[name], work.resolve())
        summary.append(res)
        print(json.dumps(res), flush=True)
        trim_copy(Path(res["run_dir"]), ns.out / f"reference-{name}", name)
    if ns.work is None:
        shutil.rmtree(work, ignore_errors=True)
    bad = [r for r in summary if r["exit_code"] != 0 or r["left_behind"]]
    for r in summary:
        print(f"{r['case']:>9}: exit {r['exit_code']} wall {r['wall_s']:.1f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
