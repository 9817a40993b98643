#!/usr/bin/env python3
"""Run and check the book's notebooks: a CPU smoke run, the in-place GPU run, and a staleness check.

    python scripts/nbtools.py smoke [NB ...]    # execute copies with MENTOR_PROFILE=smoke; the repo is untouched
    python scripts/nbtools.py gpu-run [NB ...]  # execute in place with MENTOR_PROFILE=full and store provenance
    python scripts/nbtools.py check [NB ...]    # fail if code changed since a notebook's stored GPU run

Without NB, every book/*.ipynb is used, sorted; gpu-run executes book/reproducibility.ipynb last.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import nbformat
from nbformat import NotebookNode

REPO = Path(__file__).resolve().parent.parent
BOOK = REPO / "book"
LAST = "reproducibility.ipynb"
"""Reads the other notebooks' stored metadata, so gpu-run executes it after them."""
CELL_SEPARATOR = "\n# ---- next code cell ----\n"
KERNEL = "python3"
TIMEOUT_S = 600
COPY_IGNORE = shutil.ignore_patterns(".ipynb_checkpoints", "_out", "__pycache__")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class NotebookFailed(RuntimeError):
    """A notebook raised an error (or timed out) in one of its cells."""


def display_path(path: Path) -> str:
    """``path`` relative to the repository when inside it, else as given."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def default_notebooks(book: Path = BOOK) -> list[Path]:
    """Every notebook directly in ``book``, sorted by name."""
    return sorted(book.glob("*.ipynb"))


def toc_files(toc: Path = REPO / "_toc.yml") -> list[str]:
    """Every file entry of a jb-book ``_toc.yml`` (root first), as written there: no suffix."""
    import yaml

    def walk(node: object) -> Iterator[str]:
        if isinstance(node, dict):
            if "file" in node:
                yield str(node["file"])
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    data = yaml.safe_load(toc.read_text())
    return [str(data["root"]), *walk({k: v for k, v in data.items() if k != "root"})]


def toc_source(entry: str, root: Path = REPO) -> Path | None:
    """The .ipynb or .md file a toc entry names, or None when neither exists."""
    for suffix in (".ipynb", ".md"):
        path = root / (entry + suffix)
        if path.is_file():
            return path
    return None


def run_order(notebooks: Sequence[Path]) -> list[Path]:
    """``notebooks`` in the given order, with reproducibility.ipynb moved to the end."""
    return sorted(notebooks, key=lambda p: p.name == LAST)


def code_hash(nb: NotebookNode) -> str:
    """SHA-256 of the code cells' sources (trailing whitespace stripped); outputs, metadata and markdown don't count."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        source = "".join(cell.source) if isinstance(cell.source, list) else cell.source
        cells.append("\n".join(line.rstrip() for line in source.splitlines()))
    return hashlib.sha256(CELL_SEPARATOR.join(cells).encode()).hexdigest()


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


def execute_notebook(nb: NotebookNode, cwd: Path, name: str, timeout: int = TIMEOUT_S) -> float:
    """Execute ``nb`` in place in a fresh ``python3`` kernel started in ``cwd``; return the seconds taken.

    Raises NotebookFailed naming ``name`` and the failing cell. The kernel inherits os.environ,
    with the repository root prepended to PYTHONPATH so that ``import mentor`` works anywhere.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellControlSignal, CellExecutionError, CellTimeoutError, DeadKernelError

    current: dict[str, int] = {}
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=KERNEL,
        resources={"metadata": {"path": str(cwd)}},
        on_cell_execute=lambda cell, cell_index: current.update(index=cell_index),
    )
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    start = time.perf_counter()
    try:
        with kernel_env(PYTHONPATH=path):
            client.execute()
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


def smoke(notebooks: Sequence[Path], book: Path = BOOK, workdir: Path | None = None) -> list[tuple[str, float]]:
    """Execute each notebook with MENTOR_PROFILE=smoke in a copy of ``book`` (in ``workdir`` or a temp dir).

    Nothing under ``book`` is modified. Returns (name, seconds) per notebook; raises NotebookFailed.
    """
    book = book.resolve()
    relative = []
    for nb_path in notebooks:
        try:
            relative.append(Path(nb_path).resolve().relative_to(book))
        except ValueError:
            raise ValueError(f"{nb_path} is not inside {book}; smoke runs notebooks of that folder") from None
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nbsmoke-")))
        copy = Path(workdir) / book.name
        shutil.copytree(book, copy, ignore=COPY_IGNORE)
        results = []
        with kernel_env(MENTOR_PROFILE="smoke"):
            for rel in relative:
                target = copy / rel
                nb = nbformat.read(target, as_version=4)
                seconds = execute_notebook(nb, target.parent, display_path(book / rel))
                results.append((display_path(book / rel), seconds))
        return results


def gpu_run(notebooks: Sequence[Path]) -> list[tuple[str, float]]:
    """Execute each notebook in place (cwd: its folder) and write it back with outputs and provenance.

    MENTOR_PROFILE defaults to ``full``; reproducibility.ipynb runs last. Returns (name, seconds).
    """
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from mentor.env import environment_report

    results = []
    with kernel_env(MENTOR_PROFILE=os.environ.get("MENTOR_PROFILE") or "full"):
        for nb_path in run_order([Path(p) for p in notebooks]):
            name = display_path(nb_path)
            nb = nbformat.read(nb_path, as_version=4)
            executed = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
            seconds = execute_notebook(nb, nb_path.resolve().parent, name)
            nb.metadata["mentor"] = {
                "provenance": environment_report(),
                "executed": executed,
                "duration_s": round(seconds, 3),
                "code_sha256": code_hash(nb),
            }
            nbformat.write(nb, nb_path)
            print(f"{name}: {seconds:.1f} s", flush=True)
            results.append((name, seconds))
    return results


def stale(notebooks: Sequence[Path]) -> list[str]:
    """One message per notebook whose code differs from (or has no) stored GPU run."""
    messages = []
    for nb_path in notebooks:
        name = display_path(Path(nb_path))
        nb = nbformat.read(nb_path, as_version=4)
        stored = nb.metadata.get("mentor", {}).get("code_sha256")
        if stored is None:
            reason = "has no stored GPU run (metadata.mentor.code_sha256 is missing)"
        elif stored != code_hash(nb):
            reason = "code cells changed since its stored GPU run"
        else:
            continue
        messages.append(f"{name}: {reason}; refresh it with: make gpu-run NB={name}")
    return messages


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for command, text in [
        ("smoke", "execute copies on the CPU (MENTOR_PROFILE=smoke); fail on any error"),
        ("gpu-run", "execute in place (MENTOR_PROFILE=full) and store outputs and provenance"),
        ("check", "fail if a notebook's code changed since its stored GPU run"),
    ]:
        sub = commands.add_parser(command, help=text, description=text)
        sub.add_argument("notebooks", nargs="*", type=Path, metavar="NB", help="default: every book/*.ipynb")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or default_notebooks()
    if not notebooks:
        print(f"no notebooks given and none in {display_path(BOOK)}/", file=sys.stderr)
        return 1
    try:
        if args.command == "smoke":
            for name, seconds in smoke(notebooks):
                print(f"{name}: ok ({seconds:.1f} s)")
        elif args.command == "gpu-run":
            gpu_run(notebooks)
        else:
            messages = stale(notebooks)
            for message in messages:
                print(message)
            if messages:
                return 1
            print(f"ok: {len(notebooks)} notebook(s) match their stored GPU run")
    except NotebookFailed as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
