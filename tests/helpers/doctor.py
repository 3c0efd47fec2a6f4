"""Doctor copies of real run directories: each edit turns a passing run into a specific failure.

Every edit asserts that what it looks for is there, so a doctored test cannot silently test an
unchanged run.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import stat
from pathlib import Path
from typing import Any

DATA = Path(__file__).parents[1] / "data"
GPU_DATA = DATA / "gpu"
KILL_RUN = GPU_DATA / "gpu-kill-100"
BASELINE_RUN = GPU_DATA / "gpu-baseline-20"

LAUNCHER = "logs/launcher.log"
CYCLE0 = "logs/train_cycle0.log"
CYCLE1 = "logs/train_cycle1.log"
MARKER = "fault_injected.json"


class Doctor:
    """Edits files of a run directory copy by line, by text or by JSON key."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, rel: str) -> Path:
        return self.root / rel

    def lines(self, rel: str) -> list[str]:
        return self.path(rel).read_text(encoding="utf-8").splitlines(keepends=True)

    def write_lines(self, rel: str, lines: list[str]) -> None:
        self.path(rel).write_text("".join(lines), encoding="utf-8")

    def line_no(self, rel: str, needle: str, nth: int = 0) -> int:
        """1-based number of the ``nth`` line containing ``needle``."""
        hits = [i for i, line in enumerate(self.lines(rel), start=1) if needle in line]
        assert len(hits) > nth, f"{rel}: {needle!r} occurs {len(hits)} times"
        return hits[nth]

    def replace(self, rel: str, old: str, new: str, count: int = -1) -> None:
        text = self.path(rel).read_text(encoding="utf-8")
        assert old in text, f"{rel}: {old!r} not found"
        self.path(rel).write_text(text.replace(old, new, count), encoding="utf-8")

    def delete(self, rel: str, needle: str) -> list[str]:
        lines = self.lines(rel)
        kept = [line for line in lines if needle not in line]
        assert len(kept) < len(lines), f"{rel}: no line contains {needle!r}"
        self.write_lines(rel, kept)
        return [line for line in lines if needle in line]

    def insert_after(self, rel: str, needle: str, *new: str, nth: int = 0) -> int:
        """Insert lines after the ``nth`` line containing ``needle``; returns the first's number."""
        at = self.line_no(rel, needle, nth)
        lines = self.lines(rel)
        lines[at:at] = [line if line.endswith("\n") else line + "\n" for line in new]
        self.write_lines(rel, lines)
        return at + 1

    def insert_before(self, rel: str, needle: str, *new: str) -> int:
        at = self.line_no(rel, needle) - 1
        lines = self.lines(rel)
        lines[at:at] = [line if line.endswith("\n") else line + "\n" for line in new]
        self.write_lines(rel, lines)
        return at + 1

    def truncate_after(self, rel: str, needle: str) -> None:
        """Keep the file up to and including the first line containing ``needle``."""
        at = self.line_no(rel, needle)
        self.write_lines(rel, self.lines(rel)[:at])

    def append(self, rel: str, *new: str) -> int:
        lines = self.lines(rel) if self.path(rel).exists() else []
        first = len(lines) + 1
        lines += [line if line.endswith("\n") else line + "\n" for line in new]
        self.write_lines(rel, lines)
        return first

    def json(self, rel: str) -> dict[str, Any]:
        data = json.loads(self.path(rel).read_text(encoding="utf-8"))
        assert isinstance(data, dict)
        return data

    def set_json(self, rel: str, **changes: Any) -> None:
        data = self.json(rel) if self.path(rel).exists() else {}
        data.update(changes)
        self.path(rel).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")

    def remove(self, rel: str) -> None:
        target = self.path(rel)
        assert target.exists() or target.is_symlink(), f"{rel} does not exist"
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()


def set_injector_option(doc: Doctor, option: str, value: object) -> None:
    """Make run.json's injector arguments (``workload_argv``) and its ``command`` pass
    ``option=value``, as the harness spells them from ``config``: a test that changes what the
    run was asked to do (config's window, fault, fault rank) changes both, or run.json
    contradicts itself (evidence/manifest_contradictions.py) before anything the test is about
    is judged."""
    data = doc.json("run.json")
    argv = list(data["workload_argv"])
    new = f"{option}={value}"
    old = next((a for a in argv if a.startswith(f"{option}=")), None)
    command = data["command"]
    if old is not None:
        argv[argv.index(old)] = new
        command = command.replace(f" {shlex.quote(old)}", f" {shlex.quote(new)}", 1)
    else:
        at = "--module" if "--module" in argv else "--"
        argv.insert(argv.index(at), new)
        command = command.replace(f" {at} ", f" {shlex.quote(new)} {at} ", 1)
    doc.set_json("run.json", workload_argv=argv, command=command)


def copy_run(src: Path, dest: Path) -> Doctor:
    """A writable copy of a run directory (the shared originals are read-only): its files,
    folders and links (as links), each writable by its owner. A committed run's tree is read
    once per test process (the sweeps copy each one hundreds of times; it never changes)."""
    if not Path(os.path.abspath(src)).is_relative_to(DATA):
        shutil.copytree(src, dest, symlinks=True)
        for p in [dest, *dest.rglob("*")]:
            if not p.is_symlink():
                p.chmod(p.stat().st_mode | stat.S_IWUSR)
        return Doctor(dest)
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)  # as copytree does
    os.mkdir(dest, stat.S_IMODE(os.lstat(src).st_mode) | stat.S_IWUSR)
    for rel, kind, mode, content in _committed_tree(Path(os.path.abspath(src))):
        target = os.path.join(dest, rel)
        if kind == "dir":
            os.mkdir(target, mode)
        elif kind == "link":
            os.symlink(content, target)
        else:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            try:
                os.write(fd, content)  # type: ignore[arg-type]
            finally:
                os.close(fd)
    for rel, kind, mode, _ in _committed_tree(Path(os.path.abspath(src))):
        if kind != "link":  # as copytree leaves them: the mode, whatever the umask took
            os.chmod(os.path.join(dest, rel), mode)
    return Doctor(dest)


@functools.cache
def _committed_tree(src: Path) -> tuple[tuple[str, str, int, bytes | str], ...]:
    """Every entry below a committed run dir, parents first: (path relative to it, "dir",
    "link" or "file", its mode made owner-writable, a file's bytes or a link's target)."""
    out: list[tuple[str, str, int, bytes | str]] = []
    for root, dirs, files in os.walk(src):
        for name in sorted(dirs) + sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src)
            st = os.lstat(path)
            mode = stat.S_IMODE(st.st_mode) | stat.S_IWUSR
            if stat.S_ISLNK(st.st_mode):
                out.append((rel, "link", mode, os.readlink(path)))
            elif stat.S_ISDIR(st.st_mode):
                out.append((rel, "dir", mode, b""))
            else:
                with open(path, "rb") as f:
                    out.append((rel, "file", mode, f.read()))
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
    return tuple(out)


# Lines in the launcher's own formats, for inserting into doctored launcher logs.
def nvrx_line(time: str, message: str, level: str = "INFO", local: str = "?") -> str:
    return (
        f"2026-11-29 {time} [{level}] [vm] [workload:?({local}) infra:?(?)] launcher.py:1 {message}"
    )


def profiling_line(time: str, cycle: int, event: str, rank: str = "0") -> str:
    return nvrx_line(
        time,
        f"  - Cycle: {cycle} Event: {event} Node: localhost_547_0 Rank: {rank}"
        f" Time: 2026-11-29 {time.replace(',', '.')} UTC",
    )


def glog_failed(time: str, local_rank: int, pid: int, code: int = -9) -> str:
    return (
        f"E1129 {time} 547 torch/distributed/elastic/multiprocessing/api.py:986] failed "
        f"(exitcode: {code}) local_rank: {local_rank} (pid: {pid}) of binary: /usr/bin/python3"
    )


#: A result.json as our harness writes one at the end of a launch that exited 0, for a doctored
#: run given a run.json: a run our harness launched has both (#36 item 5). Every key it always
#: writes, with a value (null times are no record of theirs: #36 adversarial J): a launch
#: around the hand-made runs of tests/data/gpu (their logs lie between these times).
HARNESS_RESULT: dict[str, Any] = {
    "exit_code": 0,
    "wall_s": 7200.0,
    "timed_out": False,
    "interrupted": None,
    "start_time": "2026-11-29T10:00:00+00:00",
    "end_time": "2026-11-29T12:00:00+00:00",
}


def on_two_hosts(doc: Doctor, launcher_pid: int, host: str = "another-host") -> None:
    """Move the faulted rank's node to another host: its marker's ``host`` and the host NVRx
    prints on the profiling lines of that node's launcher (``Node: <name>_<launcher_pid>_0``)."""
    old = doc.json(MARKER)["host"]
    doc.set_json(MARKER, host=host)
    lines = [
        line.replace(f"] [{old}] [", f"] [{host}] [", 1) if f"_{launcher_pid}_0 " in line else line
        for line in doc.lines(LAUNCHER)
    ]
    assert lines != doc.lines(LAUNCHER), launcher_pid
    doc.write_lines(LAUNCHER, lines)
