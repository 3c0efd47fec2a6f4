"""A run's claims, taken and given back as one: its run directory's (``run.claim``,
:mod:`~pytest_nvrx.launch.run_dir_setup`) and its checkpoint directory's (``checkpoint.claim``,
:mod:`~pytest_nvrx.launch.checkpoint_claim`).

:func:`check` says, read-only, what :func:`claim` would refuse: a dry run stops there, a real
one asks it before anything is built or written. :func:`claim` takes the run dir (and makes its
artifact directories), then the checkpoint dir. :func:`give_back` undoes both for a launch that
never started, so nothing blocks the run ID; :func:`release` frees the checkpoint dir once the
launch's tree is stopped (the run dir stays claimed: one run dir holds one run).
"""

from __future__ import annotations

from pytest_nvrx.launch.checkpoint_claim import (
    check_checkpoint_dir,
    claim_checkpoint_dir,
    release_dir,
)
from pytest_nvrx.launch.run_dir_setup import (
    check_fresh_run_dir,
    check_unclaimed_run_dir,
    give_back_run_dir,
    prepare_run_dir,
)
from pytest_nvrx.layout import RunLayout
from pytest_nvrx.settings import RunConfig


def check(config: RunConfig) -> None:
    """ConfigError where :func:`claim` would refuse the run: another run holds its checkpoint
    dir, its run dir was used before (a run of one node: on several nodes the first may have
    written there already) or is claimed. Writes nothing."""
    layout = config.layout
    check_checkpoint_dir(layout.checkpoint_dir, run_id=config.run_id, run_dir=layout.run_dir)
    if config.nnodes == 1:
        check_fresh_run_dir(layout)
    check_unclaimed_run_dir(layout, nnodes=config.nnodes, node_index=config.node_index)


def claim(config: RunConfig) -> RunLayout:
    """Claim the run dir (then make its artifact directories), then the checkpoint dir; each
    claim atomic (``O_EXCL``). A claim lost to a race or anything else raised on the way gives
    the run dir back: nothing ran, the run ID may be tried again."""
    layout = prepare_run_dir(config)
    try:
        claim_checkpoint_dir(
            layout.checkpoint_dir,
            run_id=config.run_id,
            run_dir=layout.run_dir,
            nnodes=config.nnodes,
            node_index=config.node_index,
        )
    except BaseException:
        give_back_run_dir(layout, nnodes=config.nnodes, node_index=config.node_index)
        raise
    return layout


def give_back(config: RunConfig) -> None:
    """Both claims of a launch that never started (its plan failed after :func:`claim`)."""
    release_dir(config.layout.checkpoint_dir)
    give_back_run_dir(config.layout, nnodes=config.nnodes, node_index=config.node_index)


def release(layout: RunLayout) -> None:
    """The launch's tree is stopped: its checkpoint dir is free for the next run (a no-op
    where this process holds no claim of it)."""
    release_dir(layout.checkpoint_dir)
