"""``verify``: output lines, exit status 0/1/2 and the JSON report."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_nvrx.criteria import CRITERIA_IDS
from pytest_nvrx.criteria.judgement_text import JSON_SCHEMA_VERSION
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import (
    BASELINE_RUN,
    CYCLE1,
    HARNESS_RESULT,
    KILL_RUN,
    MARKER,
    Doctor,
    copy_run,
)

SCHEDULE_RUN = Path(__file__).parents[1] / "data" / "cpu-schedules" / "ref-kill-step+kill-restore"
LINE = re.compile(r"^(PASS|FAIL|N/A) (\w+): (.+) \[([^\]]+)\]$")


def run_verify(*argv: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = verify_main([str(a) for a in argv], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def verdict_lines(text: str) -> list[re.Match[str]]:
    return [m for line in text.splitlines() if (m := LINE.match(line))]


@pytest.fixture
def kill(tmp_path: Path) -> Doctor:
    return copy_run(KILL_RUN, tmp_path / "run")


def test_kill_run_prints_five_pass_lines_with_evidence_and_exits_0() -> None:
    code, out, err = run_verify(KILL_RUN)
    assert code == 0, out + err
    lines = verdict_lines(out)
    assert [(m[1], m[2]) for m in lines] == [("PASS", c) for c in CRITERIA_IDS]
    assert lines[0][4] == f"{MARKER}:7"
    # evidence is indented under its verdict and quotes file:line: text
    assert (
        "    logs/train_cycle0.log:1057: 0:   [2026-11-29 11:03:55.958385] successfully saved"
        in out
    )
    assert out.rstrip().endswith("verify: PASSED (6 of 6)")
    assert err == ""


def test_baseline_as_fault_run_exits_1() -> None:
    code, out, _ = run_verify(BASELINE_RUN)
    assert code == 1
    statuses = {m[2]: m[1] for m in verdict_lines(out)}
    assert statuses["prior_checkpoint"] == "FAIL"
    assert "FAILED" in out.splitlines()[-1]


def test_baseline_declared_passes_with_not_applicable() -> None:
    code, out, _ = run_verify(BASELINE_RUN, "--expect-fault", "none")
    assert code == 0
    statuses = [m[1] for m in verdict_lines(out)]
    assert statuses == ["N/A", "N/A", "N/A", "PASS", "PASS", "N/A"]
    assert "expected fault none (from --expect-fault)" in out
    assert out.rstrip().endswith("verify: PASSED (2 of 6, 4 not applicable)")


def test_kill_run_with_expect_fault_hang_fails(kill: Doctor) -> None:
    code, out, _ = run_verify(kill.root, "--expect-fault", "hang")
    assert code == 1
    assert "FAIL prior_checkpoint: marker records fault 'kill' but 'hang' was expected" in out


def test_json_report(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    code, _, _ = run_verify(KILL_RUN, "--json", target)
    assert code == 0
    data = json.loads(target.read_text())
    assert data["passed"] is True and data["exit_status"] == 0
    assert data["run_dir"] == str(KILL_RUN)
    assert [c["id"] for c in data["criteria"]] == list(CRITERIA_IDS)
    first = data["criteria"][0]
    assert first["passed"] is True and first["evidence"][0] == (
        f'{MARKER}:7:   "tracker_iteration": 5,'
    )
    assert data["stack"]["megatron_core"] == "0.19.1"
    assert data["timings"]["failure_to_detected_s"] == pytest.approx(0.281)
    assert data["expected_fault"] == {"kind": "kill", "source": MARKER}


def test_json_to_stdout_for_a_failing_run() -> None:
    code, out, err = run_verify(BASELINE_RUN, "--json", "-")
    data = json.loads(out)  # the JSON alone: the text report went to stderr
    assert code == 1 and data["passed"] is False and data["exit_status"] == 1
    assert "FAIL prior_checkpoint:" in err
    assert err.rstrip().endswith(f"verify: {data['summary']}")


def test_json_to_a_file_keeps_the_text_on_stdout(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    code, out, err = run_verify(BASELINE_RUN, "--json", target)
    assert code == 1 and err == ""
    assert len(verdict_lines(out)) == len(CRITERIA_IDS)
    assert json.loads(target.read_text())["exit_status"] == 1


def test_json_of_an_unjudgeable_run_exits_2_with_the_problem(kill: Doctor, tmp_path: Path) -> None:
    code, out, err = run_verify(kill.root, "--checkpoint-dir", tmp_path / "none", "--json", "-")
    data = json.loads(out)
    assert code == 2 and data["exit_status"] == 2 and data["passed"] is False
    assert data["summary"] == "CANNOT JUDGE (see errors)"
    # the missing checkpoint dir, and so the tracker the run finalized (checkpoint_agreement)
    assert {p["severity"] for p in data["problems"]} == {"fatal"}
    assert data["problems"][0]["message"].endswith("none does not exist")
    assert "verify: error: cannot judge" in err and "CANNOT JUDGE" in err


def documented_json_fields() -> list[str]:
    """The field names of docs/criteria.md's ``verify --json`` field table, in order."""
    text = (Path(__file__).parents[2] / "docs" / "criteria.md").read_text(encoding="utf-8")
    table = text[text.index("| field | type | meaning |") :]
    table = table[: table.index("\n\n")]  # the table ends at the first blank line
    fields = re.findall(r"^\| `(\w+)` \| ", table, flags=re.MULTILINE)
    assert fields, "docs/criteria.md: the verify --json field table is gone"
    return fields


def test_json_schema_version_and_documented_fields() -> None:
    code, out, _ = run_verify(KILL_RUN, "--json", "-")
    data = json.loads(out)
    assert code == 0
    assert data["schema_version"] == JSON_SCHEMA_VERSION == 1
    assert isinstance(data["schema_version"], int)
    # every field is documented, and every documented field is there, in the documented order
    # (``planted`` only in a planted run: tests/selftest/test_planted_labels.py; a fault schedule's
    # recoveries and total only in its run's)
    documented = [f for f in documented_json_fields() if f != "planted"]
    schedule_only = ("recoveries", "total_downtime_s")
    assert list(data) == [f for f in documented if f not in schedule_only]
    code, out, _ = run_verify(SCHEDULE_RUN, "--json", "-")
    assert code == 0 and list(json.loads(out)) == documented


def test_cli_json_pipes_into_json_tool() -> None:
    """``python -m pytest_nvrx verify RUN --json - | python -m json.tool``, both real processes."""
    verify = subprocess.Popen(
        [sys.executable, "-m", "pytest_nvrx", "verify", str(KILL_RUN), "--json", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert verify.stdout is not None
    tool = subprocess.Popen(
        [sys.executable, "-m", "json.tool", "--sort-keys"],
        stdin=verify.stdout,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    verify.stdout.close()  # json.tool alone holds the pipe's read end
    tool_out, tool_err = tool.communicate(timeout=120)
    verify_err = verify.stderr.read() if verify.stderr is not None else b""
    assert verify.wait(timeout=120) == 0, verify_err.decode()
    assert tool.returncode == 0, tool_err.decode()
    data = json.loads(tool_out)
    assert data["passed"] is True and data["exit_status"] == 0
    assert [c["id"] for c in data["criteria"]] == list(CRITERIA_IDS)
    report = verify_err.decode()
    assert report.startswith(f"verify {KILL_RUN}: expected fault kill")
    assert len(verdict_lines(report)) == len(CRITERIA_IDS)
    assert report.rstrip().endswith("verify: PASSED (6 of 6)")


def test_stack_from_run_json(kill: Doctor) -> None:
    # made as our harness makes a run: run.json, and result.json at its end
    kill.set_json(
        "run.json",
        schema=1,
        config={"fault": "kill"},
        stack={"torch": "2.11.0+cu130", "nccl": "2.28.9"},
    )
    kill.set_json("result.json", **HARNESS_RESULT)
    code, out, _ = run_verify(kill.root, "--json", "-")
    assert code == 0
    assert json.loads(out)["stack"] == {
        "torch": "2.11.0+cu130",
        "nccl": "2.28.9",
    }


# ---------------------------------------------------------------------------------------------
# what cannot be judged: exit 2 with a message that says what is missing


def test_missing_run_dir_exits_2(tmp_path: Path) -> None:
    code, out, err = run_verify(tmp_path / "nope")
    assert code == 2 and out == ""
    assert f"verify: error: run directory {tmp_path / 'nope'} does not exist" in err


def test_not_a_run_dir_exits_2(tmp_path: Path) -> None:
    code, _, err = run_verify(tmp_path)
    assert code == 2
    assert "is not a run directory: no logs/launcher.log" in err


def test_garbled_marker_exits_2_and_says_so(kill: Doctor) -> None:
    kill.path(MARKER).write_text("killed rank 0 at 11:03:55")
    code, out, err = run_verify(kill.root)
    assert code == 2
    assert "injection marker unusable: fault_injected.json is unreadable: not JSON" in err
    assert "FAIL prior_checkpoint: injection marker unusable" in out
    assert "CANNOT JUDGE" in out


def test_garbled_run_json_exits_2(kill: Doctor) -> None:
    kill.path("run.json").write_text('{"config": ')
    code, _, err = run_verify(kill.root)
    assert code == 2 and "run.json is unreadable" in err


def test_missing_checkpoint_dir_exits_2(kill: Doctor, tmp_path: Path) -> None:
    code, _, err = run_verify(kill.root, "--checkpoint-dir", tmp_path / "none")
    assert code == 2 and "checkpoint directory" in err and "does not exist" in err


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert verify_main([]) == 2
    assert verify_main([str(KILL_RUN), "--expect-fault", "explode"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_missing_pieces_fail_with_a_reason_not_a_crash(kill: Doctor) -> None:
    # a replacement log cut to nothing and no cycle records: judged, not crashed
    kill.path(CYCLE1).write_bytes(b"")
    kill.remove("cycle_infos")
    code, out, _ = run_verify(kill.root)
    assert code == 1
    assert "note: cycle_infos/ is missing" in out
    assert "FAIL replaced_cycle: cycle_infos/ is missing" in out
    assert "FAIL optimizer_state_load: cycle 1 shows no checkpoint load at all" in out


def test_binary_junk_logs_do_not_crash(kill: Doctor) -> None:
    for rel in ("logs/launcher.log", "logs/train_cycle0.log", CYCLE1):
        kill.path(rel).write_bytes(bytes(range(256)) * 64)
    code, out, _ = run_verify(kill.root)
    assert code == 1 and len(verdict_lines(out)) == len(CRITERIA_IDS)


def test_module_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_nvrx.verify", str(KILL_RUN)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\nPASS ") + proc.stdout.startswith("PASS ") == len(CRITERIA_IDS)
