"""The doctored-copy tests' copy of a committed run (tests/helpers/doctor.py ``copy_run``, which
reads each committed tree once per process) is what ``shutil.copytree`` made of it: the same
entries, bytes, modes (owner-writable) and links, on every committed run; and a copy's edits
never reach the committed original or the next copy."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from tests.helpers.doctor import CYCLE0, DATA, copy_run

RUNS = sorted({p.parent for p in DATA.rglob("logs") if p.is_dir()})


def _tree(root: Path) -> dict[str, tuple[str, int, bytes | str]]:
    out: dict[str, tuple[str, int, bytes | str]] = {}
    for path in root.rglob("*"):
        st = os.lstat(path)
        rel = str(path.relative_to(root))
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", 0, os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", stat.S_IMODE(st.st_mode), b"")
        else:
            out[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return out


def test_every_committed_run_copies_as_copytree_copies_it(tmp_path: Path) -> None:
    assert len(RUNS) > 100
    for n, run in enumerate(RUNS):
        ours = copy_run(run, tmp_path / f"{n}-ours").root
        theirs = tmp_path / f"{n}-theirs"
        shutil.copytree(run, theirs, symlinks=True)
        for p in [theirs, *theirs.rglob("*")]:
            if not p.is_symlink():
                p.chmod(p.stat().st_mode | stat.S_IWUSR)
        assert _tree(ours) == _tree(theirs), run
        assert stat.S_IMODE(os.lstat(ours).st_mode) == stat.S_IMODE(os.lstat(theirs).st_mode)


def test_an_edited_copy_leaves_the_original_and_the_next_copy_alone(tmp_path: Path) -> None:
    run = DATA / "windows" / "cpu" / "ref-kill-save"
    before = (run / CYCLE0).read_bytes()
    first = copy_run(run, tmp_path / "first")
    first.path(CYCLE0).write_text("edited\n")
    assert (run / CYCLE0).read_bytes() == before
    assert copy_run(run, tmp_path / "second").path(CYCLE0).read_bytes() == before
