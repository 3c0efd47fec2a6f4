"""Issue #11: a cycle that dies before the fault is reported by its first cause, quoted (and
issue #35: Megatron's dataset helpers imported half built say so).

The real run (tests/data/setup-failure/ref-setup-failure, README there) is the reference
workload with ``-- --dropout 2`` through the real ft_launcher: every cycle dies in setup of
torch's ValueError and no fault is ever injected. A committed Megatron run is doctored to die of
Megatron core_v0.19.0's CUDA_DEVICE_MAX_CONNECTIONS assertion at setup (the TP>1 failure that
opened issue #11). Normal fault runs, and failures after the marker, must get no such lead.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from pytest_nvrx.criteria import CRITERIA_IDS, judge, judge_run_dir
from pytest_nvrx.criteria.first_cause import BEFORE_FAULT, NEVER_HAPPENED, WITHOUT_FAULT
from pytest_nvrx.criteria.outcome import run_outcome
from pytest_nvrx.evidence.rundir import load_run
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import CYCLE0, CYCLE1, LAUNCHER, MARKER, Doctor, copy_run
from tests.helpers.recorded_runs import assert_led_by_cause

pytest_plugins = ["pytester"]

DATA = Path(__file__).parents[1] / "data"
SETUP_FAILURE = DATA / "setup-failure" / "ref-setup-failure"
G2_TERM = DATA / "gpu-faults" / "g2-term-30"
REF_TERM = DATA / "cpu-faults" / "ref-term"
MEGATRON_CHECKOUT = Path(__file__).parents[2] / ".megatron"

DROPOUT = "ValueError: dropout probability has to be between 0 and 1, but got 2.0"
# Megatron core_v0.19.0, megatron/training/arguments.py:1437-1439 (validate_args, TP>1 or CP>1
# on a GPU before Blackwell)
MAX_CONNECTIONS = (
    "AssertionError: Using tensor model parallelism or context parallelism require setting the"
    " environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1"
)
MAX_CONNECTIONS_LINE = 1437


# ----------------------------------------------------------------------------------------------
# The real run: the reference workload with a bad argument dies in setup in all four cycles


def test_real_setup_failure_leads_every_criterion_with_the_traceback() -> None:
    judgement = judge_run_dir(SETUP_FAILURE)
    cause = judgement.first_cause
    assert cause is not None
    # rank 0's traceback (its head came first), not the "aborted" line above it (line 5), which
    # names no frame
    assert cause.what == f"{DROPOUT} at torch/nn/modules/dropout.py:25"
    assert cause.ref.location == "logs/train_cycle0.log:38"
    assert cause.ref.text == f"0: [rank0]: {DROPOUT}"
    assert cause.cycle == 0
    assert cause.again == (1, 2, 3)
    assert cause.before_fault
    assert cause.text == (
        f"{BEFORE_FAULT}: {DROPOUT} at torch/nn/modules/dropout.py:25"
        " [logs/train_cycle0.log:38] (the same in cycles 1, 2, 3)"
    )
    # proof: the exception line, the raising frame and its source, the launcher's first record
    assert [ref.location for ref in cause.evidence] == [
        "logs/train_cycle0.log:38",
        "logs/train_cycle0.log:36",
        "logs/train_cycle0.log:37",
        "logs/launcher.log:47",
    ]
    assert "failed (exitcode: 1) local_rank: 0" in cause.evidence[-1].text
    assert all(not v.passed for v in judgement.verdicts)
    assert_led_by_cause(judgement)
    # the derived reason is still there, after the cause
    prior = judgement.verdict("prior_checkpoint")
    assert prior.reason.endswith(
        "no injection marker: fault kill was requested in window step"
        " (run.json) but it never happened"
    )
    assert prior.evidence[0].location == "fault_injected.json"  # the headline's own location
    assert run_outcome(judgement).summary.startswith(
        f"FAILED: {cause.text}; 6 of 6 fail: prior_checkpoint"
    )


def test_verify_prints_the_first_cause_under_its_header_and_leads_its_summary(
    tmp_path: Path,
) -> None:
    out, err = io.StringIO(), io.StringIO()
    report = tmp_path / "verify.json"
    code = verify_main([str(SETUP_FAILURE), "--json", str(report)], stdout=out, stderr=err)
    assert code == 1, out.getvalue() + err.getvalue()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(f"verify {SETUP_FAILURE}: expected fault kill (from run.json)")
    assert lines[1].startswith(f"first cause: {BEFORE_FAULT}: {DROPOUT} at torch/nn/")
    assert lines[2] == f"    logs/train_cycle0.log:38: 0: [rank0]: {DROPOUT}"
    verdicts = [line for line in lines if line.startswith(("PASS ", "FAIL ", "N/A "))]
    assert len(verdicts) == len(CRITERIA_IDS)
    assert all(
        line.startswith(f"FAIL {cid}: {BEFORE_FAULT}: {DROPOUT}")
        for line, cid in zip(verdicts, CRITERIA_IDS, strict=True)
    )
    assert lines[-1].startswith(f"verify: FAILED: {BEFORE_FAULT}: {DROPOUT}")
    assert lines[-1].endswith("; 6 of 6 fail: " + ", ".join(CRITERIA_IDS))
    data = json.loads(report.read_text())
    assert data["first_cause"]["location"] == "logs/train_cycle0.log:38"
    assert data["first_cause"]["same_in_cycles"] == [1, 2, 3]
    assert data["first_cause"]["before_fault"] is True
    assert data["summary"] == lines[-1].removeprefix("verify: ")
    assert all(c["reason"].startswith(data["first_cause"]["text"]) for c in data["criteria"])


def test_a_baseline_that_died_is_led_by_its_cause_without_a_fault() -> None:
    judgement = judge(load_run(SETUP_FAILURE), "none")
    cause = judgement.first_cause
    assert cause is not None and not cause.before_fault
    assert cause.text.startswith(f"{WITHOUT_FAULT}: {DROPOUT} at torch/nn/")
    assert not cause.text.startswith(BEFORE_FAULT)
    failing = [v for v in judgement.verdicts if not v.passed]
    assert failing, "a baseline that never trained must fail"
    assert_led_by_cause(judgement)
    # N/A verdicts (they need a fault) are not led by it
    assert all(not v.reason.startswith(WITHOUT_FAULT) for v in judgement.verdicts if v.passed)


def test_without_a_worker_error_the_launchers_first_record_is_the_cause(tmp_path: Path) -> None:
    doc = copy_run(SETUP_FAILURE, tmp_path / "run")
    for cycle in range(4):
        rel = f"logs/train_cycle{cycle}.log"
        # keep only the lines that are not errors: the workers died without a word
        doc.write_lines(
            rel,
            [line for line in doc.lines(rel) if "[rank" not in line and " aborted " not in line],
        )
    judgement = judge_run_dir(doc.root)
    cause = judgement.first_cause
    assert cause is not None
    assert cause.cycle is None
    assert cause.ref.location == "logs/launcher.log:47"
    assert cause.text.startswith(
        f"{BEFORE_FAULT}: the launcher recorded failed (exitcode: 1) local_rank: 0 (pid: 21204)"
    )
    assert_led_by_cause(judgement)


# ----------------------------------------------------------------------------------------------
# Megatron: the CUDA_DEVICE_MAX_CONNECTIONS assertion of argument validation, at setup


def megatron_assertion(rank: int) -> list[str]:
    """The traceback a Megatron core_v0.19.0 rank prints when TP>1 runs without
    CUDA_DEVICE_MAX_CONNECTIONS=1, in NVRx's per-cycle log (rank prefix and torch's tag)."""
    body = [
        "Traceback (most recent call last):",
        '  File "/work/main/pytest_nvrx/injector.py", line 1168, in <module>',
        "    sys.exit(main())",
        "             ^^^^^^",
        '  File "/work/main/pytest_nvrx/injector.py", line 1007, in main',
        "    _run_workload(opts)",
        '  File "/work/main/pytest_nvrx/injector.py", line 1097, in _run_workload',
        '    runpy.run_path(path, run_name="__main__")',
        '  File "<frozen runpy>", line 286, in run_path',
        '  File "<frozen runpy>", line 98, in _run_module_code',
        '  File "<frozen runpy>", line 88, in _run_code',
        '  File "/work/main/.megatron/pretrain_gpt.py", line 512, in <module>',
        "    args = parse_and_validate_args(",
        "           ^^^^^^^^^^^^^^^^^^^^^^^^",
        '  File "/work/main/.megatron/megatron/training/arguments.py", line 107, in'
        " parse_and_validate_args",
        "    validate_args(args, args_defaults)",
        '  File "/work/main/.megatron/megatron/training/arguments.py", line'
        f" {MAX_CONNECTIONS_LINE}, in validate_args",
        "    assert os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') == \"1\", \\",
        MAX_CONNECTIONS,
    ]
    return [f"{rank}: [rank{rank}]: {line}" for line in body]


def _no_checkpoints(doc: Doctor) -> None:
    """Workers that died before training wrote no checkpoint: the copy's checkpoints go too
    (an iter_N/ no save of the run wrote cannot be judged: criteria/checkpoint_agreement.py)."""
    for path in (doc.root / "checkpoints").iterdir():
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def doctor_megatron_setup_failure(dest: Path) -> tuple[Doctor, int]:
    """g2-term-30 as if TP=2 had run without the variable: both ranks die in validate_args in
    cycles 0 and 1, no marker; returns the doctor and the line of rank 0's exception in cycle 0."""
    doc = copy_run(G2_TERM, dest)
    doc.remove(MARKER)
    _no_checkpoints(doc)
    exception_line = 0
    for rel in (CYCLE0, CYCLE1):
        # argument validation prints the parallel sizes, then asserts before the argument dump
        doc.truncate_after(rel, "Number of virtual stages per pipeline stage")
        first = doc.append(rel, *megatron_assertion(0), *megatron_assertion(1))
        if rel == CYCLE0:
            exception_line = first + len(megatron_assertion(0)) - 1
    doc.replace(
        LAUNCHER, "failed (exitcode: -15) local_rank: 1", "failed (exitcode: 1) local_rank: 0"
    )
    # no cycle trained: the launcher did not exit 0 (as tests/data/setup-failure's did not)
    doc.set_json("result.json", exit_code=1)
    return doc, exception_line


def test_megatron_setup_assertion_leads_with_its_wording(tmp_path: Path) -> None:
    doc, line = doctor_megatron_setup_failure(tmp_path / "run")
    assert doc.lines(CYCLE0)[line - 1] == f"0: [rank0]: {MAX_CONNECTIONS}\n"
    judgement = judge_run_dir(doc.root)
    cause = judgement.first_cause
    assert cause is not None
    where = f"megatron/training/arguments.py:{MAX_CONNECTIONS_LINE}"
    assert cause.what == f"{MAX_CONNECTIONS} at {where}"
    assert cause.text == (
        f"{BEFORE_FAULT}: {MAX_CONNECTIONS} at {where} [{CYCLE0}:{line}] (the same in cycle 1)"
    )
    assert cause.evidence[1].text.endswith(f"line {MAX_CONNECTIONS_LINE}, in validate_args")
    assert "failed (exitcode: 1) local_rank: 0" in cause.evidence[-1].text
    failing = [v for v in judgement.verdicts if not v.passed]
    assert {v.id for v in failing} >= {"prior_checkpoint", "replaced_cycle", "no_repeat_injection"}
    assert_led_by_cause(judgement)
    assert run_outcome(judgement).summary.startswith(
        f"FAILED: {BEFORE_FAULT}: AssertionError: Using tensor"
    )


def test_the_doctored_assertion_is_the_checkouts_own() -> None:
    """The message and line the Megatron test quotes are those of the checkout (core_v0.19.0)."""
    source = MEGATRON_CHECKOUT / "megatron" / "training" / "arguments.py"
    if not source.is_file():
        pytest.skip("no Megatron checkout in .megatron (scripts fetch it for the GPU device)")
    lines = source.read_text(encoding="utf-8").splitlines()
    statement = " ".join(
        line.strip() for line in lines[MAX_CONNECTIONS_LINE - 1 : MAX_CONNECTIONS_LINE + 2]
    )
    assert statement.startswith("assert os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') == \"1\"")
    message = "".join(part.split('"')[1] for part in statement.split("\\")[1:] if '"' in part)
    assert "AssertionError: " + message == MAX_CONNECTIONS


# ----------------------------------------------------------------------------------------------
# No lead where the first failure is the fault's


@pytest.mark.parametrize(
    "run",
    [
        REF_TERM,  # rank 0's gloo traceback follows the fault: a consequence, not a cause
        G2_TERM,
        DATA / "windows" / "cpu" / "ref-exception-step",  # the injected exception's traceback
        DATA / "windows" / "gpu" / "g2-exception-step",
        DATA / "gpu" / "gpu-kill-100",
    ],
    ids=lambda p: p.name,
)
def test_a_normal_fault_run_has_no_first_cause(run: Path) -> None:
    judgement = judge_run_dir(run)
    assert judgement.passed, "\n".join(v.render() for v in judgement.verdicts)
    assert judgement.first_cause is None
    assert not run_outcome(judgement).summary.startswith("FAILED")


def test_a_failure_after_the_marker_gets_no_lead() -> None:
    """g2-kill-finetune fails after its fault (the replacement reset the optimizer): its own
    reasons, unprefixed."""
    judgement = judge_run_dir(DATA / "gpu-continuity" / "g2-kill-finetune")
    assert not judgement.passed
    assert judgement.first_cause is None
    assert all(not v.reason.startswith(BEFORE_FAULT) for v in judgement.verdicts)
    assert run_outcome(judgement).summary.startswith("FAILED (")


def test_a_lost_marker_with_a_fire_line_is_still_the_fault(tmp_path: Path) -> None:
    """The injector's fire line proves the fault happened: rank 0's gloo traceback below it is a
    consequence, not a cause, even with the marker file gone."""
    doc = copy_run(REF_TERM, tmp_path / "run")
    doc.remove(MARKER)
    judgement = judge_run_dir(doc.root)
    assert not judgement.passed  # no marker: the criteria that need it fail
    assert judgement.first_cause is None
    # and with the fire line gone too, nothing shows a fault: the traceback is the first cause
    doc.delete(CYCLE0, "advanced 0 -> 4; marker")
    cause = judge_run_dir(doc.root).first_cause
    assert cause is not None
    assert cause.what.startswith("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/")


def test_a_baseline_judged_as_a_fault_run_that_ended_well_says_the_fault_never_happened() -> None:
    """No marker and no failure: the cause is that the fault never happened, and why (#21 item
    5): no injector line in any cycle log, nothing watched for the window."""
    judgement = judge_run_dir(DATA / "gpu" / "gpu-baseline-20")
    cause = judgement.first_cause
    assert cause is not None and cause.never
    assert cause.text == (
        f"{NEVER_HAPPENED}: the run ended without a fault: no injector line in any cycle log:"
        " nothing watched for the window (the workers were not started through"
        " pytest_nvrx/worker/injector.py) [run.json]"
    )
    assert "logs/train_cycle0.log: (no [pytest-nvrx injector] line)" in [
        ref.render() for ref in cause.evidence
    ]
    assert "no injection marker" in judgement.verdict("prior_checkpoint").reason
    assert_led_by_cause(judgement)


# ----------------------------------------------------------------------------------------------
# A marker exists, but the launcher recorded a failure before it

EARLY_FAILURE = (
    "E1130 15:19:45.000000 11278 torch/distributed/elastic/multiprocessing/api.py:1002] failed"
    " (exitcode: 1) local_rank: 0 (pid: 11289) of binary: /work/main/.venv/bin/python"
)
EARLY_TRACEBACK = (
    "0: [rank0]: Traceback (most recent call last):",
    '0: [rank0]:   File "/work/main/pytest_nvrx/workloads/reference.py", line 315, in __init__',
    "0: [rank0]:     self.model = TinyGPT(model_cfg)",
    "0: [rank0]: RuntimeError: early trouble",
)


def _ref_term_with_early_failure(dest: Path) -> Doctor:
    doc = copy_run(REF_TERM, dest)
    # 5.95 s before the marker's 15:19:50.950, in cycle 0 (the fault's cycle)
    doc.insert_before(LAUNCHER, "failed (exitcode: -15) local_rank: 1", EARLY_FAILURE)
    return doc


def test_a_failure_before_the_marker_leads_with_the_error_above_the_fire_line(
    tmp_path: Path,
) -> None:
    doc = _ref_term_with_early_failure(tmp_path / "run")
    first = doc.insert_before(CYCLE0, "advanced 0 -> 4; marker", *EARLY_TRACEBACK)
    judgement = judge_run_dir(doc.root)
    cause = judgement.first_cause
    assert cause is not None
    assert cause.ref.location == f"{CYCLE0}:{first + 3}"
    assert cause.what == "RuntimeError: early trouble at pytest_nvrx/workloads/reference.py:315"
    # the second failure fails no_repeat_injection; the criteria that hold stay as they were
    repeat = judgement.verdict("no_repeat_injection")
    assert not repeat.passed
    assert repeat.reason.startswith(f"{cause.text}; a second failure besides the injected one")
    assert judgement.verdict("prior_checkpoint").passed
    assert_led_by_cause(judgement)


def test_errors_below_the_fire_line_are_the_faults_not_the_cause(tmp_path: Path) -> None:
    doc = _ref_term_with_early_failure(tmp_path / "run")
    # the same traceback after the fault: the launcher's early record is all that precedes it
    doc.insert_after(CYCLE0, "advanced 0 -> 4; marker", *EARLY_TRACEBACK)
    judgement = judge_run_dir(doc.root)
    cause = judgement.first_cause
    assert cause is not None
    assert cause.cycle is None
    assert cause.ref.text == EARLY_FAILURE
    assert cause.text.startswith(f"{BEFORE_FAULT}: the launcher recorded failed (exitcode: 1)")


def test_the_early_record_alone_decides(tmp_path: Path) -> None:
    """Proof the early record is what triggers the lead: without it, the same logs give none."""
    doc = copy_run(REF_TERM, tmp_path / "run")
    doc.insert_before(CYCLE0, "advanced 0 -> 4; marker", *EARLY_TRACEBACK)
    assert judge_run_dir(doc.root).first_cause is None


# ----------------------------------------------------------------------------------------------
# The plugin: the scenario's own line and its first test lead with the cause


def test_plugin_reports_the_first_cause_first(pytester: pytest.Pytester, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(SETUP_FAILURE, run)
    result = pytester.runpytest(
        "--pyargs", "pytest_nvrx.suite", "-p", "no:cacheprovider", "--nvrx-run-dir", str(run)
    )
    result.assert_outcomes(failed=1 + len(CRITERIA_IDS))
    result.stdout.fnmatch_lines(
        [f"nvrx existing-run: {BEFORE_FAULT}: {DROPOUT} at torch/nn/modules/dropout.py:25 *"]
    )
    # the scenario's first test fails with the cause as its whole message
    result.stdout.fnmatch_lines(
        ["*_ test_run_finished[[]existing-run[]] _*", f"{BEFORE_FAULT}: {DROPOUT} at *"]
    )
    result.stdout.fnmatch_lines(
        ["*= nvrx verdicts =*", "existing-run: *", f"  FAIL prior_checkpoint: {BEFORE_FAULT}: *"]
    )


# ----------------------------------------------------------------------------------------------
# Megatron's dataset helpers imported half built (issue #35): another job's make was writing
# them on a shared checkout; this job's make found the file newer than its source, called it up
# to date, and the import found it cut

HELPERS = "/work/main/.megatron/megatron/core/datasets/helpers_cpp.cpython-312-x86_64-linux-gnu.so"


def half_built_import(rank: int, why: str) -> list[str]:
    """The traceback a Megatron core_v0.19.0 rank prints when its dataset build imports the
    helpers while another process writes them (the frames' lines are core_v0.19.0's)."""
    root = "/work/main/.megatron"
    body = [
        "Traceback (most recent call last):",
        '  File "/work/main/pytest_nvrx/injector.py", line 1097, in _run_workload',
        '    runpy.run_path(path, run_name="__main__")',
        f'  File "{root}/pretrain_gpt.py", line 523, in <module>',
        "    pretrain(",
        f'  File "{root}/megatron/training/training.py", line 1354, in pretrain',
        "    iterators = build_train_valid_test_data_iterators(",
        f'  File "{root}/pretrain_gpt.py", line 473, in train_valid_test_datasets_provider',
        "    ).build()",
        f'  File "{root}/megatron/core/datasets/blended_megatron_dataset_builder.py", line 531,'
        " in build_generic_dataset",
        "    dataset = cls(*args)",
        f'  File "{root}/megatron/core/datasets/gpt_dataset.py", line 149, in __init__',
        "    self._build_document_sample_shuffle_indices()",
        f'  File "{root}/megatron/core/datasets/gpt_dataset.py", line 563, in'
        " _build_document_sample_shuffle_indices",
        "    from megatron.core.datasets import helpers",
        f'  File "{root}/megatron/core/datasets/helpers.py", line 8, in <module>',
        "    from megatron.core.datasets.helpers_cpp import *",
        f"ImportError: {HELPERS}: {why}",
    ]
    return [f"{rank}: [rank{rank}]: {line}" for line in body]


@pytest.mark.parametrize("why", ["file too short", "invalid ELF header"])
def test_helpers_imported_half_built_are_named_as_such(tmp_path: Path, why: str) -> None:
    """g2-term-30 as if another job on the checkout were still building the helpers: in cycles
    0 and 1 rank 0's make finds them up to date and its dataset build dies importing them."""
    doc = copy_run(G2_TERM, tmp_path / "run")
    doc.remove(MARKER)
    _no_checkpoints(doc)
    # cycle 0 built them itself (its g++ line): here the other job's file was already there
    doc.replace(
        CYCLE0,
        doc.lines(CYCLE0)[doc.line_no(CYCLE0, "/opt/gcc/bin/g++ ") - 1].rstrip("\n"),
        "0: make: Nothing to be done for 'default'.",
    )
    line = 0
    for rel in (CYCLE0, CYCLE1):
        doc.truncate_after(rel, "Build and save the MockGPTDataset train indices")
        first = doc.append(rel, *half_built_import(0, why))
        if rel == CYCLE0:
            line = first + len(half_built_import(0, why)) - 1
    doc.replace(
        LAUNCHER, "failed (exitcode: -15) local_rank: 1", "failed (exitcode: 1) local_rank: 0"
    )
    doc.set_json("result.json", exit_code=1)  # no cycle trained: the launcher did not exit 0
    judgement = judge_run_dir(doc.root)
    cause = judgement.first_cause
    assert cause is not None
    exception = f"ImportError: {HELPERS}: {why}"
    assert cause.ref.location == f"{CYCLE0}:{line}"
    assert cause.ref.text == f"0: [rank0]: {exception}"
    assert cause.what == (
        f"{exception} at megatron/core/datasets/helpers.py:8; helpers_cpp.cpython-312-x86_64-"
        f"linux-gnu.so was half built ({why}): it was imported while another process was still"
        " building it (Megatron builds it at first use, on rank 0 of every job using the"
        " checkout)"
    )
    assert cause.text == f"{BEFORE_FAULT}: {cause.what} [{CYCLE0}:{line}] (the same in cycle 1)"
    # the proof: the exception line, the import that raised it and its source
    assert [ref.text for ref in cause.evidence[:3]] == [
        f"0: [rank0]: {exception}",
        '0: [rank0]:   File "/work/main/.megatron/megatron/core/datasets/helpers.py", line 8,'
        " in <module>",
        "0: [rank0]:     from megatron.core.datasets.helpers_cpp import *",
    ]
    assert_led_by_cause(judgement)
    assert run_outcome(judgement).summary.startswith(f"FAILED: {BEFORE_FAULT}: ImportError: ")


def test_other_import_errors_are_not_called_half_built(tmp_path: Path) -> None:
    """A missing library or module is no half-built file: described as before."""
    doc = copy_run(G2_TERM, tmp_path / "run")
    doc.remove(MARKER)
    missing = (
        "ImportError: libcudart.so.13: cannot open shared object file: No such file or directory"
    )
    for rel in (CYCLE0, CYCLE1):
        doc.truncate_after(rel, "Build and save the MockGPTDataset train indices")
        doc.append(rel, *half_built_import(0, "x")[:-1], f"0: [rank0]: {missing}")
    doc.replace(
        LAUNCHER, "failed (exitcode: -15) local_rank: 1", "failed (exitcode: 1) local_rank: 0"
    )
    cause = judge_run_dir(doc.root).first_cause
    assert cause is not None
    assert cause.what == f"{missing} at megatron/core/datasets/helpers.py:8"
