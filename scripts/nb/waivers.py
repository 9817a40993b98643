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


REASON_LIMIT = 90
"""The longest reason a waiver takes, in characters: the page shows it at the top of the chapter, with the run's GPU
and date, in at most four lines at a phone's width (390 px); a longer account goes in ``details``, folded."""


def _checked_reason(name: str, reason: object, details: object) -> tuple[str, str | None]:
    """``reason`` and ``details`` stripped, or :class:`WaiverRefused` naming what to pass instead."""
    if not isinstance(reason, str) or not reason.strip():
        raise WaiverRefused(f"{name}: a waiver needs a reason, e.g. --reason \"needs two GPUs; none available\"")
    reason = " ".join(reason.split())
    if len(reason) > REASON_LIMIT:
        raise WaiverRefused(f"{name}: the reason has {len(reason)} characters, and the page shows it at the top of "
                            f"the chapter in at most four phone lines: say it in {REASON_LIMIT} or fewer, and put "
                            "the rest in --details (shown folded)")
    if details is not None and (not isinstance(details, str) or not details.strip()):
        raise WaiverRefused(f"{name}: --details, when given, is a text (the longer account, shown folded)")
    return reason, (" ".join(details.split()) if details is not None else None)


def _history(meta: dict, reason: str, details: str | None) -> dict:
    """What a new waiver keeps of the one it replaces: ``details`` (the new one's, else the old one's when the reason
    is the same) and ``earlier``, the reasons of the waivers before it, oldest first."""
    old = meta.get("waiver") or {}
    earlier = list(old.get("earlier") or [])
    if old.get("reason") and old.get("reason") != reason:
        earlier.append({k: old[k] for k in ("reason", "details", "written") if old.get(k)})
    kept = {}
    if details is not None:
        kept["details"] = details
    elif old.get("details") and old.get("reason") == reason:
        kept["details"] = old["details"]
    if earlier:
        kept["earlier"] = earlier
    return kept


def waive(nb_path: Path, reason: str, renames: dict[str, str] | None = None, details: str | None = None) -> dict:
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
    reason, details = _checked_reason(name, reason, details)
    nb = nbformat.read(nb_path, as_version=4)
    meta = nb.metadata.get("mentor", {})
    if is_split(nb):
        return _waive_measurement(Path(nb_path), nb, meta, reason, details, name, renames)
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
    waiver = {"reason": reason, **_history(meta, reason, details), "modules": modules,
              "added": [m for m in modules if m not in recorded], "removed": [m for m in modules if m not in current],
              # what the code can run now, hashed by the current scheme: a later change of code it cannot reach
              # (another function of a module it imports) leaves the waiver standing
              "scheme": HASH_SCHEME, "accepts": sources_digest(mentor_sources(nb, scheme=HASH_SCHEME)),
              "written": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    if renames:
        if code_hash(nb, stored_scheme(meta)) == meta["code_sha256"]:
            raise WaiverRefused(f"{name}: its code cells do not use the renamed modules "
                                f"({', '.join(f'{old} -> {new}' for old, new in renames.items())}): leave --rename out")
        waiver["renames"] = renames
    nb.metadata["mentor"]["waiver"] = waiver
    nbformat.write(nb, nb_path)
    return waiver


def _waive_measurement(nb_path: Path, nb: NotebookNode, meta: dict, reason: str, details: str | None, name: str,
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
    waiver = {"reason": reason, **_history(meta, reason, details), "modules": modules,
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


def waive_many(notebooks: Sequence[Path] | None, reason: str, renames: dict[str, str] | None = None,
               details: str | None = None) -> tuple[dict[Path, dict], dict[Path, str]]:
    """:func:`waive` each of ``notebooks`` with one reason; None: every book/*.ipynb whose stored run or
    measurement is stale (a notebook that needs only a render is left to ``render``). Returns the waivers written
    and, for each notebook a waiver cannot accept, why (the others are still waived)."""
    from nb.book import default_notebooks
    from nb.check import stale

    _checked_reason("the waiver", reason, details)  # one message for a bad reason, not one per notebook
    if notebooks is None:
        notebooks = [p for p in default_notebooks() if any("make gpu-run" in m for m in stale([p]))]
    done, refused = {}, {}
    for nb_path in notebooks:
        try:
            done[Path(nb_path)] = waive(Path(nb_path), reason, renames, details)
        except (WaiverRefused, FileNotFoundError) as error:
            refused[Path(nb_path)] = str(error)
    return done, refused


README_START = "<!-- pending reruns: written by `python scripts/nbtools.py pending --readme`; do not edit -->"
README_END = "<!-- end of pending reruns -->"


def pending_markdown(notebooks: Sequence[Path]) -> str:
    """The pending reruns of ``notebooks`` as a Markdown list: each notebook kept under a waiver, where and when it
    was measured, and the waiver's reason ("No rerun is pending." when there is none)."""
    rows = []
    for nb_path in notebooks:
        meta = nbformat.read(nb_path, as_version=4).metadata.get("mentor", {})
        waiver = meta.get("waiver")
        if not waiver:
            continue
        box = _run_box()
        try:
            where = f" on {box.stored_run_text('gpus', meta)}"
        except ValueError:
            where = ""
        rows.append(f"- `{display_path(Path(nb_path))}`, measured{where} on {str(meta.get('executed'))[:10]}: "
                    f"{waiver['reason'].rstrip('.')}.")
    return "\n".join(rows) if rows else "No rerun is pending."


def write_readme_pending(notebooks: Sequence[Path], readme: Path | None = None) -> Path:
    """Write :func:`pending_markdown` between the README's markers (:data:`README_START`, :data:`README_END`)."""
    from nb.book import REPO

    readme = REPO / "README.md" if readme is None else Path(readme)
    text = readme.read_text(encoding="utf-8")
    if text.count(README_START) != 1 or text.count(README_END) != 1 or text.index(README_START) > text.index(README_END):
        raise ValueError(f"{readme} needs one line {README_START!r} and, below it, one line {README_END!r}: the "
                         "pending reruns are written between them")
    head, rest = text.split(README_START)
    _, tail = rest.split(README_END)
    readme.write_text(f"{head}{README_START}\n{pending_markdown(notebooks)}\n{README_END}{tail}", encoding="utf-8")
    return readme


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
