"""Run dirs of passed scenarios are removed, unless --nvrx-keep; failed ones are always kept.

A short real reference baseline through the real ft_launcher (the retention decision needs a
scenario that actually passed).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

SHORT = ["--nvrx-train-iters", "6", "--nvrx-save-interval", "3"]


def run_baseline(pytester: pytest.Pytester, basetemp: Path, *extra: str) -> list[Path]:
    result = pytester.runpytest_subprocess(
        "--pyargs", "pytest_nvrx.suite", "-p", "no:cacheprovider", "-k", "reference-baseline",
        f"--basetemp={basetemp}", *SHORT, *extra,
    )  # fmt: skip
    result.assert_outcomes(passed=3, skipped=4)
    return list(basetemp.glob("nvrx-reference-baseline[0-9]*/runs/*"))


@pytest.mark.timeout(400)
def test_passed_run_dir_is_removed_unless_kept(pytester: pytest.Pytester, tmp_path: Path) -> None:
    assert run_baseline(pytester, tmp_path / "a") == []
    assert list((tmp_path / "a").glob("nvrx-reference-baseline[0-9]*")) == []
    kept = run_baseline(pytester, tmp_path / "b", "--nvrx-keep")
    assert len(kept) == 1 and (kept[0] / "run.json").is_file()
    assert (kept[0] / "logs" / "train_cycle0.log").is_file()
