"""Waivers: a stored run kept across a change of the ``mentor`` modules it imports, for a stated reason."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nbformat
from nbformat import NotebookNode

from nb.book import BOOK, display_path
from nb.check import (_CODE_CHANGED, _SOURCES_CHANGED, MEASURE_CODE_CHANGED, MEASURE_SOURCES_CHANGED, _run_reasons,
                      measurement_reasons, unrenamed)
from nb.hashes import (HASH_SCHEME, changed_modules, code_hash, is_split, measure_digest, mentor_sources, sources_digest,
                       stored_scheme)


def _run_box() -> Any:
    """book/_ext/run_box.py, the Sphinx extension that shows a waiver on the page (it owns the waiver's wording)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_box", BOOK / "_ext" / "run_box.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def waiver_text(meta: dict) -> str | None:
    """The sentence the rendered page shows for ``meta``'s waiver (book/_ext/run_box.py); None without one."""
    return _run_box().waiver_text(meta)


class WaiverRefused(ValueError):
    """``waive`` cannot accept the notebook's change (it is not a mentor change only, or there is none)."""


def waive(nb_path: Path, reason: str, renames: dict[str, str] | None = None) -> dict:
    """Accept, in ``nb_path``'s metadata, the change of the mentor modules it imports since its stored run.

    The waiver (``metadata.mentor.waiver``) names the changed modules (and which of them are new or
    gone: ``added``, ``removed``), the hash of the module mapping it accepts (:func:`sources_digest`) and
    ``reason``; :func:`stale` then accepts exactly that change and still fails on any other mentor change,
    a code-cell change or an edited output. Only a run that is otherwise current can be waived.

    ``renames`` (``{"mentor.env": "mentor.lab.env"}``) is for a module that moved: the code cells must then
    import it under its new name. The waiver records the renames and accepts code cells that, with every new
    name put back to its old one (:func:`unrenamed`), are exactly the code of the stored run; any other code
    change is still refused, by ``waive`` and by :func:`stale`. Returns the waiver.

    Of a split notebook (:func:`nb.hashes.is_split`) only the measurement is waived: the waiver accepts the
    present code of its measuring cells and of the modules they import (:func:`nb.hashes.measure_digest`), a
    change of either, and records whether the cells changed (``cells_changed``); edited outputs of the measuring
    cells, or changed files of the measurement, are still refused. Its presenting cells need no waiver: any
    machine renders them.
    """
    name = display_path(Path(nb_path))
    if not isinstance(reason, str) or not reason.strip():
        raise WaiverRefused(f"{name}: a waiver needs a reason, e.g. --reason \"needs two GPUs; none available\"")
    nb = nbformat.read(nb_path, as_version=4)
    meta = nb.metadata.get("mentor", {})
    if is_split(nb):
        return _waive_measurement(Path(nb_path), nb, meta, reason.strip(), name, renames)
    if meta.get("code_sha256") is None or meta.get("mentor_sources") is None:
        raise WaiverRefused(f"{name}: no stored GPU run with per-module hashes to waive a change of; "
                            f"run it first: make gpu-run NB={name}")
    renames = _check_renames(name, renames or {})
    others = [r for r in _run_reasons(nb, meta) if not r.startswith(_SOURCES_CHANGED)
              and not (r == _CODE_CHANGED and renames
                       and code_hash(unrenamed(nb, renames), stored_scheme(meta)) == meta["code_sha256"])]
    if others:
        raise WaiverRefused(f"{name}: a waiver accepts a change of mentor modules only, and this run also "
                            f"{'; '.join(others)}; rerun it: make gpu-run NB={name}")
    current = mentor_sources(nb, scheme=stored_scheme(meta))
    modules = changed_modules(meta["mentor_sources"], current)
    if not modules:
        raise WaiverRefused(f"{name}: the mentor modules it imports are unchanged since its stored run: "
                            "there is nothing to waive")
    recorded = meta["mentor_sources"]
    waiver = {"reason": reason.strip(), "modules": modules,
              "added": [m for m in modules if m not in recorded], "removed": [m for m in modules if m not in current],
              "accepts": sources_digest(current), "written": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    if renames:
        if code_hash(nb, stored_scheme(meta)) == meta["code_sha256"]:
            raise WaiverRefused(f"{name}: its code cells do not use the renamed modules "
                                f"({', '.join(f'{old} -> {new}' for old, new in renames.items())}): leave --rename out")
        waiver["renames"] = renames
    nb.metadata["mentor"]["waiver"] = waiver
    nbformat.write(nb, nb_path)
    return waiver


def _waive_measurement(nb_path: Path, nb: NotebookNode, meta: dict, reason: str, name: str,
                       renames: dict[str, str] | None) -> dict:
    """:func:`waive` for a split notebook: the waiver accepts the measuring cells and their modules as they are."""
    if renames:
        raise WaiverRefused(f"{name}: a split notebook's waiver accepts its measuring cells as they are, renamed "
                            "modules included: leave --rename out")
    if meta.get("code_sha256") is None or meta.get("mentor_sources") is None:
        raise WaiverRefused(f"{name}: no stored measurement with per-module hashes to waive a change of; "
                            f"measure it first: make gpu-run NB={name}")
    plain = {k: v for k, v in meta.items() if k != "waiver"}
    reasons = measurement_reasons(nb, plain, nb_path.parent, name)
    others = [r for r in reasons if r != MEASURE_CODE_CHANGED and not r.startswith(MEASURE_SOURCES_CHANGED)]
    if others:
        raise WaiverRefused(f"{name}: a waiver accepts a change of the measuring cells and their mentor modules "
                            f"only, and this measurement also: {'; '.join(others)}; measure it again: "
                            f"make gpu-run NB={name}")
    if not reasons:
        raise WaiverRefused(f"{name}: its measuring cells and the modules they import are unchanged since its "
                            "measurement: there is nothing to waive")
    scheme = stored_scheme(meta)
    recorded, current = meta["mentor_sources"], mentor_sources(nb, scheme=scheme, scope="measure")
    modules = changed_modules(recorded, current)
    waiver = {"reason": reason, "modules": modules,
              "added": [m for m in modules if m not in recorded], "removed": [m for m in modules if m not in current],
              "cells_changed": MEASURE_CODE_CHANGED in reasons,
              # the code as it is now, hashed by the current scheme: a later docstring or layout edit keeps it
              "scheme": HASH_SCHEME, "accepts": measure_digest(nb, HASH_SCHEME),
              "written": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    nb.metadata["mentor"]["waiver"] = waiver
    nbformat.write(nb, nb_path)
    return waiver


_MODULE_NAME = re.compile(r"^mentor(\.[A-Za-z_]\w*)+$")


def _check_renames(name: str, renames: dict[str, str]) -> dict[str, str]:
    """``renames`` checked: dotted ``mentor`` module names, old to new, each old and new name used once."""
    for old, new in renames.items():
        if not (isinstance(old, str) and isinstance(new, str) and _MODULE_NAME.match(old) and _MODULE_NAME.match(new)):
            raise WaiverRefused(f"{name}: a rename maps an old mentor module to its new name, e.g. "
                                f"mentor.env=mentor.lab.env; got {old!r} -> {new!r}")
        if old == new:
            raise WaiverRefused(f"{name}: the rename {old} -> {new} renames nothing")
    if len(set(renames.values())) != len(renames):
        raise WaiverRefused(f"{name}: two modules are renamed to one name: {renames}")
    return dict(sorted(renames.items()))


def waived(notebooks: Sequence[Path]) -> list[str]:
    """``name: sentence`` for each readable notebook that carries a waiver (see :func:`waiver_text`)."""
    out = []
    for nb_path in notebooks:
        try:
            text = waiver_text(nbformat.read(nb_path, as_version=4).metadata.get("mentor", {}))
        except Exception:  # noqa: BLE001 - stale() reports unreadable notebooks
            continue
        if text:
            out.append(f"{display_path(Path(nb_path))}: {text}")
    return out
