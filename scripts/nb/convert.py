"""Splitting a notebook's current stored run into a measurement and a render, without running it again.

A notebook whose stored GPU run still matches its code (or matches it under a waiver) holds, in the outputs of
the cells that measured, a real measurement. Once those cells are tagged ``measure``, :func:`convert` turns the
run's record into the record of that measurement: its hashes now cover the measuring cells only, and
``results`` names the files those cells wrote. Its presenting cells can then be changed and rendered on any
machine (:func:`nb.render.render`); the measurement stands until its own cells or modules change.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import nbformat

from nb.book import display_path
from nb.check import _apply_waiver, _run_reasons, unrenamed
from nb.hashes import (HASH_SCHEME, changed_modules, code_cells, code_hash, is_measure, measure_digest, mentor_sources,
                       outputs_hash, stored_scheme)
from nb.render import result_files


class ConversionRefused(ValueError):
    """``convert`` cannot split the notebook's stored run (it is not current, or already split)."""


def convert(nb_path: Path, results: Sequence[str] = ()) -> dict:
    """Split the current stored run of ``nb_path`` into the record of its measurement; returns the new record.

    The cells tagged ``measure`` are the measurement: the record keeps the run's provenance, date and duration,
    hashes their code (as it ran: a waiver's renames are undone), the ``mentor`` modules they import (as the run
    recorded them) and their outputs, and the files named in ``results`` (paths beside the notebook; a folder
    stands for its files), which those cells wrote. A waiver of the run becomes a waiver of the measurement, for
    the same reason. A notebook with no measuring cell (a page that only presents what other chapters measured)
    keeps no measurement. Refused when the stored run does not match the notebook, or when it is split already.
    """
    nb_path = Path(nb_path)
    name = display_path(nb_path)
    nb = nbformat.read(nb_path, as_version=4)
    meta = dict(nb.metadata.get("mentor", {}))
    if meta.get("scope") == "measure":
        raise ConversionRefused(f"{name} is split already; render it with python scripts/nbtools.py render {name}")
    reasons = _apply_waiver(nb, meta, _run_reasons(nb, meta), name)
    if reasons:
        raise ConversionRefused(f"{name}: only a current stored run can be split, and this one: {'; '.join(reasons)}")
    converted = {"from_run": meta.get("executed"),
                 "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    if not code_cells(nb, "measure"):
        if results:
            raise ConversionRefused(f"{name} has no cell tagged 'measure', so no measurement wrote {', '.join(results)}")
        record = {"scope": "measure", "converted": converted}
    else:
        scheme = stored_scheme(meta)
        waiver = meta.get("waiver")
        ran = unrenamed(nb, waiver.get("renames") or {}) if waiver else nb
        current = mentor_sources(nb, scheme=scheme, scope="measure")
        recorded = meta["mentor_sources"]
        record = {key: meta[key] for key in ("provenance", "executed", "duration_s", "mentor_sha256") if key in meta}
        if record.get("provenance", {}).get("executable"):
            record["provenance"] = {**record["provenance"],
                                    "executable": Path(record["provenance"]["executable"]).name}
        record.update({
            "scope": "measure",
            "hash_scheme": scheme,
            "code_sha256": code_hash(ran, scheme, "measure"),
            "mentor_sources": recorded if waiver else {m: recorded[m] for m in current},
            "outputs_sha256": outputs_hash(nb, "measure"),
            "results": result_files(nb_path.resolve().parent, results),
            "converted": converted,
        })
        if waiver:
            modules = changed_modules(recorded, current)
            record["waiver"] = {**waiver, "modules": modules,
                                "added": [m for m in modules if m not in recorded],
                                "removed": [m for m in modules if m not in current],
                                "cells_changed": record["code_sha256"] != code_hash(nb, scheme, "measure"),
                                "scheme": HASH_SCHEME, "accepts": measure_digest(nb, HASH_SCHEME)}
    nb.metadata["mentor"] = record
    nbformat.write(nb, nb_path)
    return record


def measuring_cells(nb_path: Path) -> list[int]:
    """The indices of the cells of ``nb_path`` tagged ``measure``."""
    nb = nbformat.read(nb_path, as_version=4)
    return [i for i, cell in enumerate(nb.cells) if is_measure(cell)]
