"""The checkpoint directory's name is written by one function and read back by its inverse: a
name that is not Megatron's ``iter_%07d`` is no checkpoint of ours."""

from __future__ import annotations

import pytest

from pytest_nvrx.layout import iteration_dir_name, iteration_of_dir_name


@pytest.mark.parametrize("iteration", [0, 5, 9_999_999, 12_345_678])
def test_the_name_reads_back_as_its_iteration(iteration: int) -> None:
    assert iteration_of_dir_name(iteration_dir_name(iteration)) == iteration


@pytest.mark.parametrize(
    "name",
    [
        "iter_5",
        "iter_00000005",
        "iter_+000005",
        "iter_-000005",
        "iter_0000005.tmp",
        "iter_",
        "iter_\u00b2\u00b2\u00b2\u00b2\u00b2\u00b2\u00b2",
        "iter_000_005",
        "0000005",
        "ITER_0000005",
    ],
)
def test_other_names_are_no_checkpoint(name: str) -> None:
    assert iteration_of_dir_name(name) is None
