"""The sweeps' memo of pure parsers (tests/helpers/parse_once.py) gives what the real parsers give:
on every committed run, unchanged (served from the memo) and with a file edited, made a link or
a FIFO (parsed again, or refused, by the product)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

import pytest_nvrx.evidence.rundir as rundir
from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.evidence.rundir import load_run
from pytest_nvrx.verify import verify_main
from tests.helpers import parse_once
from tests.helpers.doctor import CYCLE0, copy_run
from tests.helpers.parse_once import parsing_once

DATA = Path(__file__).parents[1] / "data"
RUNS = sorted(p.parent for p in DATA.rglob("logs") if (p / "launcher.log").is_file())
REF = DATA / "windows" / "cpu" / "ref-kill-save"


def _verify(root: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = verify_main([str(root)], stdout=out, stderr=err)
    return code, out.getvalue() + err.getvalue()


def test_every_committed_run_reads_the_same_from_the_memo() -> None:
    fresh = {run: load_run(run) for run in RUNS}
    with parsing_once():
        for _ in range(2):  # committed files are kept at once: the second read is the memo's
            for run in RUNS:
                assert load_run(run) == fresh[run], run
    assert vars(rundir)["parse_cycle_log"] is parse_once.REAL_CYCLE_LOG  # the real one is back


def test_the_memo_serves_unchanged_files_and_parses_edited_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    real = parse_once.REAL_CYCLE_LOG

    def counted(path: Path, *args: object, **kwargs: object) -> object:
        calls.append(path)
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(parse_once, "REAL_CYCLE_LOG", counted)
    copies = [copy_run(REF, tmp_path / str(n)) for n in range(3)]
    with parsing_once():
        for doc in copies[:2]:
            load_run(doc.root)
        calls.clear()
        expected = _verify(copies[2].root)
        assert calls == []  # every cycle log of an unchanged copy came from the memo
        copies[2].replace(CYCLE0, "iteration 3/", "iteration 4/", count=1)
        edited = _verify(copies[2].root)
        assert calls == [copies[2].path(CYCLE0)]  # the edited log alone was parsed again
    assert edited != expected
    assert _verify(copies[2].root) == edited  # the same outcome without the memo


@pytest.mark.parametrize("shape", ["symlink", "fifo"])
def test_a_log_that_is_no_regular_file_is_left_to_the_product(shape: str, tmp_path: Path) -> None:
    doc = copy_run(REF, tmp_path / "run")
    log = doc.path(CYCLE0)
    if shape == "symlink":
        log.rename(tmp_path / "elsewhere.log")
        log.symlink_to(tmp_path / "elsewhere.log")
    else:
        log.unlink()
        os.mkfifo(log)
    fresh = judge_run_dir(doc.root)
    with parsing_once():
        judge_run_dir(copy_run(REF, tmp_path / "warm").root)
        assert judge_run_dir(doc.root) == fresh
    assert not fresh.judgeable
