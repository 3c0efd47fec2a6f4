"""An adapter's ``event_kind`` says what ``parse_line`` makes of a line without making it.

The cycle-log parser trusts it to count the saves it does not keep (building each costs a
timestamp and a reference); a kind that disagrees with ``parse_line`` would miscount them.
"""

from __future__ import annotations

from pathlib import Path

from pytest_nvrx.evidence.megatron import MEGATRON
from pytest_nvrx.evidence.refs import LineCursor, iter_lines, split_rank_prefix

DATA = Path(__file__).parents[1] / "data"

TRICKY = [
    "  [2026-11-29 11:00:00] successfully saved checkpoint from iteration      5 to /c [ t 1/1 ]",
    "successfully saved checkpoint from iteration x",  # no number: not a save, and not an error
    "  scheduled an async checkpoint save at iteration 10 to /c",
    " [x] iteration 3/ 9 | RuntimeError: an iteration line is never an error",
    " [2026-11-29 11:00:00] iteration 3/ 9 | lm loss: 1.0 |",
    "  save ........ /ckpt",
    "  not_a_setting ........ 3",
    "    save-checkpoint ......: (1.0, 2.0) checkpoint from /x at iteration 4",
    "  loading distributed checkpoint from /ckpt at iteration 5",
    "  successfully loaded checkpoint from /ckpt [ t 1/1 ] at iteration 5",
    "WARNING: could not load the checkpoint",
    "will start from random: no checkpoint",
    "Unable to load optimizer from checkpoint /c",
    "Unable to load rng state from checkpoint /c",
    "Unable to load something else",
    "torch.distributed.DistBackendError: NCCL",
    "[after training is done] datetime: 2026-11-29 11:09:00",
    "[something else] datetime: 2026-11-29 11:09:00 RuntimeError: x",
    "> Transformer Engine version ........ 0.0.0",
    "> Someone version ........ 1.0",
    "",
]


def test_event_kind_agrees_with_parse_line_on_every_committed_line() -> None:
    cursor = LineCursor("x.log")
    logs = sorted(DATA.rglob("*.log"))
    bodies = [split_rank_prefix(text)[1] for log in logs for _, text in iter_lines(log)]
    bodies += TRICKY
    kinds: dict[str, int] = {}
    for body in bodies:
        cursor.raw = body
        event = MEGATRON.parse_line(body, cursor)
        expected = None if event is None else type(event)
        assert MEGATRON.event_kind(body) is expected, body
        if expected is not None:
            kinds[expected.__name__] = kinds.get(expected.__name__, 0) + 1
    # the comparison covers every kind the adapter makes
    assert set(kinds) >= {
        "IterationCommitted",
        "SaveScheduled",
        "SaveCompleted",
        "LoadStarted",
        "LoadCompleted",
        "StartedFromScratch",
        "LoadFailed",
        "OptimizerLoadFailed",
        "RngLoadFailed",
        "WorkloadError",
        "Milestone",
        "VersionReported",
        "SettingReported",
    }, kinds
