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
``torch.distributed`` collectives, ...), and pytest's summary says so.

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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

MARKER = "no_syncs"
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
        raise ValueError(f"allow_syncs needs a reason, as a non-empty string, not {reason!r}: say why the sync is fine.")
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
    guard = sync_guard() if check.cuda else _intercept(SyncReport())
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
    with watching(check):
        result = yield  # a failing test raises here: its own error is the one to report
    if not check.cuda:
        item.config.stash.setdefault(_WITHOUT_CUDA, []).append(item.nodeid)
    message = check.message()
    if message:
        pytest.fail(message, pytrace=False)
    return result
