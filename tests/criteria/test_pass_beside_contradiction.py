"""A PASS beside a contradiction (issue #36 cases 6-13): doctored copies of every committed real
run of each kind, each edit contradicting the rest of the evidence; before, each of them passed.

Now every one is FAILED or "cannot judge" (exit 1 or 2, never 0), and no output prints a first
cause beside PASSED. The originals are never edited: each test doctors its own copy in tmp_path.
"""

from __future__ import annotations

import functools
import io
import json
import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.criteria import Judgement, judge_run_dir
from pytest_nvrx.evidence.launcher_log import FAILURE_KINDS, LauncherEvent
from pytest_nvrx.evidence.marker import Marker
from pytest_nvrx.evidence.rundir import RunEvidence, load_run
from pytest_nvrx.evidence.workload import LoadCompleted, Milestone
from pytest_nvrx.report import report_main
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import CYCLE0, LAUNCHER, MARKER, Doctor, copy_run
from tests.helpers.parse_once import parsing_once

DATA = Path(__file__).parents[1] / "data"
#: every committed run directory (a logs/ folder of its own)
RUNS = sorted(p.parent for p in DATA.rglob("logs") if (p / "launcher.log").is_file())
FAULT_RUNS = [d for d in RUNS if (d / MARKER).is_file()]


def _id(run: Path) -> str:
    return str(run.relative_to(DATA))


@pytest.fixture(autouse=True, scope="module")
def _parse_once() -> Iterator[None]:
    """Each copy's unchanged files are parsed once (tests/helpers/parse_once.py)."""
    with parsing_once():
        yield


@functools.cache
def _evidence(run: Path) -> RunEvidence:
    """A committed run's evidence, without checkpoints (read once: the originals never change);
    what the edits below are planned from."""
    with parsing_once():  # at collection too: the copies' unchanged files are these
        return load_run(run, read_checkpoints=False)


def verify(root: Path, *args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    status = verify_main([str(root), *args], stdout=out, stderr=err)
    return status, out.getvalue() + err.getvalue()


@functools.cache
def _passes(run: Path) -> bool:
    """Whether the committed run itself passes (judged once per session)."""
    return verify(run)[0] == 0


def never_passes(root: Path, *args: str) -> tuple[int, str]:
    """verify says FAILED (1) or cannot judge (2), and never a first cause beside PASSED."""
    status, text = verify(root, *args)
    assert status in (1, 2), text
    summary = [line for line in text.splitlines() if line.startswith("verify: ")]
    assert not any("PASSED" in line for line in summary if "first cause" in text), text
    return status, text


def _copy(run: Path, tmp_path: Path) -> Doctor:
    return copy_run(run, tmp_path / run.name)


# ---------------------------------------------------------------------------------------------
# 6. a failure record stamped before the fault but written out of time order; a first cause
#    beside PASSED


_NVRX_STAMP = re.compile(r"^(?P<pre>(?:\d+: )?)\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+")
_GLOG_STAMP = re.compile(r"^(?P<pre>(?:\d+: )?[IWEF])\d{4} \d\d:\d\d:\d\d\.\d+")
_PROFILING_UTC = re.compile(r"Time: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ UTC")


def _restamp(line: str, local: datetime, utc: datetime) -> str:
    """``line`` stamped ``local`` (the launcher's zone), its profiling ``Time:`` ``utc``."""
    if _GLOG_STAMP.match(line):
        new = _GLOG_STAMP.sub(lambda m: m["pre"] + local.strftime("%m%d %H:%M:%S.%f"), line)
    else:
        assert _NVRX_STAMP.match(line), line
        stamp = local.strftime("%Y-%m-%d %H:%M:%S,") + f"{local.microsecond // 1000:03d}"
        new = _NVRX_STAMP.sub(lambda m: m["pre"] + stamp, line)
    return _PROFILING_UTC.sub(
        "Time: " + utc.strftime("%Y-%m-%d %H:%M:%S.") + f"{utc.microsecond // 1000:03d} UTC", new
    )


def _failures_after_the_fault(run: Path) -> tuple[list[LauncherEvent], datetime, timedelta]:
    """The launcher's failure records at or after the marker's time (each one the fault's
    detection), the marker's time and the launcher's zone, in the committed run ``run``."""
    evidence = _evidence(run)
    marker = evidence.marker
    assert marker is not None and marker.ok and marker.time is not None
    zone = evidence.launcher.utc_offset or timedelta(0)
    after = [
        e
        for e in evidence.launcher.events
        if (e.kind in FAILURE_KINDS or e.is_failure_detected)
        and e.time is not None
        and e.time >= marker.time
    ]
    assert after, "no failure record after the fault"
    return after, marker.time, zone


def _early_failure(original: Path, run: Doctor, nth: int, *, in_order: bool) -> tuple[int, bool]:
    """Restamp the launcher's ``nth`` failure record after the fault 10 s before the fault in
    ``run``, an unedited copy of ``original``; with ``in_order`` also move it up among the lines
    of that time. Returns its new line number and whether a record above it is stamped more
    than a second later (out of time order)."""
    events, fault, zone = _failures_after_the_fault(original)
    event = events[nth]
    assert event.ref.line is not None
    when = fault - timedelta(seconds=10)
    evidence = _evidence(original)
    lines = run.lines(LAUNCHER)
    at = event.ref.line - 1
    line = _restamp(lines[at], (when + zone).replace(tzinfo=None), when)
    assert line != lines[at]
    del lines[at]
    if in_order:
        before = [
            e.ref.line
            for e in evidence.launcher.events
            if e.time is not None and e.time <= when and e.ref.line is not None
        ]
        at = max(before, default=0)
    above = [
        e.time
        for e in evidence.launcher.events
        if e.time is not None and e.ref.line is not None and e.ref.line <= at
    ]
    lines.insert(at, line)
    run.write_lines(LAUNCHER, lines)
    return at + 1, any(t > when + timedelta(seconds=1) for t in above)


def _each_failure_record(run: Path, tmp_path: Path) -> list[tuple[int, Doctor]]:
    records, _, _ = _failures_after_the_fault(run)
    return [(n, _copy(run, tmp_path / str(n))) for n in range(len(records))]


@pytest.mark.parametrize("run", FAULT_RUNS, ids=_id)
def test_a_failure_record_stamped_before_the_fault_out_of_order_cannot_be_judged(
    run: Path, tmp_path: Path
) -> None:
    # each of the launcher's records of the fault's detection, one at a time; on one node every
    # line is one writer's (on several, a line that names no launcher has no order to break)
    manifest = _evidence(run).manifest
    nodes = manifest.nnodes.value if manifest is not None and manifest.nnodes is not None else 1
    for n, doctored in _each_failure_record(run, tmp_path):
        line, out_of_order = _early_failure(run, doctored, n, in_order=False)
        status, text = never_passes(doctored.root)
        if out_of_order and nodes == 1:
            assert status == 2, text
            assert f"{LAUNCHER}:{line} is stamped" in text and "went back in time" in text, text


@pytest.mark.parametrize("run", FAULT_RUNS, ids=_id)
def test_a_failure_record_moved_before_the_fault_never_passes(run: Path, tmp_path: Path) -> None:
    # the same records moved up among the lines of their new time: in order, so only the
    # verdict itself can object: a first cause never stands beside PASSED
    for n, doctored in _each_failure_record(run, tmp_path):
        _early_failure(run, doctored, n, in_order=True)
        never_passes(doctored.root)


def test_a_first_cause_beside_every_criterion_holding_cannot_be_judged(tmp_path: Path) -> None:
    # the example: the record moved in time but not in the file
    run = _copy(DATA / "windows" / "gpu" / "g2-exception-step", tmp_path)
    run.replace(LAUNCHER, "E1130 16:25:58.229000", "E1130 16:25:17.758813")
    status, text = verify(run.root)
    assert status == 2, text
    assert "PASSED" not in text
    j: Judgement = judge_run_dir(run.root)
    assert not j.judgeable and not j.passed


# ---------------------------------------------------------------------------------------------
# 12. a baseline with a later cycle's log and no record of that cycle


def _is_baseline(run: Path) -> bool:
    manifest = _evidence(run).manifest
    return manifest is not None and manifest.fault is not None and manifest.fault.value == "none"


BASELINES = [d for d in RUNS if (d / "run.json").is_file() and _is_baseline(d)]


@pytest.mark.parametrize("run", BASELINES, ids=_id)
@pytest.mark.parametrize(
    ("name", "keep"), [("train_cycle1.log", None), ("train_cycle1.log", 1), ("train_cycle3.log", 5)]
)
def test_a_baseline_with_an_unrecorded_later_cycle_log_fails(
    run: Path, name: str, keep: int | None, tmp_path: Path
) -> None:
    doctored = _copy(run, tmp_path)
    lines = doctored.lines(CYCLE0)
    doctored.write_lines(f"logs/{name}", lines[:keep] if keep is not None else lines)
    _, text = never_passes(doctored.root)
    assert "finished successfully in one cycle" not in text, text
    assert f"logs/{name} shows cycle" in text, text


# ---------------------------------------------------------------------------------------------
# 7. a second marker in a run of one fault; a name no injector spells


def _faults(run: Path) -> int:
    manifest = _evidence(run).manifest
    return len(manifest.scheduled_faults) if manifest is not None else 0


@pytest.mark.parametrize("run", RUNS, ids=_id)
def test_a_marker_the_run_did_not_ask_for_never_passes(run: Path, tmp_path: Path) -> None:
    faults = _faults(run)
    own = run / MARKER if (run / MARKER).is_file() else DATA / "windows/cpu/ref-kill-save" / MARKER
    names = ["fault_injected_02.json", "fault_injected_" + "7" * 200 + ".json"]
    names.append(f"fault_injected_{max(faults, 1) + 1}.json")
    for name in names:
        doctored = _copy(run, tmp_path / name[:30])
        doctored.path(name).write_bytes(own.read_bytes())
        status, text = never_passes(doctored.root)
        if not faults or name == "fault_injected_02.json":
            # a run of one fault writes one marker; no schedule's injector spells a leading 0
            assert status == 2, text
            assert "named like a marker, but the run asked for" in text, text
        else:
            assert "was injected beyond the schedule's" in text, text


# ---------------------------------------------------------------------------------------------
# 11. a planted run is never a qualification, and any of its labels makes it planted

SELFTEST = sorted(p.parent for p in (DATA / "gpu-selftest").rglob("run.json"))
PLANTED = [d for d in SELFTEST if d.name != "control"]
CONTROLS = [d for d in SELFTEST if d.name == "control"]
#: a tolerance every committed planted run's replay differences stay within: the criteria pass
#: those whose plant only training_continuity catches (checked below, else nothing is proven)
LOOSE = "0.9"


def _report(tmp_path: Path, *runs: Path, rtol: str = LOOSE) -> tuple[int, str, dict[str, Any]]:
    out, err = io.StringIO(), io.StringIO()
    html = tmp_path / "out" / "report.html"
    code = report_main([*map(str, runs), "-o", str(html), "--continuity-rtol", rtol], out, err)
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    return code, out.getvalue() + err.getvalue(), doc


@pytest.mark.parametrize("run", PLANTED, ids=_id)
def test_a_planted_run_never_exits_0(run: Path, tmp_path: Path) -> None:
    j = judge_run_dir(run, continuity_rtol=float(LOOSE))
    status, text = verify(run, "--continuity-rtol", LOOSE)
    assert j.planted == run.name and status == (1 if j.judgeable else 2), text
    if j.passed:
        # the plant was missed at this tolerance: its verdicts pass, its exit does not
        assert f"verify: planted: {run.name}: PASSED" in text, text
        assert "never a qualification, so never exit 0" in text, text
    code, out, doc = _report(tmp_path, run)
    assert code == 1, out
    assert doc["scenarios"][0]["outcome"].startswith(f"planted: {run.name}: "), doc
    assert "QUALIFIED" not in doc["scenarios"][0]["outcome"].replace("NOT QUALIFIED", ""), doc


def test_a_loose_tolerance_lets_committed_plants_pass_their_criteria() -> None:
    # else the test above proves nothing about a planted run whose criteria all pass
    passed = [r.name for r in PLANTED if judge_run_dir(r, continuity_rtol=float(LOOSE)).passed]
    assert {"rng", "data", "optimizer-reset", "scheduler"} <= set(passed), passed


@pytest.mark.parametrize("run", CONTROLS, ids=_id)
def test_the_unplanted_controls_still_pass(run: Path) -> None:
    assert verify(run)[0] == 0
    assert judge_run_dir(run).planted is None


def _unplant(run: Doctor, *, env: tuple[str, ...]) -> None:
    """run.json's config.plant and the marker's plant made null, plant-records/ removed, and
    ``env``'s variables dropped from run.json's env and command."""
    doc = run.json("run.json")
    doc["config"]["plant"] = None
    for name in env:
        doc["env"].pop(name, None)
        doc["command"] = " ".join(w for w in doc["command"].split() if not w.startswith(f"{name}="))
    run.path("run.json").write_text(json.dumps(doc, indent=2) + "\n")
    marker = run.json(MARKER)
    marker["plant"] = None
    run.path(MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    run.remove("plant-records")


_PLANT, _RECORDS = "PYTEST_NVRX_PLANT", "PYTEST_NVRX_PLANT_RECORDS"


@pytest.mark.parametrize("run", PLANTED, ids=_id)
@pytest.mark.parametrize(
    "env",
    [(), (_PLANT,), (_PLANT, _RECORDS), (_PLANT, _RECORDS, "PYTHONPATH")],
    ids=["env-intact", "no-plant-var", "no-plant-vars", "no-env-label"],
)
def test_a_planted_run_stripped_of_its_plant_is_still_planted(
    run: Path, env: tuple[str, ...], tmp_path: Path
) -> None:
    doctored = _copy(run, tmp_path)
    _unplant(doctored, env=env)
    status, text = verify(doctored.root, "--continuity-rtol", LOOSE)
    assert status == 2, text
    summary = [line for line in text.splitlines() if line.startswith("verify: planted: ")]
    assert summary and "CANNOT JUDGE" in summary[0], text
    assert "a planted run cannot be judged as another run" in text, text
    code, out, doc = _report(tmp_path, doctored.root)
    assert code == 1, out
    assert doc["scenarios"][0]["outcome"].startswith("planted: "), doc
    assert all(row["plant"] != "control" for row in doc["selftest"]["rows"]), doc


@pytest.mark.parametrize("run", PLANTED, ids=_id)
def test_plant_records_linked_out_of_the_run_cannot_be_judged(run: Path, tmp_path: Path) -> None:
    doctored = _copy(run, tmp_path / "run")
    elsewhere = tmp_path / "elsewhere"
    doctored.path("plant-records").rename(elsewhere)
    doctored.path("plant-records").symlink_to(elsewhere)
    status, text = verify(doctored.root)
    assert status == 2, text
    assert "plant-records/ is a symlink" in text and "what the plant did is unknown" in text, text


# ---------------------------------------------------------------------------------------------
# 8. another rank prints a replayed iteration with a different loss

_LOSS = re.compile(r"(?P<pre>(?:\| lm loss: | loss ))(?P<num>[-+0-9.eE]+)")
_PREFIX = re.compile(r"^(?P<rank>\d+): ")


def _other_loss(line: str) -> str:
    """``line`` with its loss's last significant digit changed."""
    m = _LOSS.search(line)
    assert m is not None, line
    num = m["num"]
    mantissa_end = next((i for i, c in enumerate(num) if c in "eE"), len(num))
    last = mantissa_end - 1
    digit = "1" if num[last] != "1" else "2"
    new = num[:last] + digit + num[mantissa_end:]
    return line[: m.start("num")] + new + line[m.end("num") :]


def _as_rank(line: str, rank: int) -> str:
    """``line`` printed by ``rank``: its NVRx prefix and, for the reference workload, the rank
    its head states."""
    m = _PREFIX.match(line)
    assert m is not None, line
    body = line[m.end() :]
    body = re.sub(r"^(\[ref\] \S+ rank )\d+ ", rf"\g<1>{rank} ", body)
    return f"{rank}: {body}"


def _replayed(run: Path) -> list[tuple[str, int, int, int]]:
    """(cycle log, line number, printing rank, world size) of each replayed iteration line: the
    replacement's lines of iterations the failed cycle printed too."""
    evidence = _evidence(run)
    ranks = {
        int(m["rank"])
        for log in evidence.cycle_logs
        for line in (run / log.file).read_text(errors="replace").splitlines()
        if (m := _PREFIX.match(line)) is not None
    }
    world = max(ranks, default=0) + 1
    logs = {log.cycle: log for log in evidence.cycle_logs}
    found = []
    for cycle in sorted(logs)[1:]:
        earlier = {e.iteration for c, log in logs.items() if c < cycle for e in log.iterations}
        for e in logs[cycle].iterations:
            rank = _PREFIX.match(e.ref.text)
            if e.iteration in earlier and rank is not None and e.ref.line is not None:
                found.append((logs[cycle].file, e.ref.line, int(rank["rank"]), world))
    return found


@pytest.mark.parametrize("run", FAULT_RUNS, ids=_id)
@pytest.mark.parametrize("which", ["first", "last"])
def test_another_rank_printing_a_replayed_iteration_otherwise_fails(
    run: Path, which: str, tmp_path: Path
) -> None:
    # (in a run of one rank, a rank 1 that exists nowhere else: compared all the same)
    replayed = _replayed(run)
    if not replayed:
        pytest.skip("no replayed iteration")
    file, line_no, rank, world = replayed[0 if which == "first" else -1]
    doctored = _copy(run, tmp_path)
    lines = doctored.lines(file)
    original = lines[line_no - 1]
    lines.insert(line_no, _as_rank(_other_loss(original), (rank + 1) % max(world, 2)))
    doctored.write_lines(file, lines)
    status, text = never_passes(doctored.root)
    if _passes(run):
        assert "FAIL training_continuity" in text or status == 2, text


# ---------------------------------------------------------------------------------------------
# 9. the replacement's argument dump says it was started otherwise

#: entries of Megatron's argument dump that change what is restored or how training proceeds
#: (the issue's list and their neighbours)
DUMP_ENTRIES = (
    "no_load_rng",
    "override_opt_param_scheduler",
    "use_checkpoint_opt_param_scheduler",
    "lr",
    "min_lr",
    "weight_decay",
    "start_weight_decay",
    "end_weight_decay",
    "weight_decay_incr_style",
    "clip_grad",
    "adam_beta1",
    "adam_beta2",
    "adam_eps",
    "optimizer",
    "lr_warmup_iters",
    "lr_warmup_fraction",
    "lr_warmup_init",
    "lr_warmup_samples",
    "lr_decay_style",
    "lr_decay_iters",
    "lr_decay_samples",
    "micro_batch_size",
    "data_parallel_size",
    "bf16",
    "fp16",
    "use_distributed_optimizer",
    "loss_scale",
    "initial_loss_scale",
    "hysteresis",
    "accumulate_allreduce_grads_in_fp32",
    "attention_dropout",
    "hidden_dropout",
    "init_method_std",
    "make_vocab_size_divisible_by",
    "exit_interval",
    "seed",
    "train_iters",
    "global_batch_size",
    "no_load_optim",
    "finetune",
)


def _dump_line(run: Doctor, rel: str, name: str) -> int:
    """The 0-based index of ``name``'s line in the argument dump of ``rel``."""
    pattern = re.compile(rf"^\d+: +{name} \.{{3,}} ")
    hits = [i for i, line in enumerate(run.lines(rel)) if pattern.match(line)]
    assert hits, f"{rel}: no {name} in the argument dump"
    return hits[0]


def _changed(value: str) -> str:
    if value in ("True", "False"):
        return "False" if value == "True" else "True"
    if value == "None":
        return "1"
    try:
        number = float(value)
    except ValueError:
        return value + "x"
    return str(int(number) + 1) if value.lstrip("-").isdigit() else repr(number * 2 + 0.5)


def _restart_otherwise(run: Doctor, name: str) -> tuple[str, str]:
    """Cycle 1's dump entry ``name`` given another value; returns (old, new)."""
    rel = "logs/train_cycle1.log"
    at = _dump_line(run, rel, name)
    lines = run.lines(rel)
    head, _, value = lines[at].rstrip("\n").rpartition(" ")
    new = _changed(value)
    lines[at] = f"{head} {new}\n"
    run.write_lines(rel, lines)
    return value, new


def _has_dump(run: Path) -> bool:
    """Cycle 1 printed an argument dump and is a recovery's replacement that some criterion
    judges: it trained, or a later cycle replaced it (a fault schedule's cycle struck while it
    loaded, with no restart left, restored nothing that is judged)."""
    log = run / "logs" / "train_cycle1.log"
    if not log.is_file():
        return False
    text = log.read_text(errors="replace")
    judged = "] iteration " in text or (run / "logs" / "train_cycle2.log").is_file()
    return "---- arguments ----" in text and judged


DUMP_RUNS = [d for d in FAULT_RUNS if _has_dump(d)]


@pytest.mark.parametrize(
    ("run", "name"),
    [(run, DUMP_ENTRIES[i % len(DUMP_ENTRIES)]) for i, run in enumerate(DUMP_RUNS)],
    ids=lambda p: _id(p) if isinstance(p, Path) else p,
)
def test_a_replacement_started_otherwise_fails(run: Path, name: str, tmp_path: Path) -> None:
    doctored = _copy(run, tmp_path)
    _, new = _restart_otherwise(doctored, name)
    status, text = never_passes(doctored.root)
    if status == 1 and _passes(run):
        assert "FAIL optimizer_state_load: " in text, text
        assert name in text and new in text, text


@pytest.mark.parametrize("name", DUMP_ENTRIES)
def test_every_entry_of_the_dump_is_compared(name: str, tmp_path: Path) -> None:
    doctored = _copy(DATA / "gpu-continuity" / "g2-kill-30", tmp_path)
    old, new = _restart_otherwise(doctored, name)
    status, text = verify(doctored.root)
    # an entry run.json's workload_argv sets contradicts run.json as well: cannot judge
    assert status in (1, 2), text
    c3 = next(line for line in text.splitlines() if "optimizer_state_load" in line)
    assert c3.startswith("FAIL optimizer_state_load: "), text
    if name in ("no_load_rng", "no_load_optim", "finetune") and new in ("True", "1"):
        # told to skip restored state: said before any difference
        assert f"{name} = {new} [logs/train_cycle1.log:" in c3, c3
    else:
        assert f"{name} changed across the replacement: {old} in cycle 0, {new} in cycle 1" in c3


@pytest.mark.parametrize("run", DUMP_RUNS, ids=_id)
def test_a_dump_entry_only_one_cycle_printed_fails(run: Path, tmp_path: Path) -> None:
    doctored = _copy(run, tmp_path)
    rel = "logs/train_cycle1.log"
    lines = doctored.lines(rel)
    del lines[_dump_line(doctored, rel, "clip_grad")]
    doctored.write_lines(rel, lines)
    status, text = never_passes(doctored.root)
    if status == 1 and _passes(run):
        assert "clip_grad = 1.0 in " in text and "argument dump, absent from " in text, text


# ---------------------------------------------------------------------------------------------
# 10. run.json against what the run printed

MANIFEST_RUNS = [d for d in RUNS if (d / "run.json").is_file()]


def _edit_run_json(run: Doctor, edit: Callable[[dict[str, Any]], None]) -> None:
    doc = run.json("run.json")
    edit(doc)
    run.path("run.json").write_text(json.dumps(doc, indent=2) + "\n")


def _prints_versions(run: Path) -> bool:
    return "> PyTorch version" in (run / "logs" / "train_cycle0.log").read_text(errors="replace")


def _workload(run: Path) -> str:
    return str(json.loads((run / "run.json").read_text())["config"]["workload"])


def _edits(run: Path, index: int) -> list[tuple[str, Callable[[Doctor], None], str]]:
    """(name, edit, what the refusal says) of each edit that applies to ``run``."""
    restarts = 0 if index % 2 else 7
    edits: list[tuple[str, Callable[[Doctor], None], str]] = [
        (
            f"max_restarts-{restarts}",
            lambda r: _edit_run_json(r, lambda d: d["config"].update(max_restarts=restarts)),
            "max_restarts",
        )
    ]
    if _workload(run) == "megatron":
        edits += [
            (
                "tp+1",
                lambda r: _edit_run_json(r, lambda d: d["config"].update(tp=d["config"]["tp"] + 1)),
                "tensor_model_parallel_size",
            ),
            (
                "argv-lr",
                lambda r: _edit_run_json(
                    r,
                    lambda d: d.update(
                        workload_argv=[
                            "--lr=0.0003" if a.startswith("--lr=") else a
                            for a in d["workload_argv"]
                        ]
                    ),
                ),
                "--lr=0.0003",
            ),
        ]
        if _prints_versions(run) and json.loads((run / "run.json").read_text()).get("stack"):
            for key, value in (("torch", "2.9.0+cu130"), ("megatron", "0.18.0"), ("cuda", "12.8")):
                edits.append((f"stack-{key}", _set_stack(key, value), value))
    else:
        started = _started_line(run)
        for field, value in (("world_size", "4"), ("restart_count", "0")):
            if started is not None and f" {field} " in started:
                edits.append((f"started-{field}", _restart_line(field, value), field))
    return edits


def _started_line(run: Path) -> str | None:
    log = run / "logs" / "train_cycle1.log"
    if not log.is_file():
        return None
    return next((x for x in log.read_text().splitlines() if " started pid " in x), None)


def _set_stack(key: str, value: str) -> Callable[[Doctor], None]:
    return lambda r: _edit_run_json(r, lambda d: d["stack"].update({key: value}))


def _restart_line(field: str, value: str) -> Callable[[Doctor], None]:
    """An edit: the replacement's first ``started`` line says ``field value``."""

    def edit(run: Doctor) -> None:
        rel = "logs/train_cycle1.log"
        lines = run.lines(rel)
        at = next(i for i, line in enumerate(lines) if " started pid " in line)
        new = re.sub(rf" {field} \d+", f" {field} {value}", lines[at])
        assert new != lines[at], lines[at]
        lines[at] = new
        run.write_lines(rel, lines)

    return edit


@pytest.mark.parametrize("run", MANIFEST_RUNS, ids=_id)
def test_run_json_against_what_the_run_printed(run: Path, tmp_path: Path) -> None:
    for name, edit, said in _edits(run, MANIFEST_RUNS.index(run)):
        doctored = _copy(run, tmp_path / name)
        edit(doctored)
        status, text = never_passes(doctored.root)
        assert status == 2, f"{name}: {text}"
        assert said in text, f"{name}: {text}"


# ---------------------------------------------------------------------------------------------
# 13. an iteration stamped before its cycle's restore completed; the killed rank printing
#     iterations after its SIGKILL

_ISO_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00")
_MEGATRON_STAMP = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+\]")


def _stamped(line: str, when: datetime, zone: timedelta) -> str:
    """An iteration line of either workload stamped ``when`` (UTC; Megatron's in ``zone``)."""
    if _ISO_STAMP.search(line):
        iso = when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}+00:00"
        return _ISO_STAMP.sub(iso, line, count=1)
    local = (when + zone).replace(tzinfo=None)
    assert _MEGATRON_STAMP.search(line), line
    return _MEGATRON_STAMP.sub(f"[{local.strftime('%Y-%m-%d %H:%M:%S.%f')}]", line, count=1)


def _restored_cycles(run: Path) -> list[tuple[str, int, datetime]]:
    """(log, line number of its first iteration, when its restore completed) of each cycle
    with a stamped load line or setup milestone and an iteration."""
    evidence = _evidence(run)
    out = []
    for log in evidence.cycle_logs:
        done = [e.time for e in log.of_type(LoadCompleted) if e.time is not None]
        done += [
            e.time
            for e in log.of_type(Milestone)
            if e.time is not None and e.name in ("setup_done", "training_start")
        ]
        its = [e for e in log.iterations if e.time is not None and e.ref.line is not None]
        if done and its and (log.cycle > 0 or log.of_type(LoadCompleted)):
            first = min(its, key=lambda e: e.time or max(done))
            assert first.ref.line is not None
            out.append((log.file, first.ref.line, max(done)))
    return out


RESTORING = [d for d in RUNS if _restored_cycles(d)]


@pytest.mark.parametrize("run", RESTORING, ids=_id)
def test_an_iteration_stamped_before_its_cycle_restored_cannot_be_judged(
    run: Path, tmp_path: Path
) -> None:
    # the ranks of one node share a clock; those of several are a second apart at most
    evidence = _evidence(run)
    zone = evidence.launcher.utc_offset or timedelta(0)
    nodes = evidence.manifest.nnodes if evidence.manifest is not None else None
    early = timedelta(milliseconds=50 if nodes is None or nodes.value == 1 else 1050)
    for n, (file, line_no, restored) in enumerate(_restored_cycles(run)):
        doctored = _copy(run, tmp_path / str(n))
        lines = doctored.lines(file)
        lines[line_no - 1] = _stamped(lines[line_no - 1], restored - early, zone)
        doctored.write_lines(file, lines)
        status, text = never_passes(doctored.root)
        assert status == 2, text
        assert "the restore of its cycle" in text or "went back in time" in text, text


def _fired(evidence: RunEvidence) -> list[tuple[Marker, int]]:
    """Each usable kill, segv or hang marker and the cycle it fired in (its fire line's)."""
    markers = [evidence.marker, *(m for _, m in evidence.later_markers)]
    out = []
    for marker in markers:
        if marker is None or not marker.ok or marker.fault not in ("kill", "segv", "hang"):
            continue
        fired = [
            log.cycle
            for log in evidence.cycle_logs
            for line in log.injector
            if line.kind == "fired" and line.rank == marker.rank
        ]
        cycle = marker.restart_count if marker.restart_count is not None else None
        if cycle is None and len(fired) == 1:
            cycle = fired[0]
        if cycle is not None and cycle in fired:
            out.append((marker, cycle))
    return out


KILLED = [d for d in FAULT_RUNS if _fired(_evidence(d))]


@pytest.mark.parametrize("run", KILLED, ids=_id)
def test_a_killed_rank_printing_an_iteration_after_its_fire_line_cannot_be_judged(
    run: Path, tmp_path: Path
) -> None:
    evidence = _evidence(run)
    template = next(e for log in evidence.cycle_logs for e in log.iterations)
    for n, (marker, cycle) in enumerate(_fired(evidence)):
        log = evidence.cycle_log(cycle)
        assert log is not None and marker.time is not None and marker.rank is not None
        fire = next(
            line for line in log.injector if line.kind == "fired" and line.rank == marker.rank
        )
        assert fire.ref.line is not None
        above = [e for e in log.iterations if (e.ref.line or 0) < fire.ref.line]
        model = above[-1] if above else template
        doctored = _copy(run, tmp_path / str(n))
        text = _as_rank(doctored.lines(model.ref.file)[(model.ref.line or 1) - 1], marker.rank)
        text = re.sub(
            r"iteration( +)(\d+)/", lambda m: f"iteration{m[1]}{int(m[2]) + 1}/", text, count=1
        )
        zone = evidence.launcher.utc_offset or timedelta(0)
        text = _stamped(text, marker.time - timedelta(milliseconds=1), zone)
        lines = doctored.lines(log.file)
        lines.insert(fire.ref.line, text)
        doctored.write_lines(log.file, lines)
        status, out = never_passes(doctored.root)
        assert status == 2, out
        assert "printed below its fire line" in out, out
