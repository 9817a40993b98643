"""A pytest plugin that fails a test when the code under it makes the host wait for the GPU.

``pip install mentor`` registers it (entry point ``pytest11``), so pytest loads it by itself and
a test asks for the check in one of two ways:

- the ``no_syncs`` marker watches the whole test function;
- the ``no_syncs`` fixture does the same and adds :meth:`SyncCheck.steps`, which leaves the
  first steps of a loop unwatched (warm-up, lazy initialisation).

Code under test can excuse a region with :func:`allow_syncs` (``with allow_syncs("why"):``); the
excuse costs nothing when no check is running, so it can stay in a reader's training code.

The watching is :func:`mentor.syncs.sync_guard` (not strict: every sync is recorded, and the
test fails after its body ran, with one line per ``file:line``); its docstring lists what it
sees and what it cannot. Without a CUDA device there is no host-device sync to see: the check then
watches only the explicit calls that ``sync_guard`` wraps (``torch.cuda.synchronize``, the
``torch.distributed`` collectives, ...), and pytest's summary says so. There a watched
``torch.cuda.synchronize()`` (or an ``Event``'s, a ``Stream``'s, ``torch.accelerator.synchronize()``)
is still recorded and still called, and torch's call raises for want of a device; when that error
ends the test and the call was not excused, the test fails with the check's message, which names
the call's ``file:line``, instead of torch's driver error.

pytest loads the plugin in every session of an environment where mentor is installed, so a session that never
asks for the check pays only for this small module: it imports torch and :mod:`mentor.syncs` when a test uses the
marker or the fixture (inside :func:`watching` and :meth:`SyncCheck.message`), not before.

pytest loads the plugin under its entry point's name, ``mentor`` (disable it with ``-p no:mentor``).
Naming the module as well (``-p mentor.pytest_plugin``, or ``pytest_plugins = ["mentor.pytest_plugin"]``
in a conftest) is harmless: the first registration stands in for the plugin under the other name too,
so that pytest does not register the module twice (it refuses a module already registered under
another name).

Example, in a reader's ``tests/test_step.py``::

    import pytest
    from mentor.pytest_plugin import allow_syncs

    def test_training_step_never_waits(no_syncs, setup, batches):
        for batch in no_syncs.steps(batches, warmup=1):   # the first step may sync (cuDNN autotuning)
            train_step(setup, batch)

    @pytest.mark.no_syncs
    def test_report_reads_once(metrics):
        with allow_syncs("the report step reads its values back once"):
            metrics.read()
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

# No torch and no other mentor module at the top: they are imported where a watched test needs them.

MARKER = "no_syncs"
ENTRY_POINT = "mentor"
"""The name of the plugin's ``pytest11`` entry point (pyproject.toml), under which pytest loads it by itself."""
_NEEDS_CUDA = ("torch.cuda.synchronize", "Event.synchronize", "Stream.synchronize", "torch.accelerator.synchronize")
"""Kinds of watched calls that raise where torch sees no CUDA device (mentor.syncs' names for them)."""
_ACTIVE: list[SyncCheck] = []
"""The checks watching right now (innermost last): the sync guard they run is process-wide too."""


@dataclass
class SyncCheck:
    """The syncs seen under one test's ``no_syncs`` check, and which of them are excused.

    ``report`` is the :class:`mentor.syncs.SyncReport` of every sync seen; ``excused`` maps
    the index of a site in ``report.sites`` to why it does not fail the test. The ``no_syncs``
    fixture returns the check of the running test.

    Example:
        >>> import torch
        >>> check = SyncCheck("test_demo")
        >>> with watching(check):                    # what the plugin does around a test's body
        ...     with check.allow("a deliberate wait"):
        ...         torch.cuda.synchronize() if torch.cuda.is_available() else None
        >>> check.failing, check.message()
        ([], '')
    """

    test: str
    report: Any = None
    excused: dict[int, str] = field(default_factory=dict)
    cuda: bool = False
    failed_calls: list[tuple[int, str, Exception]] = field(default_factory=list, repr=False)
    """(site index, kind, error) of each watched call whose original raised (without CUDA: torch's error)."""

    def _failed(self, index: int, kind: str, error: Exception) -> None:
        self.failed_calls.append((index, kind, error))

    def stopped_by(self, error: BaseException) -> str:
        """The check's message for a test that ``error`` ended, when ``error`` is what an unexcused watched
        CUDA call raised for want of a CUDA device (empty otherwise: the test's own error is the one to report).

        Example:
            >>> check = SyncCheck("test_demo")
            >>> check.stopped_by(RuntimeError("Found no NVIDIA driver on your system."))
            ''
        """
        if self.cuda:
            return ""
        for index, kind, failed in self.failed_calls:
            if failed is error and kind in _NEEDS_CUDA and index not in self.excused:
                where = self.report.sites[index].where
                return (f"{self.message()}\nWithout a CUDA device torch cannot make the {kind} call at {where}: "
                        "it raised there and ended the test.")
        return ""

    def _excuse(self, start: int, reason: str) -> None:
        if self.report is not None:
            for index in range(start, len(self.report.sites)):
                self.excused.setdefault(index, reason)

    def _mark(self) -> int:
        return 0 if self.report is None else len(self.report.sites)

    @contextlib.contextmanager
    def allow(self, reason: str) -> Iterator[None]:
        """Excuse the syncs of the block, for ``reason``: the same as :func:`allow_syncs`."""
        start = self._mark()
        try:
            yield
        finally:
            self._excuse(start, f"allowed: {reason}")

    def steps(self, iterable: Iterable[Any], warmup: int = 0) -> Iterator[Any]:
        """Yield from ``iterable``, excusing the syncs of the first ``warmup`` iterations.

        A step's syncs are those made between yielding its item and asking for the next one.

        Example:
            >>> check = SyncCheck("demo")
            >>> list(check.steps(["a", "b", "c"], warmup=1))
            ['a', 'b', 'c']
        """
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be a whole number of steps >= 0, not {warmup!r}.")
        for index, item in enumerate(iterable):
            start = self._mark()
            try:
                yield item
            finally:
                if index < warmup:
                    self._excuse(start, f"warm-up step {index}")

    @property
    def failing(self) -> list[Any]:
        """The sites that fail the test: every sync seen that nothing excused."""
        if self.report is None:
            return []
        return [site for index, site in enumerate(self.report.sites) if index not in self.excused]

    def message(self) -> str:
        """Why the test fails: how many syncs, and one line per ``file:line`` (empty when none fail)."""
        from mentor.syncs import SyncReport

        failing = self.failing
        if not failing:
            return ""
        excused = f" ({len(self.excused)} more excused by warm-up or allow_syncs)" if self.excused else ""
        noun = "call" if len(failing) == 1 else "calls"
        return (f"{self.test}: {len(failing)} synchronizing {noun} under the no_syncs check{excused}:\n"
                f"{SyncReport(sites=failing).table()}\n"
                "Remove the sync, or excuse it with `with mentor.pytest_plugin.allow_syncs(\"why\"):`.")


@contextlib.contextmanager
def allow_syncs(reason: str) -> Iterator[None]:
    """Excuse the syncs made inside the block from every running ``no_syncs`` check.

    With no check running it does nothing, so it can stay in training code. Syncs made by other
    threads while the block runs are excused too (the guard cannot tell the threads' windows apart).

    Example:
        >>> with allow_syncs("the report step reads its values once"):
        ...     pass
    """
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(f"allow_syncs needs a reason, as a non-empty string, not {reason!r}: "
                         "say why the sync is fine.")
    with contextlib.ExitStack() as stack:
        for check in list(_ACTIVE):
            stack.enter_context(check.allow(reason))
        yield


@contextlib.contextmanager
def watching(check: SyncCheck) -> Iterator[SyncCheck]:
    """Run the sync guard for ``check`` while the block runs (the plugin does this around a test's body).

    With CUDA this is :func:`mentor.syncs.sync_guard`; without it only the Python-level calls are
    watched (``torch.cuda.synchronize``, collectives), and ``check.cuda`` is False.

    Example:
        >>> check = SyncCheck("test_demo")
        >>> with watching(check):
        ...     pass
        >>> check.report.count
        0
    """
    import torch

    from mentor.syncs import SyncReport, _intercept, sync_guard

    check.cuda = torch.cuda.is_available()
    guard = sync_guard() if check.cuda else _intercept(SyncReport(), on_error=check._failed)
    with guard as report:
        check.report = report
        _ACTIVE.append(check)
        try:
            yield check
        finally:
            _ACTIVE.remove(check)


_CHECK = pytest.StashKey[SyncCheck]()


@pytest.fixture
def no_syncs(request: pytest.FixtureRequest) -> SyncCheck:
    """Fail this test if its body makes the host wait for the GPU; see :mod:`mentor.pytest_plugin`.

    Example (a test in your suite; ``train_step``, ``setup`` and ``batches`` are yours):
        >>> def test_training_step_never_waits(no_syncs, setup, batches):    # doctest: +SKIP
        ...     for batch in no_syncs.steps(batches, warmup=1):
        ...         train_step(setup, batch)
    """
    return request.node.stash.setdefault(_CHECK, SyncCheck(request.node.nodeid))


class _OtherName:
    """Registered under the plugin's other name (entry point or module), so that pytest skips loading it twice."""

    def __init__(self, registered_as: str) -> None:
        self.registered_as = registered_as

    def __repr__(self) -> str:
        return f"<mentor.pytest_plugin, registered as {self.registered_as!r}>"


def pytest_plugin_registered(plugin: object, plugin_name: str, manager: pytest.PytestPluginManager) -> None:
    """When this module is registered, a stand-in takes its other name, so that both ways of loading it work.

    pytest loads the entry point ``mentor`` unless a plugin of that name is registered or blocked
    (pluggy's ``load_setuptools_entrypoints``), and imports ``-p mentor.pytest_plugin`` or a
    conftest's ``pytest_plugins`` entry unless that name is (``PytestPluginManager.import_plugin``);
    either way the second registration of the same module would raise "Plugin already registered
    under a different name" (pluggy's ``register``) and stop pytest.
    """
    if plugin is not sys.modules[__name__]:
        return
    for name in (ENTRY_POINT, __name__):
        if name != plugin_name and manager.get_plugin(name) is None and not manager.is_blocked(name):
            manager.register(_OtherName(plugin_name), name=name)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: fail the test if its body syncs with the GPU (mentor.pytest_plugin; "
                   "excuse a region with mentor.pytest_plugin.allow_syncs)")


_WITHOUT_CUDA = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    tests = config.stash.get(_WITHOUT_CUDA, [])
    if tests:
        terminalreporter.write_line(
            f"mentor no_syncs: {len(tests)} test(s) ran without a CUDA device, where host-device syncs "
            "(.item(), .cpu(), ...) cannot be seen; only explicit calls (torch.cuda.synchronize, collectives) "
            "were watched. Run them on a GPU machine to check for syncs.")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    if item.get_closest_marker(MARKER) is None and "no_syncs" not in getattr(item, "fixturenames", ()):
        return (yield)
    check = item.stash.setdefault(_CHECK, SyncCheck(item.nodeid))
    stopped = ""
    with watching(check):
        if not check.cuda:  # counted before the body runs: a body that raises was watched too
            item.config.stash.setdefault(_WITHOUT_CUDA, []).append(item.nodeid)
        try:
            result = yield  # a failing test raises here: its own error is the one to report,
        except Exception as error:
            stopped = check.stopped_by(error)  # unless it is torch's, raised by a watched CUDA call without CUDA
            if not stopped:
                raise
    if stopped:  # outside the except block: torch's error is not shown as the failure's context
        pytest.fail(stopped, pytrace=False)
    message = check.message()
    if message:
        pytest.fail(message, pytrace=False)
    return result
