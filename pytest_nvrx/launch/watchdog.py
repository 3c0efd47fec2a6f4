"""A run's watchdog: it stops the run when the harness that launched it dies.

:class:`~pytest_nvrx.launch.launcher.Launch` starts this process before the launcher, in a session
of its own, holding the read end of a pipe whose only write end the harness (``run``, a pytest
session or xdist worker) keeps. The kernel closes that end however the harness ends, SIGKILL
and the OOM killer included. When the harness says ``done`` first (it stopped the tree and
wrote result.json itself) the watchdog exits at once. When the pipe reaches its end without
``done``, the harness is gone and nobody watches the run any more: the watchdog stops every
process of the run (:func:`~pytest_nvrx.launch.process_tree.kill_tree`: below the launcher and by
the run's tag, workers reparented to init included), writes result.json naming it
(``"interrupted": "harness killed"``) unless the harness wrote one, removes the launch's
TMPDIR and releases the checkpoint-dir claim the harness held (pytest_nvrx.launch.checkpoint_claim).
Messages go to the run's console log. No pytest.

    python -m pytest_nvrx.launch.watchdog --fd N --tag TAG --result PATH --tmpdir DIR \\
        --start-time ISO [--checkpoint-dir D --harness-pid PID]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from pytest_nvrx.launch.process_tree import kill_tree
from pytest_nvrx.outputs import write_atomic

#: what the harness writes when it no longer needs the watchdog
DONE = b"done\n"
#: what result.json says of a run whose harness died
HARNESS_KILLED = "harness killed"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _say(message: str) -> None:
    with contextlib.suppress(OSError):
        sys.stderr.write(f"[pytest-nvrx watchdog] pid {os.getpid()}: {message}\n")
        sys.stderr.flush()


def _wait_for_harness(fd: int) -> tuple[bytes, int | None]:
    """Read the pipe to its end: what the harness said, and the launcher PID it announced."""
    said = b""
    launcher: int | None = None
    while True:
        try:
            chunk = os.read(fd, 4096)
        except InterruptedError:
            continue
        if not chunk:
            return said, launcher
        said += chunk
        for line in said.splitlines():
            if line.startswith(b"pid ") and line[4:].strip().isdigit():
                launcher = int(line[4:].strip())


def _write_result(path: Path, start_time: str, launcher: int | None, t0: float) -> bool:
    """result.json naming the harness's death, unless the harness wrote one; True if written."""
    if path.exists():
        return False
    record = {
        "exit_code": None,
        "launcher_pid": launcher,
        "wall_s": round(time.time() - t0, 3),
        "timed_out": False,
        "interrupted": HARNESS_KILLED,
        "start_time": start_time,
        "end_time": _now(),
    }
    try:
        # the harness's own writer: atomic, and on a full disk it spends the reserved space
        write_atomic(path, json.dumps(record, indent=2) + "\n")
    except OSError as exc:
        _say(f"cannot write {path}: {exc}")
        return False
    return True


def _release_claims(checkpoint_dir: Path | None, harness: int | None) -> list[Path]:
    """The checkpoint-dir claims the dead harness held (pytest_nvrx.launch.checkpoint_claim): theirs
    only, never another run's."""
    if checkpoint_dir is None or harness is None:
        return []
    from pytest_nvrx.launch.checkpoint_claim import is_claim_name, read_holder

    released = []
    try:
        names = [n for n in os.listdir(checkpoint_dir) if is_claim_name(n)]
    except OSError:
        return []
    for name in names:
        path = checkpoint_dir / name
        holder = read_holder(path)
        if holder.record and holder.pid == harness:
            with contextlib.suppress(OSError):
                path.unlink()
                released.append(path)
    return released


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_nvrx.launch.watchdog")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--tmpdir", type=Path, required=True)
    parser.add_argument("--start-time", required=True)
    parser.add_argument("--started-at", type=float, default=None, help="time.time() at start")
    parser.add_argument("--checkpoint-dir", type=Path, default=None)
    parser.add_argument("--harness-pid", type=int, default=None)
    args = parser.parse_args(argv)
    t0 = args.started_at if args.started_at is not None else time.time()
    said, launcher = _wait_for_harness(args.fd)
    if DONE in said:
        return 0
    _say("the harness that launched this run is gone: stopping the run")
    stopped = kill_tree(launcher, args.tag, grace_s=3.0)
    wrote = _write_result(args.result, args.start_time, launcher, t0)
    released = _release_claims(args.checkpoint_dir, args.harness_pid)
    shutil.rmtree(args.tmpdir, ignore_errors=True)  # last: the sign that the watchdog is done
    _say(
        f"stopped {len(stopped)} process(es)"
        + (f", wrote {args.result.name} ({HARNESS_KILLED})" if wrote else "")
        + f", removed {args.tmpdir}"
        + "".join(f", released {path.name}" for path in released)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
