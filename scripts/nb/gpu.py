"""The GPU run: execute notebooks in place on the GPU machine and store their outputs with provenance.

A notebook that is not split (:func:`nb.hashes.is_split`) runs whole, and its record covers every code cell. A
split notebook runs its measuring cells only, records what they wrote, and is then rendered
(:func:`nb.render.render`): its presenting cells draw from what was just measured.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nbformat

from nb.book import REPO, _executed, display_path, reads_of, run_order
from nb.hashes import HASH_SCHEME, code_cells, code_hash, is_split, mentor_hash, mentor_sources, outputs_hash
from nb.outputs import drop_hidden_stderr, forbidden, shorten_paths
from nb.render import render, result_files, snapshot, written_since
from nb.runs import NotebookFailed, execute_notebook, execute_scope, kernel_env, require_installed_mentor


def provenance() -> dict[str, Any]:
    """``mentor.lab.env.environment_report()`` of this machine, with the interpreter named by its file name only
    (its full path is the machine's, and would travel in the notebook and its download)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from mentor.lab.env import environment_report

    report = environment_report()
    if report.get("executable"):
        report["executable"] = Path(report["executable"]).name
    return report


def measure(nb_path: Path, env: dict[str, str]) -> float:
    """Run the measuring cells of split notebook ``nb_path`` in place and store the measurement's record
    (``metadata.mentor``: provenance, hashes of the measuring cells, of the modules they import and of their
    outputs, and ``results``, the SHA-256 of each file under ``results/`` or ``traces/`` beside it that the run
    wrote). A stored render is kept, and is stale until the notebook is rendered again. Returns the seconds."""
    name = display_path(nb_path)
    nb = nbformat.read(nb_path, as_version=4)
    folder = nb_path.resolve().parent
    before = snapshot(folder)
    executed = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    seconds = execute_scope(nb, "measure", folder, name, env=env) if code_cells(nb, "measure") else 0.0
    drop_hidden_stderr(nb)
    shorten_paths(nb)
    kept = nb.metadata.get("mentor", {}).get("render")
    nb.metadata["mentor"] = {"scope": "measure"}
    if code_cells(nb, "measure"):
        nb.metadata["mentor"].update({
            "provenance": provenance(),
            "executed": executed,
            "duration_s": round(seconds, 3),
            "hash_scheme": HASH_SCHEME,
            "code_sha256": code_hash(nb, scope="measure"),
            "mentor_sha256": mentor_hash(),
            "mentor_sources": mentor_sources(nb, scope="measure"),
            "results": result_files(folder, written_since(folder, before)),
        })
    if kept is not None:
        nb.metadata["mentor"]["render"] = kept
    nbformat.write(nb, nb_path)
    nb = nbformat.read(nb_path, as_version=4)  # hash the outputs exactly as stored
    if code_cells(nb, "measure"):
        nb.metadata["mentor"]["outputs_sha256"] = outputs_hash(nb, "measure")
        nbformat.write(nb, nb_path)
    return seconds


def gpu_run(notebooks: Sequence[Path]) -> list[tuple[str, float]]:
    """Execute each notebook in place (cwd: its folder) and write it back with outputs and provenance: a split
    notebook is measured (:func:`measure`) and rendered, any other runs whole.

    MENTOR_PROFILE defaults to ``full``; reproducibility.ipynb runs last. Returns (name, seconds).
    """
    require_installed_mentor()
    # the kernels draw figures with ipykernel's inline backend: another MPLBACKEND (Agg, say) would store each
    # figure as its text repr only
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    env["MENTOR_PROFILE"] = os.environ.get("MENTOR_PROFILE") or "full"
    results = []
    with kernel_env(MENTOR_PROFILE=env["MENTOR_PROFILE"]):
        for nb_path in run_order([Path(p) for p in notebooks]):
            name = display_path(nb_path)
            nb = nbformat.read(nb_path, as_version=4)
            problems = forbidden(nb)
            if problems:
                raise NotebookFailed(f"{name}: " + "; ".join(problems))
            if is_split(nb):
                seconds = measure(nb_path, env)
                seconds += render(nb_path, env=env)
            else:
                seconds = _run_whole(nb_path, nb, env)
            print(f"{name}: {seconds:.1f} s", flush=True)
            results.append((name, seconds))
    return results


def _run_whole(nb_path: Path, nb: nbformat.NotebookNode, env: dict[str, str]) -> float:
    """Execute a notebook that is not split, every cell, and store its record (the record covers every cell)."""
    name = display_path(nb_path)
    executed = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    read = {other: _executed(nb_path.parent / other) for other in reads_of(nb_path)}
    seconds = execute_notebook(nb, nb_path.resolve().parent, name, env=env)
    drop_hidden_stderr(nb)
    shorten_paths(nb)
    nb.metadata["mentor"] = {
        "provenance": provenance(),
        "executed": executed,
        "duration_s": round(seconds, 3),
        "hash_scheme": HASH_SCHEME,
        "code_sha256": code_hash(nb),
        "mentor_sha256": mentor_hash(),
        "mentor_sources": mentor_sources(nb),
    }
    if read:  # the runs of the notebooks it read, as it found them (see read_after)
        nb.metadata["mentor"]["read"] = read
    nbformat.write(nb, nb_path)
    nb = nbformat.read(nb_path, as_version=4)  # hash the outputs exactly as stored
    nb.metadata["mentor"]["outputs_sha256"] = outputs_hash(nb)
    nbformat.write(nb, nb_path)
    return seconds
