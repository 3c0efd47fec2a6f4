"""Stand-in training script for the injector tests: advances a checkpoint tracker on demand.

Stdlib only; run by pytest_nvrx/worker/injector.py through runpy (``--script`` or ``--module``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def write_tracker(path: str, value: int, *, non_atomic: bool, gap: float) -> None:
    text = str(value)
    if not non_atomic:
        with open(path, "w") as f:
            f.write(text)
        return
    # Like a plain open/write, slowed down: readers see an empty file, then a prefix.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        time.sleep(gap)
        os.write(fd, text[:1].encode())
        time.sleep(gap)
        os.write(fd, text[1:].encode())
    finally:
        os.close(fd)


def hold(seconds: float, *, spin: bool) -> None:
    deadline = time.monotonic() + seconds
    if spin:  # hold the GIL like pure-Python training code would
        while time.monotonic() < deadline:
            pass
    else:
        time.sleep(seconds)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tracker", required=True)
    parser.add_argument("--started", help="write argv/sys.path here at start (JSON)")
    parser.add_argument("--finished", help="touch this at normal end")
    parser.add_argument("--values", default="", help="comma-separated iterations to write")
    parser.add_argument("--delay", type=float, default=0.0, help="sleep before the first write")
    parser.add_argument("--interval", type=float, default=0.1, help="sleep between writes")
    parser.add_argument("--hold", type=float, default=0.0, help="keep running after the writes")
    parser.add_argument("--spin", action="store_true", help="busy-wait instead of sleeping")
    parser.add_argument("--non-atomic", action="store_true")
    parser.add_argument("--gap", type=float, default=0.03, help="pause inside a non-atomic write")
    parser.add_argument("--plant-symlink", nargs=2, metavar=("LINK", "TARGET"))
    parser.add_argument("--wrote-at", help="append time.time() after each write (one per line)")
    parser.add_argument("--exit-code", type=int, default=None, help="end with sys.exit(CODE)")
    args = parser.parse_args()

    if args.started:
        with open(args.started, "w") as f:
            json.dump({"argv": sys.argv, "path0": sys.path[0], "name": __name__}, f)
    if args.plant_symlink:
        os.symlink(args.plant_symlink[1], args.plant_symlink[0])
    values = [int(v) for v in args.values.split(",") if v]
    time.sleep(args.delay)
    for i, value in enumerate(values):
        if i:
            time.sleep(args.interval)
        write_tracker(args.tracker, value, non_atomic=args.non_atomic, gap=args.gap)
        if args.wrote_at:
            with open(args.wrote_at, "a") as f:
                f.write(f"{time.time():.6f}\n")
    hold(args.hold, spin=args.spin)
    if args.finished:
        with open(args.finished, "w"):
            pass
    if args.exit_code is not None:
        sys.exit(args.exit_code)
    return 0


if __name__ == "__main__":
    main()
