"""What a committed run records, read back for tests: the RunConfig its run.json gives, and
how its judgement must read (every failing verdict led by the first cause)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pytest_nvrx.criteria import Judgement
from pytest_nvrx.settings import RunConfig, SectionTimeouts, parse_schedule

#: a work dir no test writes (the config is only checked, never launched)
WORK = Path("/nonexistent-work")


def assert_led_by_cause(judgement: Judgement) -> str:
    """Every failing verdict's reason starts with the cause and quotes its lines; returns it."""
    cause = judgement.first_cause
    assert cause is not None
    for verdict in judgement.verdicts:
        if verdict.passed:
            assert not verdict.reason.startswith(cause.text), verdict.render()
            continue
        assert verdict.reason.startswith(cause.text + "; "), verdict.render()
        assert cause.ref in verdict.evidence, verdict.render()
        # the criterion's own reason follows, its own line first in the evidence
        assert len(verdict.reason) > len(cause.text) + 2
    return cause.text


def recorded_config(run_dir: Path) -> RunConfig:
    """The RunConfig run.json records (what the refusal would have been given)."""
    recorded = json.loads((run_dir / "run.json").read_text())["config"]
    names = {f.name for f in dataclasses.fields(RunConfig)} - {"work_dir", "run_id"}
    values = {k: v for k, v in recorded.items() if k in names}
    values["section_timeouts"] = SectionTimeouts.parse(recorded["section_timeouts"])
    values["extra_args"] = tuple(recorded.get("extra_args") or ())
    values["schedule"] = (
        parse_schedule(",".join(recorded["schedule"]), "s") if recorded.get("schedule") else ()
    )
    for path in ("megatron_path", "checkpoint_dir", "seed_checkpoint"):
        values[path] = Path(values[path]) if values.get(path) else None
    return RunConfig(work_dir=WORK, run_id="r", **values)
