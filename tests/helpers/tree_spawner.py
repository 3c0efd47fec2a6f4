"""A stand-in 'launcher' that misbehaves on demand: children in new sessions, orphans, hangs.

usage: tree_spawner.py MODE PIDFILE [RUN_DIR]
  MODE exit-orphans : start 2 children in their own sessions, write their PIDs, exit 0
  MODE hang         : start 2 children in their own sessions, write PIDs, sleep forever
  MODE progress     : write train_cycle0.log iteration lines into RUN_DIR/logs, then exit 0
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def spawn_children(pidfile: Path) -> None:
    pids = []
    for _ in range(2):
        child = subprocess.Popen(
            [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"],
            start_new_session=True,
        )
        pids.append(child.pid)
    pidfile.write_text(" ".join(map(str, pids)))


def main() -> int:
    mode, pidfile = sys.argv[1], Path(sys.argv[2])
    if mode == "exit-orphans":
        spawn_children(pidfile)
        return 0
    if mode == "hang":
        spawn_children(pidfile)
        while True:
            time.sleep(1)
    if mode == "progress":
        logs = Path(sys.argv[3]) / "logs"
        with (logs / "train_cycle0.log").open("w") as fh:
            for i in range(1, 4):
                fh.write(f"0:  [2026-11-29 12:00:0{i}] iteration {i:8d}/       3 |\n")
                fh.flush()
                time.sleep(0.3)
        pidfile.write_text("")
        return 0
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    sys.exit(main())
