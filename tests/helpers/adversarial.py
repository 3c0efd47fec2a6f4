"""The adversarial reviews' harness (tests/criteria/test_adversarial_review_36*.py): an edit of a
doctored copy, verify of a run dir, and the copies that still pass after their edit."""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Callable
from pathlib import Path

from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import Doctor, copy_run

DATA = Path(__file__).parents[1] / "data"

#: one edit of a doctored copy
Edit = Callable[[Doctor], object]


def verify_run(run_dir: Path) -> tuple[int, str]:
    """``verify RUN_DIR``: its exit code and everything it printed."""
    out, err = io.StringIO(), io.StringIO()
    code = verify_main([str(run_dir)], out, err)
    return code, out.getvalue() + err.getvalue()


@functools.cache
def committed_verdict(src: Path) -> tuple[int, str]:
    """verify of a committed run (once: the originals never change)."""
    return verify_run(src)


def committed_schedule_runs() -> list[Path]:
    """Every committed run dir whose run.json runs a fault schedule (the same 20 with 2 faults or
    more), in path order."""
    runs = []
    for manifest in sorted(p for p in DATA.rglob("run.json") if p.is_file() and not p.is_symlink()):
        config = json.loads(manifest.read_text(encoding="utf-8")).get("config") or {}
        if config.get("schedule") and (manifest.parent / "logs").is_dir():
            runs.append(manifest.parent)
    return runs


def still_passing(tmp_path: Path, cases: list[tuple[Path, str, Edit]]) -> list[str]:
    """Each committed run verified as committed (it must pass: else the case tests nothing),
    then a doctored copy of it: the ``what`` of every copy that still exits 0."""
    passed: list[str] = []
    for i, (src, what, edit) in enumerate(cases):
        code, text = committed_verdict(src)
        assert code == 0, f"{src.relative_to(DATA)} no longer passes as committed:\n{text}"
        doc = copy_run(src, tmp_path / f"{i}-{src.name}")
        edit(doc)
        code, text = verify_run(doc.root)
        if code == 0:
            passed.append(f"{src.relative_to(DATA)}: {what}")
    return passed
