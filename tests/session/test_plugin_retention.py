"""Evidence kept by default (issue #12): after a scenario, passed or failed, its run dir stays
with logs, cycle records, marker, manifest, result, tracker and checkpoint metadata; only the
checkpoint payload (``*.distcp``) is removed, unless --nvrx-keep. Everything the terminal summary
and the JUnit ``nvrx_run_dir`` name exists after the session, and ``verify`` still passes on it.

The pruning itself (pytest_nvrx/launch/retention.py) is a pure function over a directory tree,
tested on made-up trees; the plugin's use of it through real reference runs (the real ft_launcher).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_nvrx.launch.retention import Pruned, prune_checkpoint_payload
from pytest_nvrx.layout import TRACKER_NAME, RunLayout

pytest_plugins = ["pytester"]

# Three saves: a kill in a save's window needs a checkpoint finalized before that save opens, and
# under load (scenarios side by side, another xdist worker) the first one's background write can
# still be running when the second save opens: the third is then the one faulted. With two saves
# such a run was left with no window and failed, correctly, as "the requested fault never
# happened".
SHORT = ["--nvrx-train-iters", "9", "--nvrx-save-interval", "3"]


# ---- the pruning, on made-up trees -------------------------------------------------------------


def write(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


def make_run(work: Path) -> RunLayout:
    """A run dir as a reference/Megatron run leaves it: DCP checkpoints, a legacy torch one."""
    layout = RunLayout.for_run(work / "runs" / "r1")
    write(layout.cycle_log(0), 10)
    write(layout.launcher_log, 10)
    write(layout.cycle_infos / "cycle_info.r1.0", 10)
    write(layout.manifest, 10)
    write(layout.marker, 10)
    write(layout.run_dir / "result.json", 10)
    ckpt = layout.checkpoint_dir
    write(ckpt / TRACKER_NAME, 1)
    write(ckpt / "ft_state.json", 5)
    for it in ("iter_0000003", "iter_0000006"):
        write(ckpt / it / ".metadata", 7)
        write(ckpt / it / "metadata.json", 7)
        write(ckpt / it / "common.pt", 7)
        write(ckpt / it / "__0_0.distcp", 1000)
        write(ckpt / it / "__1_0.distcp", 1000)
    write(ckpt / "iter_0000009" / "mp_rank_00" / "model_optim_rng.pt", 500)
    return layout


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_prune_removes_payload_keeps_evidence_and_every_directory(tmp_path: Path) -> None:
    work = tmp_path / "nvrx-reference-kill-save0"
    layout = make_run(work)
    before = tree(work)
    pruned = prune_checkpoint_payload(layout, owned_root=work)
    payload = {
        "checkpoints/iter_0000003/__0_0.distcp",
        "checkpoints/iter_0000003/__1_0.distcp",
        "checkpoints/iter_0000006/__0_0.distcp",
        "checkpoints/iter_0000006/__1_0.distcp",
        "checkpoints/iter_0000009/mp_rank_00/model_optim_rng.pt",
    }
    assert set(pruned.removed) == payload
    assert pruned.freed_bytes == 4 * 1000 + 500 and pruned.skipped is None and not pruned.errors
    prefix = "runs/r1/"
    assert tree(work) == before - {prefix + p for p in payload}
    # the evidence the criteria read is all there, directories included
    assert (layout.checkpoint_dir / "iter_0000009" / "mp_rank_00").is_dir()
    assert layout.tracker.is_file() and (layout.checkpoint_dir / "iter_0000006/.metadata").is_file()
    assert "removed 5 checkpoint payload files (4.4 KiB)" in pruned.describe()
    # again: nothing left to remove
    assert prune_checkpoint_payload(layout, owned_root=work) == Pruned()


def test_prune_follows_no_link(tmp_path: Path) -> None:
    """A link in a checkpoint dir (to a file or a directory elsewhere) is neither followed nor
    removed: a run dir is untrusted, the pruner must not delete anything outside it."""
    work = tmp_path / "work"
    layout = make_run(work)
    outside = tmp_path / "elsewhere"
    precious = write(outside / "weights.distcp", 10)
    (layout.checkpoint_dir / "iter_0000003" / "link.distcp").symlink_to(precious)
    (layout.checkpoint_dir / "iter_link").symlink_to(outside, target_is_directory=True)
    pruned = prune_checkpoint_payload(layout, owned_root=work)
    assert len(pruned.removed) == 5
    assert precious.is_file()
    assert (layout.checkpoint_dir / "iter_0000003" / "link.distcp").is_symlink()


def test_prune_touches_nothing_it_does_not_own(tmp_path: Path) -> None:
    """A checkpoint dir outside the owned root (--nvrx-checkpoint-dir), a run dir outside it,
    or the root itself as the run dir: skipped, every file stays."""
    work = tmp_path / "work"
    layout = make_run(work)
    other = tmp_path / "other"
    write(other / "iter_0000003" / "__0_0.distcp", 10)  # a user's checkpoint dir
    before = tree(tmp_path)
    for root, lay in (
        (other, layout),  # run and checkpoints outside the owned root
        (work, RunLayout.for_run(layout.run_dir, other)),  # user's checkpoint dir
        (layout.run_dir, RunLayout.for_run(layout.run_dir)),  # the root itself is the run dir
        (work, RunLayout.for_run(layout.run_dir, work / "missing")),  # no checkpoint dir
    ):
        pruned = prune_checkpoint_payload(lay, owned_root=root)
        assert pruned.skipped is not None and pruned.removed == ()
        assert pruned.describe().startswith("checkpoint payload kept: ")
    # a symlinked checkpoint dir that resolves outside the root is outside too
    linked = RunLayout.for_run(layout.run_dir, work / "ckpt-link")
    (work / "ckpt-link").symlink_to(other, target_is_directory=True)
    assert prune_checkpoint_payload(linked, owned_root=work).skipped is not None
    assert tree(tmp_path) - {"work/ckpt-link"} == before


# ---- through the plugin, real reference runs -----------------------------------------------------

SUMMARY_RUN = re.compile(r"^(reference-[a-z-]+): (/\S+?)(?:, launcher .*)?$")
HEADLINE = re.compile(
    r"^  (?P<status>PASS|FAIL|N/A) (?P<id>\S+): (?P<reason>.*) \[(?P<loc>[^\]]+)\]$"
)


@dataclass
class SummaryRun:
    run_dir: Path
    #: criterion id -> (status, reason, location of the first evidence line)
    verdicts: dict[str, tuple[str, str, str]] = field(default_factory=dict)


def summary_runs(lines: list[str]) -> dict[str, SummaryRun]:
    """The ``nvrx verdicts`` section: per scenario its run dir and its verdict headlines."""
    start = next(i for i, line in enumerate(lines) if "nvrx verdicts" in line)
    runs: dict[str, SummaryRun] = {}
    current: SummaryRun | None = None
    for line in lines[start + 1 :]:
        if line.startswith("=") or line.startswith("-"):
            break
        m = SUMMARY_RUN.match(line)
        if m is not None:
            current = runs[m[1]] = SummaryRun(Path(m[2]))
            continue
        h = HEADLINE.match(line)
        if h is not None and current is not None:
            current.verdicts[h["id"]] = (h["status"], h["reason"], h["loc"])
    return runs


def junit_run_dirs(xml: Path) -> set[Path]:
    root = ET.parse(xml).getroot()
    return {
        Path(p.attrib["value"])
        for p in root.iter("property")
        if p.attrib.get("name") == "nvrx_run_dir"
    }


def run_suite(
    pytester: pytest.Pytester, basetemp: Path, keyword: str, *extra: str
) -> pytest.RunResult:
    result = pytester.runpytest_subprocess(
        # -vv: the summary's verdicts whole (by default a passing one is cut to a line)
        "--pyargs", "pytest_nvrx.suite", "-p", "no:cacheprovider", "-vv", "-k", keyword,
        f"--basetemp={basetemp}", f"--junitxml={basetemp.parent / (basetemp.name + '.xml')}",
        *SHORT, *extra,
    )  # fmt: skip
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 3, result.stdout.str()
    assert "failed" not in outcomes and "errors" not in outcomes, result.stdout.str()
    return result


@pytest.mark.real_run
@pytest.mark.timeout(500)
def test_run_dirs_named_by_summary_and_junit_exist_without_shards(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """A baseline and a kill in a save's preparation (it restores a checkpoint, whose kept
    .metadata proves optimizer state): after the session both run dirs named by the summary and
    the JUnit are there, with logs, cycle records, marker, tracker and every checkpoint's
    directory and metadata, no shard, and every file a verdict quotes exists. ``verify`` on the
    kept fault run passes with the session's verdicts (continuity aside: the session also
    compared with its baseline), the restored checkpoint's optimizer keys read from its kept
    .metadata."""
    base = tmp_path / "a"
    result = run_suite(pytester, base, "reference-baseline or reference-kill-save")
    out = result.stdout.lines
    runs = summary_runs(out)
    assert set(runs) == {"reference-baseline", "reference-kill-save"}, out
    assert junit_run_dirs(tmp_path / "a.xml") == {r.run_dir for r in runs.values()}
    for key, run in runs.items():
        run_dir = run.run_dir
        assert run_dir.is_relative_to(base) and run_dir.is_dir(), key
        assert any(f"nvrx {key}: removed 6 checkpoint payload files" in line for line in out), out
        for name in ("run.json", "result.json", "logs/train_cycle0.log", "logs/launcher.log"):
            assert (run_dir / name).is_file(), (key, name)
        assert any((run_dir / "cycle_infos").iterdir()), key
        ckpt = run_dir / "checkpoints"
        assert (ckpt / TRACKER_NAME).read_text().strip() == "9", key
        # 9 iterations, a save every 3: every checkpoint's directory and metadata, no shard
        for it in ("iter_0000003", "iter_0000006", "iter_0000009"):
            assert sorted(p.name for p in (ckpt / it).iterdir()) == [".metadata"], (key, it)
        assert sorted(p.name for p in ckpt.iterdir()) == [
            "iter_0000003", "iter_0000006", "iter_0000009", TRACKER_NAME,
        ], key  # fmt: skip
        assert list(run_dir.rglob("*.distcp")) == [], key
        assert len(run.verdicts) == 6, (key, run.verdicts)
        # "(caller)": a fact the plugin gave (fault=none), not a file
        files = [re.sub(r":\d+$", "", v[2]) for v in run.verdicts.values() if v[2][0] != "("]
        assert len(files) >= (6 if key == "reference-kill-save" else 2), (key, run.verdicts)
        for file in files:
            assert (run_dir / file).is_file(), (key, file)
    fault = runs["reference-kill-save"]
    assert (fault.run_dir / "fault_injected.json").is_file()
    assert (fault.run_dir / "logs" / "train_cycle1.log").is_file()

    report = tmp_path / "verify.json"
    verify = subprocess.run(
        [sys.executable, "-m", "pytest_nvrx", "verify", str(fault.run_dir), "--json", str(report)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    criteria = {c["id"]: c for c in json.loads(report.read_text())["criteria"]}
    assert set(criteria) == set(fault.verdicts)
    for cid, (status, reason, location) in fault.verdicts.items():
        c = criteria[cid]
        assert status == "PASS" and c["passed"] and not c["not_applicable"], (cid, c)
        if cid != "training_continuity":
            assert (c["reason"], c["evidence"][0].split(": ", 1)[0]) == (reason, location), cid
    optimizer = criteria["optimizer_state_load"]
    assert "optimizer state confirmed in the checkpoint" in optimizer["reason"], optimizer
    loaded = re.search(r"loaded checkpoint iteration (\d+)", optimizer["reason"])
    assert loaded is not None, optimizer
    proof = f"checkpoints/iter_{int(loaded[1]):07d}/.metadata: torch DCP metadata: "
    assert any(e.startswith(proof) for e in optimizer["evidence"]), optimizer


@pytest.mark.real_run
@pytest.mark.timeout(400)
def test_keep_keeps_the_shards(pytester: pytest.Pytester, tmp_path: Path) -> None:
    base = tmp_path / "b"
    result = run_suite(pytester, base, "reference-baseline", "--nvrx-keep")
    runs = summary_runs(result.stdout.lines)
    assert set(runs) == {"reference-baseline"}
    run_dir = runs["reference-baseline"].run_dir
    assert (run_dir / "logs" / "train_cycle0.log").is_file()
    shards = list((run_dir / "checkpoints").glob("iter_*/*.distcp"))
    assert shards, sorted(p.name for p in run_dir.rglob("*"))
    assert not any("checkpoint payload" in line for line in result.stdout.lines)
