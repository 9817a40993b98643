"""The staleness check: whether each notebook's stored run still matches its code, modules and outputs.

A notebook that is not split has one stored run, which covers every code cell. A split notebook
(:func:`nb.hashes.is_split`) has two records, checked apart: its measurement (the top-level record, over the
measuring cells, and the files they wrote), which only a GPU run or a waiver renews, and its render
(``render``, over the presenting cells), which any machine renews (:func:`nb.render.render`)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from nb.book import _executed, display_path, reads_of
from nb.hashes import (HASH_SCHEME, changed_modules, code_cells, code_hash, is_split, measure_digest, mentor_hash,
                       mentor_sources, outputs_hash, sources_digest, stored_scheme)
from nb.outputs import figures_without_images, forbidden
from nb.render import results_problems, stamp


_SOURCES_CHANGED = "the mentor source it imports changed since its stored GPU run"
_CODE_CHANGED = "code cells changed since its stored GPU run"
MEASURE_CODE_CHANGED = "its measuring cells changed since its measurement"
MEASURE_SOURCES_CHANGED = "the mentor source its measuring cells import changed since its measurement"


def _run_reasons(nb: NotebookNode, meta: dict, package: str | None = None) -> list[str]:
    """Why the stored run in ``meta`` does not match ``nb``, waiver not applied (empty when it matches)."""
    reasons = forbidden(nb) + figures_without_images(nb)
    if not nb.cells:
        reasons.append("has no cells")
    if meta.get("code_sha256") is None:
        reasons.append("has no stored GPU run (metadata.mentor.code_sha256 is missing)")
        return reasons
    if meta["code_sha256"] != code_hash(nb, stored_scheme(meta)):
        reasons.append(_CODE_CHANGED)
    recorded = meta.get("mentor_sources")
    if recorded is not None:
        changed = changed_modules(recorded, mentor_sources(nb, scheme=stored_scheme(meta)))
        if changed:
            reasons.append(f"{_SOURCES_CHANGED} ({', '.join('mentor/' + f for f in changed)})")
    elif meta.get("mentor_sha256") != (mentor_hash() if package is None else package):
        reasons.append("the mentor package changed since its stored GPU run" if meta.get("mentor_sha256")
                       else "its stored GPU run does not record the mentor source it ran with")
    if meta.get("outputs_sha256") != outputs_hash(nb):
        reasons.append("its outputs were edited after its stored GPU run" if meta.get("outputs_sha256")
                       else "its stored GPU run does not record a hash of its outputs")
    return reasons


def _apply_waiver(nb: NotebookNode, meta: dict, reasons: list[str], name: str) -> list[str]:
    """``reasons`` with the mentor change removed when the notebook's waiver accepts exactly that change.

    A waiver that accepts another change, or one left behind when nothing changed, is a reason of its own.
    """
    waiver = meta.get("waiver")
    if not waiver:
        return reasons
    sources = [r for r in reasons if r.startswith(_SOURCES_CHANGED)]
    if not sources:
        if meta.get("code_sha256") is not None and meta.get("mentor_sources") is not None:
            return reasons + ["carries a waiver, but the mentor modules it imports are unchanged since its stored "
                              "run: remove metadata.mentor.waiver"]
        return reasons
    current = mentor_sources(nb, scheme=stored_scheme(meta))
    if waiver.get("scheme"):  # the code it can run, hashed when the waiver was written (nb.waivers.waive)
        accepted = waiver.get("accepts") == sources_digest(mentor_sources(nb, scheme=waiver["scheme"]))
    else:  # a waiver written before: the modules' hashes by the run's own scheme
        accepted = (waiver.get("accepts") == sources_digest(current)
                    and waiver.get("modules") == changed_modules(meta["mentor_sources"], current))
    if accepted:
        renames = waiver.get("renames") or {}
        renamed_only = bool(renames) and code_hash(unrenamed(nb, renames), stored_scheme(meta)) == meta.get("code_sha256")
        return [r for r in reasons if r not in sources and not (r == _CODE_CHANGED and renamed_only)]
    return [r + f", and its waiver ({waiver.get('reason')!r}) accepts another change (waive this one with "
            f"python scripts/nbtools.py waive {name} --reason ...)" if r in sources else r for r in reasons]


def read_after(nb_path: Path, meta: dict) -> list[str]:
    """Why ``nb_path``'s stored run (metadata ``meta``) did not read the current runs of the notebooks it reads.

    ``gpu-run`` records, in ``meta["read"]``, the ``executed`` time of each notebook it read as it found it; each
    must still be that notebook's stored run. A run stored without that record must at least be newer than each.
    Notebooks beside it that are missing or unreadable are left to their own check.
    """
    executed = meta.get("executed")
    if executed is None:
        return []
    folder = Path(nb_path).parent
    recorded = meta.get("read")
    problems = []
    for other in reads_of(nb_path):
        when = _executed(folder / other)
        if when is None:
            continue
        if recorded is not None:
            if recorded.get(other) != when:
                problems.append(f"it read the stored run of {other} from {recorded.get(other) or 'nowhere'}, and that "
                                f"notebook's stored run is now from {when}; rerun it after {other}")
        elif dt.datetime.fromisoformat(when) > dt.datetime.fromisoformat(executed):
            problems.append(f"its stored run ({executed}) is older than the stored run of {other} ({when}), "
                            f"whose results it reads; rerun it after {other}")
    return problems


def measurement_reasons(nb: NotebookNode, meta: dict, folder: Path, name: str) -> list[str]:
    """Why the stored measurement of split notebook ``nb`` (in ``folder``) no longer matches it, its waiver
    applied: its measuring cells or the modules they import changed (unless a waiver accepts exactly that
    change), their outputs were edited, or a file it wrote changed or went missing."""
    if not code_cells(nb, "measure"):
        return []  # a page whose cells all present: nothing to measure
    if meta.get("code_sha256") is None:
        return ["has no stored measurement (metadata.mentor.code_sha256 is missing)"]
    scheme = stored_scheme(meta)
    changes = []
    if meta["code_sha256"] != code_hash(nb, scheme, "measure"):
        changes.append(MEASURE_CODE_CHANGED)
    modules = changed_modules(meta.get("mentor_sources") or {}, mentor_sources(nb, scheme=scheme, scope="measure"))
    if modules:
        changes.append(f"{MEASURE_SOURCES_CHANGED} ({', '.join('mentor/' + m for m in modules)})")
    problems = []
    waiver = meta.get("waiver")
    if waiver and not changes:
        problems.append("carries a waiver, but its measuring cells and the modules they import are unchanged since "
                        "its measurement: remove metadata.mentor.waiver")
    elif waiver and waiver.get("accepts") == measure_digest(nb, waiver.get("scheme", scheme)):
        changes = []
    elif waiver:
        changes = [c + f", and its waiver ({waiver.get('reason')!r}) accepts another change (waive this one with "
                   f"python scripts/nbtools.py waive {name} --reason ...)" for c in changes]
    if meta.get("outputs_sha256") != outputs_hash(nb, "measure"):
        problems.append("the outputs of its measuring cells were edited after its measurement")
    return changes + problems + results_problems(folder, meta)


def render_reasons(nb: NotebookNode, meta: dict, nb_path: Path) -> list[str]:
    """Why the stored render of split notebook ``nb`` (at ``nb_path``) is not the render of its current
    presenting cells, of the modules they import, of its measurement and of the notebooks it reads."""
    done = meta.get("render")
    if done is None:
        return ["has no stored render of its presenting cells"]
    scheme = done.get("hash_scheme", HASH_SCHEME)
    reasons = []
    if done.get("code_sha256") != code_hash(nb, scheme, "present"):
        reasons.append("its presenting cells changed since its render")
    modules = changed_modules(done.get("mentor_sources") or {}, mentor_sources(nb, scheme=scheme, scope="present"))
    if modules:
        reasons.append("the mentor source its presenting cells import changed since its render "
                       f"({', '.join('mentor/' + m for m in modules)})")
    if done.get("outputs_sha256") != outputs_hash(nb, "present"):
        reasons.append("the outputs of its presenting cells were edited after its render")
    if done.get("measured") != meta.get("executed"):
        reasons.append(f"it was rendered from the measurement of {done.get('measured') or 'nowhere'}, and its "
                       f"measurement is now from {meta.get('executed') or 'nowhere'}")
    folder = Path(nb_path).parent
    for other in reads_of(nb_path):
        now = stamp(folder / other)
        if (done.get("read") or {}).get(other) != now:
            reasons.append(f"it was rendered from the stored run of {other} from "
                           f"{(done.get('read') or {}).get(other) or 'nowhere'}, and that notebook's stored run is "
                           f"now from {now or 'nowhere'}")
    return reasons


def stale(notebooks: Sequence[Path]) -> list[str]:
    """One message per notebook whose stored GPU run is missing or no longer matches it.

    A stored run matches when its code cells, the ``mentor`` modules it imports and its outputs
    hash as they did when ``gpu-run`` wrote it, no cell skips itself or hides an error, every figure
    was stored with its image, and it ran after the notebooks whose results it reads (:func:`read_after`).
    A waiver (:func:`waive`) accepts one change of the modules: exactly the one it names. A notebook
    that cannot be read gets a message too, and the others are still checked. A split notebook is checked by
    :func:`measurement_reasons` and :func:`render_reasons`, each message naming the command that renews it.
    """
    messages = []
    package = mentor_hash()
    for nb_path in notebooks:
        name = display_path(Path(nb_path))
        refresh = f"refresh it with: make gpu-run NB={name}"
        try:
            nb = nbformat.read(nb_path, as_version=4)
        except FileNotFoundError:
            messages.append(f"{name}: no such notebook; pass the path of a .ipynb file in book/")
            continue
        except Exception as error:  # nbformat raises several types for bad JSON and bad schema
            messages.append(f"{name}: not a readable notebook ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
                            "restore it from git or re-save it from Jupyter")
            continue
        meta = nb.metadata.get("mentor", {})
        if is_split(nb):
            messages.extend(f"{name}: {reason}; fix the notebook" for reason in forbidden(nb) + figures_without_images(nb))
            messages.extend(f"{name}: {reason}; measure it again on a GPU: make gpu-run NB={name} (or, when it needs "
                            f"hardware that is not available, waive it: python scripts/nbtools.py waive {name} "
                            "--reason ...)" for reason in measurement_reasons(nb, meta, Path(nb_path).parent, name))
            messages.extend(f"{name}: {reason}; render it (any machine): python scripts/nbtools.py render {name}"
                            for reason in render_reasons(nb, meta, Path(nb_path)))
            continue
        reasons = _apply_waiver(nb, meta, _run_reasons(nb, meta, package), name) + read_after(Path(nb_path), meta)
        messages.extend(f"{name}: {reason}; {refresh}" for reason in reasons)
    return messages


def unrenamed(nb: NotebookNode, renames: dict[str, str]) -> NotebookNode:
    r"""A copy of ``nb`` whose code cells name every module of ``renames`` ``{old: new}`` by its old name again.

    A new name is replaced where it stands as a whole dotted name (``mentor.lab.env`` in
    ``from mentor.lab.env import x`` or ``mentor.lab.env.get_profile``, not in ``mentor.lab.envs``).

    >>> from nbformat.v4 import new_code_cell, new_notebook
    >>> nb = new_notebook(cells=[new_code_cell("from mentor.lab.env import x\nimport mentor.lab.envs")])
    >>> unrenamed(nb, {"mentor.env": "mentor.lab.env"}).cells[0].source
    'from mentor.env import x\nimport mentor.lab.envs'
    """
    import copy

    out = copy.deepcopy(nb)
    for cell in out.cells:
        if cell.cell_type != "code":
            continue
        source = "".join(cell.source) if isinstance(cell.source, list) else cell.source
        for old, new in renames.items():
            source = re.sub(rf"(?<![\w.]){re.escape(new)}(?![\w])", old, source)
        cell.source = source
    return out
