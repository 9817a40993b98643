"""Rendering a split notebook from its stored measurement, on any machine, and checking that a render is current.

A split notebook (:func:`nb.hashes.is_split`) has two kinds of code cells. Its measuring cells (tagged
``measure``) run on the GPU machine (``gpu-run``), write what they measured under ``book/results/`` (or
``book/traces/``) and keep the outputs of that run. Its presenting cells (every other code cell) draw the tables,
figures and glued words from those files alone: :func:`render` re-executes them, and only them, on whatever
machine runs it, the CPU included, and stores their outputs with a record of the render
(``metadata.mentor.render``). :func:`render_differences` renders a copy and says where the stored outputs differ
from it, which is how ``make test`` keeps a figure from drifting from its data.

The stored record of a split notebook (``metadata.mentor``) is the measurement's, as ``gpu-run`` has always
written it, with ``scope: "measure"`` (its hashes cover the measuring cells only) and ``results``, the SHA-256 of
each file its measuring cells wrote; beside it, ``render``.
"""

from __future__ import annotations

import copy
import datetime as dt
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nbformat
from nbformat import NotebookNode

from nb.book import BOOK, COPY_IGNORE, REPO, display_path, reads_of
from nb.hashes import (HASH_SCHEME, code_cells, code_hash, file_hash, is_measure, is_split, mentor_sources,
                       outputs_hash)
from nb.outputs import drop_hidden_stderr, shorten_paths
from nb.runs import NotebookFailed, execute_scope

RESULT_FOLDERS = ("results", "traces")
"""The folders beside the notebooks where measuring cells write what they measured."""
PRESENT_ENV = {"CUDA_VISIBLE_DEVICES": "", "PYTHONHASHSEED": "0", "SOURCE_DATE_EPOCH": "0"}
"""What a render's kernel gets on top of the caller's environment (MPLBACKEND removed, so that figures draw
inline): no CUDA device, so that a presenting cell behaves alike on a GPU machine and a laptop; a fixed hash
seed, so that the order of a set it prints does not change between renders; and a fixed date for matplotlib's
SVG metadata (``<dc:date>``, which it takes from ``SOURCE_DATE_EPOCH`` when set, else from the clock)."""


def render_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a render's kernel: ``base`` (default ``os.environ``) with :data:`PRESENT_ENV`, without
    ``MPLBACKEND``.

    >>> env = render_env({"MPLBACKEND": "Agg", "HOME": "/h"})
    >>> sorted(env), env["CUDA_VISIBLE_DEVICES"]
    (['CUDA_VISIBLE_DEVICES', 'HOME', 'PYTHONHASHSEED', 'SOURCE_DATE_EPOCH'], '')
    """
    env = {k: v for k, v in (os.environ if base is None else base).items() if k != "MPLBACKEND"}
    env.update(PRESENT_ENV)
    return env


def result_files(folder: Path, paths: Sequence[str]) -> dict[str, str]:
    """SHA-256 of each file named in ``paths`` (relative to ``folder``, the notebook's; a folder stands for every
    file under it), keyed by its path relative to ``folder``, sorted.

    Raises FileNotFoundError naming a path that is neither a file nor a folder."""
    found: dict[str, str] = {}
    for name in paths:
        path = folder / name
        if path.is_file():
            files = [path]
        elif path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file())
        else:
            raise FileNotFoundError(f"{name} is not a file or folder beside the notebook (in {display_path(folder)}/)"
                                    "; name the results its measuring cells wrote, e.g. results/ch12_sync_cost")
        for file in files:
            found[file.relative_to(folder).as_posix()] = file_hash(file)
    return dict(sorted(found.items()))


def results_problems(folder: Path, meta: dict) -> list[str]:
    """Why the files that a stored measurement wrote (``meta["results"]``) are not what it wrote: missing, or
    changed since (edited by hand, or written by another run)."""
    problems = []
    for name, digest in (meta.get("results") or {}).items():
        path = folder / name
        if not path.is_file():
            problems.append(f"{name}, which its measurement wrote, is missing")
        elif file_hash(path) != digest:
            problems.append(f"{name} changed since its measurement wrote it")
    return problems


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """``(mtime_ns, size)`` of every file under the :data:`RESULT_FOLDERS` of ``folder``, by relative path."""
    seen = {}
    for sub in RESULT_FOLDERS:
        for path in (folder / sub).rglob("*") if (folder / sub).is_dir() else ():
            if path.is_file():
                stat = path.stat()
                seen[path.relative_to(folder).as_posix()] = (stat.st_mtime_ns, stat.st_size)
    return seen


def written_since(folder: Path, before: dict[str, tuple[int, int]]) -> list[str]:
    """The files under the :data:`RESULT_FOLDERS` of ``folder`` that are new or rewritten since ``before``."""
    return sorted(name for name, stat in snapshot(folder).items() if before.get(name) != stat)


def stamp(path: Path) -> str | None:
    """What a page that reads notebook ``path`` read of it: the time of its stored measurement (or run), else None."""
    import json

    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))["metadata"]["mentor"].get("executed")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def git_state(nb_path: Path, nb: NotebookNode) -> dict[str, Any]:
    """The commit a render starts from and what, of what a render depends on, differs from it.

    ``commit`` is ``HEAD`` (None outside a git checkout); ``changes`` lists the uncommitted paths among
    ``mentor/``, ``scripts/`` and ``book/results/``, and the notebook itself when its presenting cells differ
    from the committed ones.
    """
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if head is None:
        return {"commit": None, "changes": []}
    status = git("status", "--porcelain", "--", "mentor", "scripts", "book/results") or ""
    changes = sorted({line[3:].strip() for line in status.splitlines() if line.strip()})
    name = Path(nb_path).resolve().relative_to(REPO).as_posix() if Path(nb_path).resolve().is_relative_to(REPO) else None
    committed = git("show", f"HEAD:{name}") if name else None
    if name and (committed is None or code_hash(nbformat.reads(committed, as_version=4), scope="present")
                 != code_hash(nb, scope="present")):
        changes.append(name)
    return {"commit": head.strip(), "changes": changes}


def _present(nb: NotebookNode, folder: Path, name: str, env: dict[str, str] | None) -> float:
    """Execute the presenting cells of ``nb`` in ``folder`` and clean their outputs as ``gpu-run`` cleans a run's."""
    seconds = execute_scope(nb, "present", folder, name, env=render_env(env), fork=True)
    for cell in code_cells(nb, "present"):
        cell.outputs = coalesce_streams(cell.get("outputs", []))
    drop_hidden_stderr(nb)
    shorten_paths(nb)
    return seconds


def render(nb_path: Path, env: dict[str, str] | None = None) -> float:
    """Re-execute the presenting cells of split notebook ``nb_path`` from its stored measurement, in place (cwd: its
    folder), and store their outputs with a record of the render; returns the seconds taken.

    Raises NotebookFailed when the notebook is not split, when the files its measurement wrote have changed or
    gone, or when a presenting cell fails (a presenting cell that uses what only a measuring cell computed in
    memory fails here: it must read the stored results instead).
    """
    nb_path = Path(nb_path)
    name = display_path(nb_path)
    nb = nbformat.read(nb_path, as_version=4)
    if not is_split(nb):
        raise NotebookFailed(f"{name} is not split into measuring and presenting cells: tag the cells that measure "
                             "'measure' and convert its stored run (python scripts/nbtools.py convert NB --results "
                             "...), or run it whole on a GPU (make gpu-run NB=...)")
    meta = nb.metadata.setdefault("mentor", {})
    meta["scope"] = "measure"
    folder = nb_path.resolve().parent
    problems = results_problems(folder, meta)
    if problems:
        raise NotebookFailed(f"{name}: " + "; ".join(problems) + "; restore them from git, or measure again: "
                             f"make gpu-run NB={name}")
    state = git_state(nb_path, nb)
    rendered = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    read = {other: stamp(folder / other) for other in reads_of(nb_path)}
    seconds = _present(nb, folder, name, env)
    meta["render"] = {
        "rendered": rendered,
        **state,
        "duration_s": round(seconds, 3),
        "hash_scheme": HASH_SCHEME,
        "code_sha256": code_hash(nb, scope="present"),
        "mentor_sources": mentor_sources(nb, scope="present"),
        "measured": meta.get("executed"),
        "read": read,
    }
    nbformat.write(nb, nb_path)
    nb = nbformat.read(nb_path, as_version=4)  # hash the outputs exactly as stored
    nb.metadata["mentor"]["render"]["outputs_sha256"] = outputs_hash(nb, "present")
    nbformat.write(nb, nb_path)
    return seconds


def comparable(outputs: list[Any]) -> list[dict[str, Any]]:
    """Outputs as a render compares them: without execution counts, a stream's text joined into one string.

    >>> from nbformat.v4 import new_output
    >>> comparable([new_output("execute_result", data={"text/plain": "1"}, execution_count=3)]) == [
    ...     {"output_type": "execute_result", "metadata": {}, "data": {"text/plain": "1"}}]
    True
    """
    out: list[dict[str, Any]] = []
    for output in coalesce_streams(outputs):
        item = {k: v for k, v in dict(output).items() if k not in ("execution_count", "transient")}
        out.append(copy.deepcopy(item))
    return out


def coalesce_streams(outputs: list[Any]) -> list[Any]:
    """``outputs`` with each run of consecutive stream outputs of the same name (stdout, stderr) joined into one, its
    text one string. How a kernel cuts a cell's printing into stream messages depends on when it flushes, so the same
    prints can be stored as one output on one machine and as three on another; joined, they compare equal.

    >>> from nbformat.v4 import new_output
    >>> [o["text"] for o in coalesce_streams([new_output("stream", name="stdout", text="a\\n"),
    ...                                       new_output("stream", name="stdout", text=["b\\n", "c"])])]
    ['a\\nb\\nc']
    """
    out: list[Any] = []
    for output in outputs:
        if output.get("output_type") == "stream":
            text = output.get("text", "")
            text = "".join(text) if isinstance(text, list) else text
            last = out[-1] if out else None
            if last is not None and last.get("output_type") == "stream" and last.get("name") == output.get("name"):
                last["text"] += text
                continue
            output = copy.deepcopy(output)
            output["text"] = text
        out.append(output)
    return out


def _first_difference(stored: list[Any], fresh: list[Any]) -> str:
    """A short description of where two comparable output lists first differ."""
    import json

    if len(stored) != len(fresh):
        return f"{len(stored)} stored output(s), {len(fresh)} rendered"
    for a, b in zip(stored, fresh):
        if a != b:
            left, right = json.dumps(a, sort_keys=True), json.dumps(b, sort_keys=True)
            at = next((i for i, (x, y) in enumerate(zip(left, right)) if x != y), min(len(left), len(right)))
            return f"stored …{left[max(0, at - 40):at + 40]}… rendered …{right[max(0, at - 40):at + 40]}…"
    return "equal"


def render_differences(nb_path: Path, book: Path = BOOK, env: dict[str, str] | None = None) -> list[str]:
    """One message per presenting cell of ``nb_path`` whose stored outputs differ from a fresh render (run in a
    temporary copy of ``book``, so nothing in it is written); empty when every output matches."""
    nb_path = Path(nb_path)
    name = display_path(nb_path)
    nb = nbformat.read(nb_path, as_version=4)
    if not is_split(nb):
        return [f"{name}: not split into measuring and presenting cells; nothing to render"]
    with tempfile.TemporaryDirectory(prefix="mentor-render-") as tmp:
        copy_root = Path(tmp) / "book"
        shutil.copytree(Path(book), copy_root, ignore=COPY_IGNORE)
        fresh = copy.deepcopy(nb)
        _present(fresh, copy_root, name, env)
    messages = []
    index = {id(cell): i for i, cell in enumerate(nb.cells)}
    for mine, theirs in zip(code_cells(nb, "present"), code_cells(fresh, "present")):
        a, b = comparable(mine.get("outputs", [])), comparable(theirs.get("outputs", []))
        if a != b:
            messages.append(f"{name}: cell {index[id(mine)]}'s stored outputs differ from a fresh render "
                            f"({_first_difference(a, b)}); render it: python scripts/nbtools.py render {name}")
    return messages


def executed_measure_cells(nb: NotebookNode) -> bool:
    """Whether any measuring cell of ``nb`` holds outputs or an execution count (it has been run)."""
    return any(cell.get("outputs") or cell.get("execution_count") for cell in nb.cells if is_measure(cell))
