"""mentor.pytest_plugin: the no_syncs marker and fixture, allow_syncs and warm-up steps, run in inner pytest sessions.

On this CPU machine the check watches the explicit synchronizing calls that sync_guard wraps; a
one-rank gloo group's collectives are such calls, so they stand in for syncs here. The CUDA path
(.item() and friends) is tested by the ``@gpu`` test at the end (run with `pytest -m gpu`). Each inner pytest
run is a subprocess: an inline run re-imports hypothesis and torch's extension modules, which crashes the
interpreter.

Each subprocess imports torch (seconds), so the inner tests share sessions: a module-scoped fixture
writes one folder of inner tests per outer test and runs all of them in one inner session (SHARED),
reading each folder's outcomes from the ``-rA`` summary and what pytest reported about its tests
(every phase's failure or error text, captured output) from a JUnit XML report. The outer tests that
check the session's own terminal summary, which counts the watched tests of the whole session, or its
command line (``-p mentor.pytest_plugin`` beside the installed entry point) read a session of their own
(ALONE). The four sessions run at the same time. Two more, whose conftest records what the process imported,
show what loading the plugin costs a session that never uses it (no torch) and that one that does still works.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
import torch

from marks import NO_CUDA, gpu
from mentor.pytest_plugin import SyncCheck, allow_syncs

pytest_plugins = ["pytester"]  # the @gpu test's inner session

# A tiny "training code" module: a step that makes one collective call (a sync the guard sees on CPU),
# a step that makes none, and a group fixture.
HELPERS = """
import pytest
import torch
import torch.distributed as dist
from mentor.lab.ddp import single_rank_group
from mentor.pytest_plugin import allow_syncs

@pytest.fixture
def group():
    with single_rank_group("gloo"):
        yield

def log_loss(loss):
    dist.all_reduce(loss)          # the hidden sync: line 13 of conftest.py (written with the first newline stripped)

def clean_step(x):
    return x * 2

def chatty_step(x):
    log_loss(x)
    return x * 2
"""

# The inner tests run in one session, one folder (a package, so that each can hold its test_x.py) per outer test.
SHARED = {
    "marker_fails": """
import pytest, torch
from conftest import chatty_step

@pytest.mark.no_syncs
def test_step(group):
    chatty_step(torch.ones(2))
""",
    "fixture_excuses": """
import torch
from conftest import chatty_step, clean_step

def test_warm_up_only(no_syncs, group):
    for step in no_syncs.steps(range(5), warmup=2):
        (chatty_step if step < 2 else clean_step)(torch.ones(2))

def test_syncs_after_warm_up(no_syncs, group):
    for step in no_syncs.steps(range(4), warmup=2):
        (chatty_step if step == 2 else clean_step)(torch.ones(2))
""",
    "allow_syncs": """
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
""",
    "own_error_first": """
import pytest, torch
from conftest import chatty_step

@pytest.mark.no_syncs
def test_step(group):
    chatty_step(torch.ones(2))
    assert 1 == 2, "the test's own failure"
""",
    "guard_gone": """
import pytest, torch, torch.distributed as dist
from conftest import chatty_step

real_all_reduce = dist.all_reduce

@pytest.mark.no_syncs
def test_first(group):
    assert dist.all_reduce is not real_all_reduce

def test_second(group):
    assert dist.all_reduce is real_all_reduce
""",
    # a real torch.cuda.synchronize(): without a CUDA device torch's call raises (the outer test runs there only)
    "cuda_call_without_cuda": """
import pytest, torch
from mentor.pytest_plugin import allow_syncs

@pytest.mark.no_syncs
def test_synchronize():
    torch.cuda.synchronize()

@pytest.mark.no_syncs
def test_synchronize_allowed():
    with allow_syncs("a deliberate wait"):
        torch.cuda.synchronize()
""",
}

# Inner tests that each need a session of their own: the outer test reads the session's terminal summary.
ALONE = {
    "marker_passes": """
import pytest, torch
from conftest import clean_step

@pytest.mark.no_syncs
def test_step(group):
    assert clean_step(torch.ones(2)).tolist() == [2.0, 2.0]
""",
    "unmarked": """
import torch
from conftest import chatty_step

def test_step(group):
    chatty_step(torch.ones(2))
""",
    # run with -p mentor.pytest_plugin, beside the entry point that registers the plugin as "mentor"
    "named_twice": """
import pytest, torch
from conftest import clean_step

@pytest.mark.no_syncs
def test_passes(group):
    assert clean_step(torch.ones(2)).tolist() == [2.0, 2.0]

def test_raises(no_syncs, group):
    clean_step(torch.ones(2))
    raise KeyError("the body raised")
""",
}
ALONE_ARGS = {"named_twice": ("-p", "mentor.pytest_plugin")}

_OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (?:\[(\d+)\] )?(\S+)")
_KEYS = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors", "SKIPPED": "skipped", "XFAIL": "xfailed",
         "XPASS": "xpassed"}


def _write(path: Path, source: str) -> None:
    """Write ``source`` as pytester's makepyfile does: dedented, without leading and trailing blank lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source).strip(), encoding="utf-8")


def _start(folder: Path, *args: str) -> tuple[subprocess.Popen, Path, Path]:
    """Start ``python -m pytest -p no:cacheprovider *args`` in ``folder``, in the environment pytester gives it."""
    env = dict(os.environ, PY_COLORS="0", HOME=str(folder), USERPROFILE=str(folder))
    for name in ("PYTEST_ADDOPTS", "TOX_ENV_DIR"):
        env.pop(name, None)
    out, err = folder / "stdout.txt", folder / "stderr.txt"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "pytest", f"--basetemp={folder / 'basetemp'}", "-p", "no:cacheprovider", *args],
            cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)
    return process, out, err


@dataclass
class Shared:
    """The shared inner session: its whole output, its JUnit report and each folder's share of both."""

    result: pytest.RunResult
    junit: ET.Element

    def outcomes(self, folder: str) -> dict[str, int]:
        """The folder's outcomes, counted from the -rA summary as assert_outcomes counts the whole session's."""
        counts = dict.fromkeys(_KEYS.values(), 0)
        for line in self.result.outlines:
            match = _OUTCOME.match(line)
            if match and match[3].startswith(f"{folder}/"):
                counts[_KEYS[match[1]]] += int(match[2] or 1)
        return counts

    def reported(self, folder: str) -> pytest.LineMatcher:
        """Everything pytest reported about the folder's tests: the text of each failure, error and skip, and
        the captured output, in the order of the JUnit report."""
        lines = []
        cases = [c for c in self.junit.iter("testcase") if c.get("classname", "").startswith(f"{folder}.")]
        assert cases, f"no test of {folder}/ in the JUnit report"
        for case in cases:
            for part in case:
                lines += (part.get("message") or "").splitlines() + (part.text or "").splitlines()
        return pytest.LineMatcher(lines)


def _outcomes(**counts: int) -> dict[str, int]:
    return dict(dict.fromkeys(_KEYS.values(), 0), **counts)


@pytest.fixture(scope="module")
def inner(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Run the shared session and the two sessions of their own at the same time; return their results."""
    runs = {}
    shared = tmp_path_factory.mktemp("shared")
    _write(shared / "conftest.py", HELPERS)
    for folder, source in SHARED.items():
        _write(shared / folder / "__init__.py", "")
        _write(shared / folder / "test_x.py", source)
    runs["shared"] = _start(shared, "-rA", f"--junitxml={shared / 'junit.xml'}", "-o", "junit_logging=all")
    for name, source in ALONE.items():
        folder = tmp_path_factory.mktemp(name)
        _write(folder / "conftest.py", HELPERS)
        _write(folder / "test_x.py", source)
        runs[name] = _start(folder, *ALONE_ARGS.get(name, ()))
    began, results = time.monotonic(), {}
    for name, (process, out, err) in runs.items():
        ret = process.wait(timeout=600)
        results[name] = pytest.RunResult(ret, out.read_text().splitlines(), err.read_text().splitlines(),
                                         time.monotonic() - began)
    results["shared"] = Shared(results["shared"], ET.parse(shared / "junit.xml").getroot())
    return results


def test_plugin_is_registered_by_the_package_entry_point() -> None:
    """`pip install -e .` makes pytest load the plugin: the pytest11 entry point names the module."""
    points = {p.name: p.value for p in metadata.entry_points(group="pytest11")}
    assert points.get("mentor") == "mentor.pytest_plugin"


@pytest.mark.subprocess
def test_marker_fails_a_test_that_syncs_and_names_the_line(inner: dict) -> None:
    shared = inner["shared"]
    assert shared.outcomes("marker_fails") == _outcomes(failed=1)
    shared.reported("marker_fails").fnmatch_lines([
        "*test_x.py::test_step: 1 synchronizing call under the no_syncs check:",
        "*1x  *conftest.py:13  in log_loss()  <- *conftest.py:13  [[]collective: all_reduce[]]",
        "*allow_syncs*",
    ])


@pytest.mark.subprocess
def test_marker_passes_a_test_without_syncs_and_says_what_cpu_cannot_see(inner: dict) -> None:
    result = inner["marker_passes"]
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["mentor no_syncs: 1 test(s) ran without a CUDA device*only explicit calls*"])


@pytest.mark.subprocess
def test_unmarked_tests_are_not_watched(inner: dict) -> None:
    result = inner["unmarked"]
    result.assert_outcomes(passed=1)
    assert "mentor no_syncs" not in result.stdout.str()


@pytest.mark.subprocess
def test_fixture_excuses_warm_up_steps_only(inner: dict) -> None:
    """warmup=2 excuses the syncs of steps 0 and 1; step 2 syncs and the test fails with 1 call, 2 excused."""
    shared = inner["shared"]
    assert shared.outcomes("fixture_excuses") == _outcomes(passed=1, failed=1)
    shared.reported("fixture_excuses").fnmatch_lines([
        "*test_x.py::test_syncs_after_warm_up: 1 synchronizing call under the no_syncs check*",
    ])
    assert "test_warm_up_only: " not in shared.reported("fixture_excuses").str()
    assert "test_warm_up_only: " not in shared.result.stdout.str()  # nor anywhere in the session's output


@pytest.mark.subprocess
def test_allow_syncs_excuses_its_block_and_counts_it(inner: dict) -> None:
    shared = inner["shared"]
    assert shared.outcomes("allow_syncs") == _outcomes(passed=1, failed=1)
    shared.reported("allow_syncs").fnmatch_lines([
        "*test_one_allowed_two_not: 2 synchronizing calls under the no_syncs check "
        "(1 more excused by warm-up or allow_syncs):",
        "*2x  *conftest.py:13  in log_loss()*",
    ])


@pytest.mark.subprocess
def test_a_failing_test_reports_its_own_error_first(inner: dict) -> None:
    shared = inner["shared"]
    assert shared.outcomes("own_error_first") == _outcomes(failed=1)
    assert "the test's own failure" in shared.reported("own_error_first").str()
    assert "under the no_syncs check" not in shared.reported("own_error_first").str()


@pytest.mark.subprocess
def test_the_guard_is_gone_after_the_test(inner: dict) -> None:
    """The wrappers are removed when the watched test ends: a later unmarked test's collective runs unwatched."""
    assert inner["shared"].outcomes("guard_gone") == _outcomes(passed=2)


@pytest.mark.subprocess
def test_naming_the_plugin_with_p_beside_its_entry_point_loads_it_once(inner: dict) -> None:
    """`-p mentor.pytest_plugin` registered the module under its own name before pytest loaded the entry point
    `mentor`, the same module, and pluggy refused it: "Plugin already registered under a different name"."""
    assert any(point.name == "mentor" for point in metadata.entry_points(group="pytest11"))  # else nothing to test
    result = inner["named_twice"]
    assert "already registered" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["mentor no_syncs: 2 test(s) ran without a CUDA device*"])


@pytest.mark.parametrize("entry_point_first", [False, True], ids=["module name first", "entry point first"])
def test_the_module_name_and_the_entry_point_name_register_the_plugin_once(entry_point_first: bool) -> None:
    """In a plugin manager of its own, as pytest loads plugins: by the entry point's name (autoload, or `-p mentor`)
    and by the module's (`-p mentor.pytest_plugin` before autoload; a conftest's pytest_plugins or PYTEST_PLUGINS
    after it). The second way found the module registered under the other name and stopped pytest."""
    from mentor import pytest_plugin

    manager = pytest.PytestPluginManager()

    def by_module() -> None:  # what -p mentor.pytest_plugin, pytest_plugins and PYTEST_PLUGINS call
        manager.import_plugin("mentor.pytest_plugin", consider_entry_points=True)

    def by_entry_point() -> None:  # pytest's autoload, restricted to this entry point
        manager.load_setuptools_entrypoints("pytest11", name="mentor")

    for load in ((by_entry_point, by_module) if entry_point_first else (by_module, by_entry_point)):
        load()
    first, second = ("mentor", "mentor.pytest_plugin") if entry_point_first else ("mentor.pytest_plugin", "mentor")
    assert manager.get_plugin(first) is pytest_plugin
    assert repr(manager.get_plugin(second)) == f"<mentor.pytest_plugin, registered as {first!r}>"
    assert [name for name, plugin in manager.list_name_plugin() if plugin is pytest_plugin] == [first]


@pytest.mark.subprocess
@pytest.mark.skipif(not NO_CUDA, reason="torch.cuda.synchronize() raises only where torch sees no CUDA device")
def test_a_cuda_call_without_cuda_fails_with_the_checks_message_and_line(inner: dict) -> None:
    """The watched call is recorded, then torch's raises for want of a device: the test fails with the check's
    message naming the call's line, not torch's driver error (which an excused call still raises)."""
    try:
        torch.cuda.synchronize()
        torch_error = ""
    except Exception as err:  # noqa: BLE001 - what torch says here: no driver, or no CUDA build
        torch_error = str(err)
    shared = inner["shared"]
    assert shared.outcomes("cuda_call_without_cuda") == _outcomes(failed=2)
    reported = shared.reported("cuda_call_without_cuda")
    reported.fnmatch_lines([
        "*test_x.py::test_synchronize: 1 synchronizing call under the no_syncs check:",
        "*1x  *test_x.py:6  in test_synchronize()  <- *test_x.py:6  [[]torch.cuda.synchronize[]]",
        "Remove the sync, or excuse it with `with mentor.pytest_plugin.allow_syncs(\"why\"):`.",
        "Without a CUDA device torch cannot make the torch.cuda.synchronize call at *test_x.py:6: it raised there "
        "and ended the test.",
    ])
    text = {case.get("name"): " ".join((part.get("message") or "") + (part.text or "") for part in case)
            for case in shared.junit.iter("testcase")
            if case.get("classname", "").startswith("cuda_call_without_cuda.")}
    assert torch_error and torch_error not in text["test_synchronize"]
    assert torch_error in text["test_synchronize_allowed"] and "no_syncs check" not in text["test_synchronize_allowed"]


# ----------------------------------------------------------------------------------------------------------
# What loading the plugin costs: pytest loads it in every session of an environment where mentor is installed

# The conftest of the two sessions below: at the session's very end it writes what the process imported, and
# whether the plugin was registered and its marker declared (the session ran with the plugin, not without it).
RECORDER = """
import json, sys
from pathlib import Path

def pytest_unconfigure(config):
    plugin = sys.modules.get("mentor.pytest_plugin")
    Path(__file__).with_name("imported.json").write_text(json.dumps({
        "modules": sorted(sys.modules),
        "registered": plugin is not None and any(p is plugin for p in config.pluginmanager.get_plugins()),
        "marker": any(line.startswith("no_syncs:") for line in config.getini("markers")),
    }))
"""

# Tests that import nothing themselves: whatever torch and mentor the session imports, the plugin imported.
UNWATCHED = """
def test_plain():
    assert sorted([3, 1, 2]) == [1, 2, 3]
"""

WATCHED = """
import pytest

@pytest.mark.no_syncs
def test_clean():
    assert sorted([3, 1, 2]) == [1, 2, 3]

def test_waits(no_syncs):
    import torch
    torch.cuda.synchronize()   # recorded by the check on any machine (without CUDA torch's call then raises)
"""


@pytest.fixture(scope="module")
def plugin_sessions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[pytest.RunResult, dict]]:
    """Two inner sessions, run at the same time, each with the plugin named on the command line: one whose test uses
    neither the marker nor the fixture, one whose tests use both. Each: (its result, what its process imported)."""
    runs = {}
    for name, source in (("unwatched", UNWATCHED), ("watched", WATCHED)):
        folder = tmp_path_factory.mktemp(name)
        _write(folder / "conftest.py", RECORDER)
        _write(folder / "test_x.py", source)
        runs[name] = (folder, *_start(folder, "-p", "mentor.pytest_plugin"))
    began, sessions = time.monotonic(), {}
    for name, (folder, process, out, err) in runs.items():
        ret = process.wait(timeout=600)
        result = pytest.RunResult(ret, out.read_text().splitlines(), err.read_text().splitlines(),
                                  time.monotonic() - began)
        recorded = folder / "imported.json"
        assert recorded.is_file(), f"the {name} session wrote no imported.json:\n{result.stdout.str()}\n{result.stderr.str()}"
        sessions[name] = (result, json.loads(recorded.read_text()))
    return sessions


def _heavy(modules: list[str]) -> list[str]:
    """The modules of ``modules`` that loading the plugin must not cost: torch, torchmetrics, tqdm, triton, and every
    mentor module but the package and the plugin."""
    return [m for m in modules if m.split(".")[0] in ("torch", "torchmetrics", "tqdm", "triton")
            or (m.startswith("mentor.") and m != "mentor.pytest_plugin")]


@pytest.mark.subprocess
def test_a_session_that_never_uses_the_check_imports_neither_torch_nor_mentors_other_modules(
        plugin_sessions: dict) -> None:
    result, imported = plugin_sessions["unwatched"]
    result.assert_outcomes(passed=1)
    assert imported["registered"] and imported["marker"], imported  # the plugin was loaded: the check below counts
    assert "mentor.pytest_plugin" in imported["modules"]
    assert _heavy(imported["modules"]) == []


@pytest.mark.subprocess
def test_a_session_that_uses_the_check_imports_torch_then_and_still_fails_a_sync(plugin_sessions: dict) -> None:
    """The same plugin, asked for: the marker and the fixture work, and the check imported torch and mentor.syncs
    (the tests import nothing at their top), so the recorder above sees what a lazy import leaves behind."""
    result, imported = plugin_sessions["watched"]
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*test_x.py::test_waits: 1 synchronizing call under the no_syncs check:",
        "*1x  *test_x.py:9  in test_waits()  <- *test_x.py:9  [[]torch.cuda.synchronize[]]",
    ])
    assert imported["registered"] and imported["marker"], imported
    assert {"torch", "mentor.syncs"} <= set(_heavy(imported["modules"]))


def test_a_watched_test_whose_body_raises_is_counted_in_the_summary() -> None:
    """The hook added the test to the summary's count after its body: a body that raised was left out."""
    from types import SimpleNamespace

    from mentor import pytest_plugin

    item = SimpleNamespace(nodeid="t.py::test_raises", stash=pytest.Stash(), fixturenames=("no_syncs",),
                           config=SimpleNamespace(stash=pytest.Stash()), get_closest_marker=lambda name: None)
    hook = pytest_plugin.pytest_runtest_call(item)  # the wrapper, driven as pluggy drives it
    next(hook)
    with pytest.raises(KeyError, match=r"^'the body raised'$"):
        hook.throw(KeyError("the body raised"))
    assert item.config.stash.get(pytest_plugin._WITHOUT_CUDA, []) == (["t.py::test_raises"] if NO_CUDA else [])


def test_stopped_by_names_the_cuda_call_that_raised_for_want_of_a_device() -> None:
    from mentor.syncs import SyncReport, SyncSite

    site = SyncSite("/home/me/train.py", 12, "step", (("/home/me/train.py", 12, "step"),), "torch.cuda.synchronize")
    collective = SyncSite("/home/me/train.py", 14, "step", (("/home/me/train.py", 14, "step"),),
                          "collective: all_reduce")
    error, other = RuntimeError("Found no NVIDIA driver on your system."), RuntimeError("Found no NVIDIA driver")
    check = SyncCheck("t.py::test_step", report=SyncReport([site, collective]))
    check._failed(0, "torch.cuda.synchronize", error)
    check._failed(1, "collective: all_reduce", other)
    assert check.stopped_by(error) == (
        "t.py::test_step: 2 synchronizing calls under the no_syncs check:\n"
        "  1x  /home/me/train.py:12  in step()  <- /home/me/train.py:12  [torch.cuda.synchronize]\n"
        "  1x  /home/me/train.py:14  in step()  <- /home/me/train.py:14  [collective: all_reduce]\n"
        "Remove the sync, or excuse it with `with mentor.pytest_plugin.allow_syncs(\"why\"):`.\n"
        "Without a CUDA device torch cannot make the torch.cuda.synchronize call at /home/me/train.py:12: it raised "
        "there and ended the test.")
    assert check.stopped_by(RuntimeError("Found no NVIDIA driver on your system.")) == ""  # another error object
    assert check.stopped_by(other) == ""  # a collective's error is the test's own: collectives run without CUDA
    check.excused[0] = "allowed: a deliberate wait"
    assert check.stopped_by(error) == ""  # excused: torch's error is the test's own
    check.excused.clear()
    check.cuda = True
    assert check.stopped_by(error) == ""  # with CUDA the call does not raise for want of one


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
    """A stand-in for mentor.syncs.SyncReport: only its list of sites is read by SyncCheck."""

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


# ----------------------------------------------------------------------------------------------------------
# On CUDA: a real .item() in a reader's training code, in a pytester session


GPU_STEP = '''
import torch

model = torch.nn.Linear(8, 4).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
history = []

def log(loss):
    history.append({LOG})

def train_step(x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    log(loss)
'''

GPU_TEST = '''
import torch
from training import train_step

def test_step_never_waits(no_syncs):
    x, y = torch.randn(16, 8, device="cuda"), torch.randint(0, 4, (16,), device="cuda")
    for _ in no_syncs.steps(range(3), warmup=1):
        train_step(x, y)
'''


@gpu
def test_an_item_in_a_logging_helper_fails_with_its_line_then_passes_after_the_fix(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(training=GPU_STEP.replace("{LOG}", "loss.item()"), test_step=GPU_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    # steps 1 and 2 each read the loss once; step 0 is warm-up
    result.stdout.fnmatch_lines(["*test_step_never_waits: 2 synchronizing calls under the no_syncs check "
                                 "(* more excused by warm-up or allow_syncs):",
                                 "*2x  *training.py:8  in log()*"])

    pytester.makepyfile(training=GPU_STEP.replace("{LOG}", "loss.detach()"))
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
