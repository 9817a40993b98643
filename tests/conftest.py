"""Shared test settings: a non-interactive matplotlib backend for every test (and its subprocesses), and
one build of the book per session for the tests that read the site."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# Must be set before anything imports matplotlib.pyplot; subprocesses inherit it.
os.environ["MPLBACKEND"] = "Agg"

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def built_book(tmp_path_factory):
    """Build a copy of the book with ``jupyter-book build -W -n``: (the finished process, the html folder, the
    toc entries built). Only the entries of _toc.yml that exist are built."""
    from nbtools_loader import nbtools
    from test_book import prune_toc

    present = [entry for entry in nbtools.toc_files() if nbtools.toc_source(entry) is not None]
    assert present, "no entry of _toc.yml exists yet"
    root = tmp_path_factory.mktemp("book")
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    assert toc["root"] in present, f"the toc's root {toc['root']} is missing"
    (root / "_toc.yml").write_text(yaml.safe_dump(prune_toc(toc, set(present)), sort_keys=False))
    shutil.copy(REPO / "_config.yml", root)
    shutil.copytree(REPO / "book", root / "book", ignore=nbtools.COPY_IGNORE)
    jupyter_book = shutil.which("jupyter-book", path=str(BIN)) or shutil.which("jupyter-book")
    assert jupyter_book, f"jupyter-book is not installed next to {sys.executable}"
    build = subprocess.run([jupyter_book, "build", str(root), "-W", "-n", "--keep-going"],
                           capture_output=True, text=True, cwd=root)
    return build, root / "_build" / "html", present
