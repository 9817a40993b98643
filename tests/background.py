"""Jobs that tests wait for, started in the background once the tests are collected.

On two cores, a test that starts a process importing torch holds the session for every second that process takes.
Started early, beside the other tests, the same process costs the session only a share of a core. A test module
registers each such job at import, ``KEY = background.job(fn, *users)``: ``fn`` takes the environment and
usually runs a subprocess with it; ``users`` names the tests and fixtures of that module that read it. Once the
tests are collected, ``tests/conftest.py`` calls :func:`start` with the selected tests: the jobs that one of them
uses run one after the other in one thread, in the order they were registered (so a job that no selected test
uses, under ``-m "not subprocess"`` say, costs nothing). A test calls ``result(KEY)``: it waits for the job and
returns its value or raises its error; a job that nothing started runs there and then.

A job runs beside other tests, so it must not read what a test may change meanwhile: it gets a copy of the
environment made at :func:`start` (``env``), never ``os.environ``, and it must not rely on monkeypatching.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

_JOBS: dict[str, tuple[str, frozenset[str], Callable[[dict[str, str]], Any]]] = {}
_FUTURES: dict[str, Future] = {}
_SECONDS: dict[str, float] = {}
_POOL: ThreadPoolExecutor | None = None
_SCRATCH: list[str] = []
_LOCK = threading.Lock()


def job(fn: Callable[[dict[str, str]], Any], *users: str) -> str:
    """Register ``fn(env)`` as a job of the module that defines it, used by the tests or fixtures ``users`` of that
    module; returns the key :func:`result` takes."""
    if not users:
        raise ValueError(f"name the tests or fixtures that read {fn.__qualname__}, so that it starts only for them")
    key = f"{fn.__module__}.{fn.__qualname__}"
    _JOBS[key] = (fn.__module__, frozenset(users), fn)
    return key


def _timed(key: str, fn: Callable[[dict[str, str]], Any], env: dict[str, str]) -> Any:
    begin = time.monotonic()
    try:
        return fn(env)
    finally:
        _SECONDS[key] = time.monotonic() - begin


def scratch(prefix: str) -> Path:
    """A new folder for a job's files, removed by :func:`shutdown` at the end of the session."""
    path = tempfile.mkdtemp(prefix=prefix)
    _SCRATCH.append(path)
    return Path(path)


def run(argv: list[str], env: dict[str, str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run`` of ``argv`` with ``env``, its output captured as text: what most jobs do."""
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, **kwargs)


def _uses(item: Any, module: str, users: frozenset[str]) -> bool:
    """Whether pytest item ``item`` is a test of ``module`` that is, or asks for a fixture, among ``users``."""
    mine = getattr(getattr(item, "module", None), "__name__", None) == module
    return mine and (getattr(item, "originalname", None) in users or bool(users & set(getattr(item, "fixturenames", ()))))


def start(items: Iterable[Any], env: dict[str, str] | None = None) -> list[str]:
    """Start, in one background thread, the registered jobs that the pytest ``items`` use, in order; returns their
    keys."""
    global _POOL
    items = list(items)
    env = dict(os.environ if env is None else env)
    with _LOCK:
        keys = [key for key, (module, users, _) in _JOBS.items()
                if key not in _FUTURES and any(_uses(item, module, users) for item in items)]
        if keys and _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="background-job")
        for key in keys:
            _FUTURES[key] = _POOL.submit(_timed, key, _JOBS[key][2], env)
    return keys


def result(key: str) -> Any:
    """The value of job ``key`` (waiting for it), or the error it raised; run it now if nothing started it."""
    if key not in _JOBS:
        raise KeyError(f"{key!r} is not a registered job: register it with background.job at import")
    with _LOCK:
        future = _FUTURES.get(key)
        if future is None:
            future = _FUTURES[key] = Future()
            mine = True
        else:
            mine = False
    if mine:
        try:
            future.set_result(_timed(key, _JOBS[key][2], dict(os.environ)))
        except BaseException as error:  # noqa: BLE001 - kept for every test that asks, as a started job's is
            future.set_exception(error)
    return future.result()


def summary() -> str | None:
    """One line: each job that ran and its seconds, or None if none ran."""
    if not _SECONDS:
        return None
    return "background jobs: " + ", ".join(f"{key} {seconds:.0f} s" for key, seconds in _SECONDS.items())


def shutdown() -> None:
    """Cancel the jobs not started yet, wait for the one running (its subprocess ends with its timeout) and remove
    the jobs' :func:`scratch` folders."""
    global _POOL
    if _POOL is not None:
        _POOL.shutdown(wait=True, cancel_futures=True)
        _POOL = None
    while _SCRATCH:
        shutil.rmtree(_SCRATCH.pop(), ignore_errors=True)
