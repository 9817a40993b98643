"""Executing notebooks: a CPU smoke run in a copy, and the in-place GPU run that stores provenance."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from nb.book import BOOK, COPY_IGNORE, REPO, display_path
from nb.hashes import code_cells
from nb.outputs import forbidden


KERNEL = "python3"
TIMEOUT_S = 600


ANSI = re.compile(r"\x1b\[[0-9;]*m")


class NotebookFailed(RuntimeError):
    """A notebook raised an error (or timed out) in one of its cells."""


@contextlib.contextmanager
def kernel_env(**values: str) -> Iterator[None]:
    """Set environment variables (inherited by kernels started inside) and restore them afterwards."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def execute_notebook(nb: NotebookNode, cwd: Path, name: str, timeout: int = TIMEOUT_S,
                     env: dict[str, str] | None = None, fork: bool = False) -> float:
    """Execute ``nb`` in place in a fresh ``python3`` kernel started in ``cwd``; return the seconds taken.

    Raises NotebookFailed naming ``name`` and the failing cell. The kernel gets ``env`` (default:
    os.environ, read now), with the repository root prepended to PYTHONPATH so that ``import mentor``
    works anywhere; os.environ itself is left alone, so notebooks can run in several threads at once.
    With ``fork``, a notebook that imports torch (or a package that does) gets a kernel forked from a process that
    has imported torch once (:mod:`nb.zygote`): for the CPU smoke runs and the renders, never for a run that
    measures.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellControlSignal, CellExecutionError, CellTimeoutError, DeadKernelError

    kernel = dict(os.environ if env is None else env)
    kernel["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), kernel.get("PYTHONPATH", "")) if p)
    extra = {}
    if fork:
        from nb import zygote

        if zygote.imports_torch([cell.source for cell in nb.cells if cell.get("cell_type") == "code"]):
            extra["kernel_manager_class"] = zygote.kernel_manager(kernel)
    current: dict[str, int] = {}
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=KERNEL,
        resources={"metadata": {"path": str(cwd)}},
        on_cell_execute=lambda cell, cell_index: current.update(index=cell_index),
        **extra,
    )
    start = time.perf_counter()
    try:
        client.execute(env=kernel)
    except (CellExecutionError, CellTimeoutError, DeadKernelError, CellControlSignal) as error:
        index = current.get("index")
        if index is None:
            raise NotebookFailed(f"{name}: the kernel failed before any cell ran: {error}") from error
        first_line = next(iter(nb.cells[index].source.strip().splitlines()), "")
        detail = ANSI.sub("", str(error))
        raise NotebookFailed(
            f"{name}: cell {index} (starts with {first_line!r}) failed: {type(error).__name__}\n{detail}"
        ) from error
    return time.perf_counter() - start


def execute_scope(nb: NotebookNode, scope: str, cwd: Path, name: str, timeout: int = TIMEOUT_S,
                  env: dict[str, str] | None = None, fork: bool = False) -> float:
    """Execute only the code cells of ``scope`` (``"measure"`` or ``"present"``, see :func:`nb.hashes.code_cells`)
    of ``nb``, in order, in one fresh kernel; their outputs and execution counts replace those in ``nb``, and the
    other cells keep theirs. Returns the seconds taken (see :func:`execute_notebook`; cell numbers in its
    errors are ``nb``'s)."""
    import copy

    chosen = {id(cell) for cell in code_cells(nb, scope)}
    work = copy.deepcopy(nb)
    for mine, cell in zip(nb.cells, work.cells):
        if cell.get("cell_type") == "code" and id(mine) not in chosen:
            cell.source, cell.outputs = "", []  # nbclient runs nothing for an empty cell
    seconds = execute_notebook(work, cwd, name, timeout, env, fork)
    for mine, done in zip(nb.cells, work.cells):
        if id(mine) in chosen:
            mine.outputs, mine.execution_count = done.outputs, done.execution_count
    return seconds


def smoke_each(notebooks: Sequence[Path], book: Path = BOOK, workdir: Path | None = None,
               jobs: int = 1) -> dict[Path, float | NotebookFailed]:
    """Execute each notebook with MENTOR_PROFILE=smoke in its own copy of ``book`` (in ``workdir`` or a temp dir),
    ``jobs`` at a time; returns, per notebook as given, its seconds or the NotebookFailed that stopped it.

    Nothing under ``book`` is modified. With ``jobs`` 1 the notebooks run one after the other in one copy (a
    later one sees the files an earlier one wrote) and the first failure ends the run, so later notebooks are
    missing from the result; with ``jobs`` > 1 each runs in a copy of its own, and each kernel gets
    ``OMP_NUM_THREADS=1`` (unless set), so that the kernels share the cores instead of each taking all of them.
    """
    from concurrent.futures import ThreadPoolExecutor

    book = book.resolve()
    for nb_path in notebooks:
        if not Path(nb_path).is_file():
            raise NotebookFailed(f"{nb_path}: no such notebook; pass the path of a .ipynb file in {display_path(book)}/")
        try:
            Path(nb_path).resolve().relative_to(book)
        except ValueError:
            raise ValueError(f"{nb_path} is not inside {book}; smoke runs notebooks of that folder") from None
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a whole number of notebooks to run at once, >= 1, not {jobs!r}")
    env = {**os.environ, "MENTOR_PROFILE": "smoke"}
    if jobs > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nbsmoke-")))
        if jobs == 1:  # one copy for all, as a sequential run in place would see it
            shutil.copytree(book, Path(workdir) / book.name, ignore=COPY_IGNORE)

        def one(index: int, nb_path: Path) -> float | NotebookFailed:
            rel = Path(nb_path).resolve().relative_to(book)
            copy = Path(workdir) / book.name
            if jobs > 1:  # a copy of its own: notebooks running at once must not see each other's files
                copy = Path(workdir) / f"{index:02d}" / book.name
                shutil.copytree(book, copy, ignore=COPY_IGNORE)
            target = copy / rel
            nb = nbformat.read(target, as_version=4)
            problems = forbidden(nb)
            if problems:
                return NotebookFailed(f"{display_path(book / rel)}: " + "; ".join(problems))
            try:
                return execute_notebook(nb, target.parent, display_path(book / rel), env=env, fork=True)
            except NotebookFailed as error:
                return error

        if jobs == 1:
            outcomes: dict[Path, float | NotebookFailed] = {}
            for index, nb_path in enumerate(notebooks):
                outcomes[nb_path] = one(index, nb_path)
                if isinstance(outcomes[nb_path], NotebookFailed):
                    break
            return outcomes
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return dict(zip(notebooks, pool.map(one, range(len(notebooks)), notebooks)))


def smoke(notebooks: Sequence[Path], book: Path = BOOK, workdir: Path | None = None,
          jobs: int = 1) -> list[tuple[str, float]]:
    """Execute each notebook with MENTOR_PROFILE=smoke in a copy of ``book`` (in ``workdir`` or a temp dir).

    Nothing under ``book`` is modified. Returns (name, seconds) per notebook; raises the first NotebookFailed
    (see :func:`smoke_each` for ``jobs``).
    """
    results = []
    for nb_path, outcome in smoke_each(notebooks, book, workdir, jobs).items():
        if isinstance(outcome, NotebookFailed):
            raise outcome
        results.append((display_path(Path(nb_path).resolve()), outcome))
    return results


def require_installed_mentor() -> None:
    """Raise NotebookFailed unless ``mentor`` is installed in this Python with its pytest plugin registered.

    Chapter 11 runs pytest inside the notebook, and pytest loads the ``no_syncs`` plugin through the entry
    point that ``pip install`` writes; a checkout that is only on ``PYTHONPATH`` has none, and the chapter's
    tests would stop at "fixture 'no_syncs' not found".
    """
    from importlib.metadata import entry_points

    if not [ep for ep in entry_points(group="pytest11") if ep.name == "mentor"]:
        raise NotebookFailed(
            "mentor is not installed in this Python, so pytest would not load its no_syncs plugin (chapter 11 "
            "needs it); install it first: python -m pip install --no-deps --no-build-isolation -e . "
            "(or make gpu-run, which uses .venv)")
