"""tests/background.py: jobs start in order in one thread with the environment of their start, a test gets a job's
value or its error, and a job that nothing started runs when asked."""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import pytest

import background


def item(name: str, *fixtures: str, module: str = __name__) -> SimpleNamespace:
    """A stand-in for a collected pytest item."""
    return SimpleNamespace(module=SimpleNamespace(__name__=module), originalname=name, fixturenames=list(fixtures))


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch):
    """background's registry emptied for one test, its pool shut down after it."""
    for name, value in (("_JOBS", {}), ("_FUTURES", {}), ("_SECONDS", {}), ("_POOL", None), ("_SCRATCH", [])):
        monkeypatch.setattr(background, name, value)
    yield background
    background.shutdown()


def test_jobs_run_in_order_in_one_thread_with_the_environment_of_their_start(fresh, monkeypatch) -> None:
    ran, gate = [], threading.Event()

    def first(env):
        gate.wait(10)  # the test changes os.environ meanwhile
        ran.append(("first", env["BG_MARK"], threading.current_thread().name))
        return 1

    def second(env):
        ran.append(("second", env["BG_MARK"], threading.current_thread().name))
        raise ValueError("second failed")

    def elsewhere(env):
        ran.append(("elsewhere",))

    def unused(env):
        ran.append(("unused",))

    keys = [fresh.job(first, "test_a"), fresh.job(second, "records")]
    unused_key = fresh.job(unused, "test_b")
    elsewhere.__module__ = "another_module"
    other = fresh.job(elsewhere, "test_a")
    monkeypatch.setenv("BG_MARK", "at start")
    assert fresh.start([item("test_a"), item("test_c", "tmp_path", "records"), item("test_b", module="x")]) == keys
    monkeypatch.setenv("BG_MARK", "changed by a test")
    gate.set()
    assert fresh.result(keys[0]) == 1
    with pytest.raises(ValueError, match="second failed"):
        fresh.result(keys[1])
    assert [r[:2] for r in ran] == [("first", "at start"), ("second", "at start")]
    assert ran[0][2] == ran[1][2] != threading.current_thread().name and ran[0][2].startswith("background-job")
    assert other not in fresh._FUTURES and unused_key not in fresh._FUTURES
    assert ("elsewhere",) not in ran and ("unused",) not in ran
    assert fresh.summary().startswith(f"background jobs: {keys[0]} ") and keys[1] in fresh.summary()


def test_a_job_nothing_started_runs_when_asked_and_once(fresh, monkeypatch) -> None:
    calls = []

    def late(env):
        calls.append(env.get("BG_MARK"))
        return len(calls)

    key = fresh.job(late, "test_late")
    monkeypatch.setenv("BG_MARK", "when asked")
    assert fresh.summary() is None
    assert fresh.result(key) == 1 and fresh.result(key) == 1
    assert calls == ["when asked"]
    assert fresh.start([item("test_late")]) == []  # already done: not run again


def test_an_unregistered_key_and_a_job_without_users_are_refused(fresh) -> None:
    with pytest.raises(KeyError, match="not a registered job"):
        fresh.result("nowhere.job")
    with pytest.raises(ValueError, match="name the tests or fixtures that read"):
        fresh.job(lambda env: None)


def test_run_captures_the_output_as_text_with_the_given_environment(tmp_path) -> None:
    done = background.run(["sh", "-c", "echo $BG_MARK; pwd"], {**os.environ, "BG_MARK": "given"}, timeout=30,
                          cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.split() == ["given", str(tmp_path)]


def test_scratch_folders_go_at_shutdown(fresh) -> None:
    folders = [fresh.scratch("bg-test-"), fresh.scratch("bg-test-")]
    (folders[0] / "file").write_text("x")
    assert folders[0] != folders[1] and all(f.is_dir() for f in folders)
    fresh.shutdown()
    assert not any(f.exists() for f in folders)
