"""mentor.pytest_plugin: the no_syncs marker and fixture, allow_syncs and warm-up steps, run through pytester.

On this CPU machine the check watches the explicit synchronizing calls that sync_guard wraps; a
one-rank gloo group's collectives are such calls, so they stand in for syncs here. The CUDA path
(.item() and friends) is tested in test_gpu_part2.py. Each inner pytest run is a subprocess: an inline
run re-imports hypothesis and torch's extension modules, which crashes the interpreter.
"""

from __future__ import annotations

from importlib import metadata

import pytest

from mentor.pytest_plugin import SyncCheck, allow_syncs

pytest_plugins = ["pytester"]

# A tiny "training code" module: a step that makes one collective call (a sync the guard sees on CPU),
# a step that makes none, and a group fixture.
HELPERS = '''
import pytest
import torch
import torch.distributed as dist
from mentor.ddp import single_rank_group
from mentor.pytest_plugin import allow_syncs

@pytest.fixture
def group():
    with single_rank_group("gloo"):
        yield

def log_loss(loss):
    dist.all_reduce(loss)          # the hidden sync: line 13 of conftest.py (makeconftest strips the first newline)

def clean_step(x):
    return x * 2

def chatty_step(x):
    log_loss(x)
    return x * 2
'''


@pytest.fixture
def tests_dir(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(HELPERS)
    return pytester


def test_plugin_is_registered_by_the_package_entry_point() -> None:
    """`pip install -e .` makes pytest load the plugin: the pytest11 entry point names the module."""
    points = {p.name: p.value for p in metadata.entry_points(group="pytest11")}
    assert points.get("mentor") == "mentor.pytest_plugin"


@pytest.mark.subprocess
def test_marker_fails_a_test_that_syncs_and_names_the_line(tests_dir: pytest.Pytester) -> None:
    tests_dir.makepyfile(test_x='''
import pytest, torch
from conftest import chatty_step

@pytest.mark.no_syncs
def test_step(group):
    chatty_step(torch.ones(2))
''')
    result = tests_dir.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*test_x.py::test_step: 1 synchronizing call under the no_syncs check:",
        "*1x  *conftest.py:13  in log_loss()  <- *conftest.py:13  [[]collective: all_reduce[]]",
        "*allow_syncs*",
    ])


@pytest.mark.subprocess
def test_marker_passes_a_test_without_syncs_and_says_what_cpu_cannot_see(tests_dir: pytest.Pytester) -> None:
    tests_dir.makepyfile(test_x='''
import pytest, torch
from conftest import clean_step

@pytest.mark.no_syncs
def test_step(group):
    assert clean_step(torch.ones(2)).tolist() == [2.0, 2.0]
''')
    result = tests_dir.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["mentor no_syncs: 1 test(s) ran without a CUDA device*only explicit calls*"])


@pytest.mark.subprocess
def test_unmarked_tests_are_not_watched(tests_dir: pytest.Pytester) -> None:
    tests_dir.makepyfile(test_x='''
import torch
from conftest import chatty_step

def test_step(group):
    chatty_step(torch.ones(2))
''')
    result = tests_dir.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "mentor no_syncs" not in result.stdout.str()


@pytest.mark.subprocess
def test_fixture_excuses_warm_up_steps_only(tests_dir: pytest.Pytester) -> None:
    """warmup=2 excuses the syncs of steps 0 and 1; step 2 syncs and the test fails with 1 call, 2 excused."""
    tests_dir.makepyfile(test_x='''
import torch
from conftest import chatty_step, clean_step

def test_warm_up_only(no_syncs, group):
    for step in no_syncs.steps(range(5), warmup=2):
        (chatty_step if step < 2 else clean_step)(torch.ones(2))

def test_syncs_after_warm_up(no_syncs, group):
    for step in no_syncs.steps(range(4), warmup=2):
        (chatty_step if step == 2 else clean_step)(torch.ones(2))
''')
    result = tests_dir.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*test_x.py::test_syncs_after_warm_up: 1 synchronizing call under the no_syncs check*",
    ])
    assert "test_warm_up_only: " not in result.stdout.str()


@pytest.mark.subprocess
def test_allow_syncs_excuses_its_block_and_counts_it(tests_dir: pytest.Pytester) -> None:
    tests_dir.makepyfile(test_x='''
import pytest, torch
from conftest import chatty_step
from mentor.pytest_plugin import allow_syncs

@pytest.mark.no_syncs
def test_allowed(group):
    with allow_syncs("the report step reads once"):
        chatty_step(torch.ones(2))

@pytest.mark.no_syncs
def test_one_allowed_two_not(group):
    with allow_syncs("the report step reads once"):
        chatty_step(torch.ones(2))
    chatty_step(torch.ones(2))
    chatty_step(torch.ones(2))
''')
    result = tests_dir.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*test_one_allowed_two_not: 2 synchronizing calls under the no_syncs check "
        "(1 more excused by warm-up or allow_syncs):",
        "*2x  *conftest.py:13  in log_loss()*",
    ])


@pytest.mark.subprocess
def test_a_failing_test_reports_its_own_error_first(tests_dir: pytest.Pytester) -> None:
    tests_dir.makepyfile(test_x='''
import pytest, torch
from conftest import chatty_step

@pytest.mark.no_syncs
def test_step(group):
    chatty_step(torch.ones(2))
    assert 1 == 2, "the test's own failure"
''')
    result = tests_dir.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    assert "the test's own failure" in result.stdout.str()
    assert "under the no_syncs check" not in result.stdout.str()


@pytest.mark.subprocess
def test_the_guard_is_gone_after_the_test(tests_dir: pytest.Pytester) -> None:
    """The wrappers are removed when the watched test ends: a later unmarked test's collective runs unwatched."""
    tests_dir.makepyfile(test_x='''
import pytest, torch, torch.distributed as dist
from conftest import chatty_step

real_all_reduce = dist.all_reduce

@pytest.mark.no_syncs
def test_first(group):
    assert dist.all_reduce is not real_all_reduce

def test_second(group):
    assert dist.all_reduce is real_all_reduce
''')
    tests_dir.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_allow_syncs_outside_a_check_does_nothing_and_needs_a_reason() -> None:
    with allow_syncs("no check is running"):
        pass
    for reason in ("", "  ", None, 3):
        with pytest.raises(ValueError, match="allow_syncs needs a reason"):
            with allow_syncs(reason):  # type: ignore[arg-type]
                pass


@pytest.mark.parametrize("warmup", [-1, 1.5, True, "2"])
def test_steps_refuses_a_bad_warmup(warmup: object) -> None:
    with pytest.raises(ValueError, match=r"warmup must be a whole number of steps >= 0, not"):
        list(SyncCheck("t").steps([1, 2], warmup=warmup))  # type: ignore[arg-type]


def test_steps_excuses_by_index_with_a_fake_report() -> None:
    """Sites recorded during warm-up iterations are excused, named by step; later ones fail."""
    class Report:
        sites: list[str] = []

    check = SyncCheck("t", report=Report())
    check.report.sites = []
    for step in check.steps(range(4), warmup=2):
        check.report.sites.extend([f"s{step}a", f"s{step}b"] if step in (1, 3) else [])
    assert check.excused == {0: "warm-up step 1", 1: "warm-up step 1"}
    assert check.failing == ["s3a", "s3b"]


def test_steps_excuses_a_warm_up_step_left_by_break() -> None:
    class Report:
        sites: list[str] = []

    check = SyncCheck("t", report=Report())
    check.report.sites = []
    for step in check.steps(range(4), warmup=2):
        check.report.sites.append(f"s{step}")
        break
    assert check.excused == {0: "warm-up step 0"}


class _Sites:
    """A stand-in for mentor.profiling.SyncReport: only its list of sites is read by SyncCheck."""

    def __init__(self, *sites: str) -> None:
        self.sites = list(sites)


def test_allow_excuses_only_the_syncs_of_its_block() -> None:
    """Sites recorded before the block keep failing; only those made inside it are excused, with the reason."""
    check = SyncCheck("t", report=_Sites("before"))
    with check.allow("report step"):
        check.report.sites.extend(["in1", "in2"])
    check.report.sites.append("after")
    assert check.excused == {1: "allowed: report step", 2: "allowed: report step"}
    assert check.failing == ["before", "after"]


def test_steps_without_warmup_excuse_nothing() -> None:
    check = SyncCheck("t", report=_Sites())
    for step in check.steps(range(2)):
        check.report.sites.append(f"s{step}")
    assert check.excused == {}
    assert check.failing == ["s0", "s1"]


def test_steps_accept_a_warmup_of_zero_and_excuse_nothing() -> None:
    check = SyncCheck("t", report=_Sites())
    assert list(check.steps(["a", "b"], warmup=0)) == ["a", "b"]
    assert check.excused == {}


def test_steps_excuse_exactly_warmup_steps_when_every_step_syncs() -> None:
    """warmup=2 excuses steps 0 and 1, not step 2: one site per step, sites 2 and 3 fail."""
    check = SyncCheck("t", report=_Sites())
    for step in check.steps(range(4), warmup=2):
        check.report.sites.append(f"s{step}")
    assert check.excused == {0: "warm-up step 0", 1: "warm-up step 1"}
    assert check.failing == ["s2", "s3"]


def test_a_step_begun_before_the_report_exists_counts_from_its_first_site() -> None:
    """If the guard starts in the middle of a warm-up step (report attached late), that step's sites start at 0."""
    check = SyncCheck("t")
    steps = check.steps(range(2), warmup=1)
    assert next(steps) == 0
    check.report = _Sites("s0")
    assert next(steps) == 1
    check.report.sites.append("s1")
    assert list(steps) == []
    assert check.excused == {0: "warm-up step 0"}
    assert check.failing == ["s1"]


def test_pytest_configure_registers_the_marker_with_its_help() -> None:
    from mentor import pytest_plugin

    lines: list[tuple[str, str]] = []

    class Config:
        def addinivalue_line(self, name: str, line: str) -> None:
            lines.append((name, line))

    pytest_plugin.pytest_configure(Config())  # type: ignore[arg-type]
    assert lines == [("markers", "no_syncs: fail the test if its body syncs with the GPU (mentor.pytest_plugin; "
                                 "excuse a region with mentor.pytest_plugin.allow_syncs)")]


def test_terminal_summary_counts_the_tests_run_without_cuda_and_is_silent_otherwise() -> None:
    """Called in this process with a fake reporter (the inner-pytest tests above see it only in a subprocess)."""
    from types import SimpleNamespace

    from mentor import pytest_plugin

    class Reporter:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def write_line(self, line: str) -> None:
            self.lines.append(line)

    quiet, config = Reporter(), SimpleNamespace(stash=pytest.Stash())
    pytest_plugin.pytest_terminal_summary(quiet, 0, config)  # type: ignore[arg-type]
    assert quiet.lines == []
    config.stash[pytest_plugin._WITHOUT_CUDA] = ["a.py::t1", "b.py::t2"]
    loud = Reporter()
    pytest_plugin.pytest_terminal_summary(loud, 0, config)  # type: ignore[arg-type]
    assert loud.lines == [
        "mentor no_syncs: 2 test(s) ran without a CUDA device, where host-device syncs (.item(), .cpu(), ...) "
        "cannot be seen; only explicit calls (torch.cuda.synchronize, collectives) were watched. "
        "Run them on a GPU machine to check for syncs."]
