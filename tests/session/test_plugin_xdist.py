"""The shipped suite under pytest-xdist: each scenario launched once, its progress and verdicts
on the controller's terminal (a real run of the reference baseline and kill-save, ~55 s)."""

from __future__ import annotations

import re

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.timeout(600)


@pytest.mark.real_run
def test_two_workers_launch_each_scenario_once_and_print_verdicts(
    pytester: pytest.Pytester,
) -> None:
    result = pytester.runpytest_subprocess(
        "--pyargs", "pytest_nvrx.suite", "-p", "no:cacheprovider", "-n", "2",
        "-k", "reference-baseline or reference-kill-save",
    )  # fmt: skip
    out = result.stdout.str() + "\n" + result.stderr.str()
    assert result.ret == pytest.ExitCode.OK, out[-4000:]
    result.assert_outcomes(passed=10, skipped=4)  # the baseline's four N/A criteria skip
    # launched once each, from one worker, progress tagged with it
    launches = re.findall(r"^\[(gw\d)\] nvrx (reference-\S+): launching in (\S+)$", out, re.M)
    assert sorted(s for _, s, _ in launches) == ["reference-baseline", "reference-kill-save"]
    assert len({w for w, _, _ in launches}) == 1  # one workload's scenarios on one worker
    assert re.search(r"^\[gw\d\] nvrx reference-kill-save: .*fault injected", out, re.M)
    # the header (from the first worker, once) and the verdicts on the controller
    assert len(re.findall(r"^\[gw0\] nvrx: python 3\.", out, re.M)) == 1
    assert re.search(r"^\[gw0\] nvrx: megatron: not given", out, re.M)
    result.stdout.fnmatch_lines(
        [
            "*= nvrx verdicts =*",
            "reference-baseline: *, launcher *s exit 0",
            "  PASS no_repeat_injection: *",
            "reference-kill-save: *, launcher *s exit 0",
            "  PASS prior_checkpoint: *",
        ]
    )
    # the run dirs the verdicts name are the ones launched
    named = re.findall(r"^(reference-\S+): (\S+), launcher", result.stdout.str(), re.M)
    assert sorted(named) == sorted((s, d) for _, s, d in launches)


def test_tests_that_only_look_like_scenarios_are_not_scenarios(pytester: pytest.Pytester) -> None:
    """Under xdist the controller learns from the workers which scenarios they collected (not
    from test ids): a session of ordinary tests whose ids look like scenario ids exits 0, with
    no nvrx header and no "nothing qualified"."""
    pytester.makepyfile(
        test_lookalike="""
        import pytest

        @pytest.mark.parametrize("name", ["reference-kill-save", "megatron-baseline"])
        def test_name(name):
            assert "-" in name
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(passed=2)
    out = result.stdout.str() + "\n" + result.stderr.str()
    assert "nothing was qualified" not in out and "nvrx: python" not in out
