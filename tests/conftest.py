"""Shared test settings: a non-interactive matplotlib backend and one OpenMP thread for every test (and its
subprocesses), one build of the book per session for the tests that read the site, and the notebooks' smoke run
started in a process of its own as soon as the tests are collected, so that it runs beside the other tests."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# Must be set before anything imports matplotlib.pyplot; subprocesses inherit it.
os.environ["MPLBACKEND"] = "Agg"
# Before torch is imported: on 2 cores shared with the notebooks' smoke run, torch's default of one thread per
# core makes a tiny CPU training step many times slower (each thread waits for the other's core).
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def built_book(tmp_path_factory):
    """Build a copy of the book with ``jupyter-book build -W -n``: (the finished process, the html folder, the
    toc entries built). Only the entries of _toc.yml that exist are built."""
    from nbtools_loader import book as nb_book
    from test_book import prune_toc

    present = [entry for entry in nb_book.toc_files() if nb_book.toc_source(entry) is not None]
    assert present, "no entry of _toc.yml exists yet"
    root = tmp_path_factory.mktemp("book")
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    assert toc["root"] in present, f"the toc's root {toc['root']} is missing"
    (root / "_toc.yml").write_text(yaml.safe_dump(prune_toc(toc, set(present)), sort_keys=False))
    shutil.copy(REPO / "_config.yml", root)
    shutil.copytree(REPO / "book", root / "book", ignore=nb_book.COPY_IGNORE)
    # the chapters include code from mentor's source ({literalinclude} ../mentor/...), as the real build does
    shutil.copytree(REPO / "mentor", root / "mentor", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    jupyter_book = shutil.which("jupyter-book", path=str(BIN)) or shutil.which("jupyter-book")
    assert jupyter_book, f"jupyter-book is not installed next to {sys.executable}"
    build = subprocess.run([jupyter_book, "build", str(root), "-W", "-n", "--keep-going"],
                           capture_output=True, text=True, cwd=root)
    return build, root / "_build" / "html", present


SMOKE = pytest.StashKey[dict]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start `nbtools.py smoke --json` for the notebooks this session's test_notebook_smoke items select, in a
    process of its own: it runs while the other tests do, and the `smoke_runs` fixture waits for it."""
    from nbtools_loader import book as nb_book

    selected = [item.callspec.params["notebook"] for item in session.items
                if getattr(item, "originalname", "") == "test_notebook_smoke" and item.callspec.params.get("notebook")]
    if not selected or session.config.option.collectonly:
        return
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="mentor-smoke-"))
    out = folder / "outcomes.json"
    before = {nb: nb.read_bytes() for nb in selected}
    log = open(folder / "smoke.log", "w")
    process = subprocess.Popen([sys.executable, str(nb_book.REPO / "scripts" / "nbtools.py"), "smoke", "--json",
                                str(out), *map(str, selected)], stdout=log, stderr=subprocess.STDOUT, cwd=nb_book.REPO)
    session.config.stash[SMOKE] = {"process": process, "out": out, "log": folder / "smoke.log", "before": before,
                                   "folder": folder, "log_file": log}


def pytest_unconfigure(config: pytest.Config) -> None:
    """A session that ends early (-x, Ctrl-C) does not leave the smoke run behind; its folder is removed."""
    run = config.stash.get(SMOKE, None)
    if run is None:
        return
    if run["process"].poll() is None:
        run["process"].kill()
        run["process"].wait()
    run["log_file"].close()
    shutil.rmtree(run["folder"], ignore_errors=True)


@pytest.fixture(scope="session")
def smoke_runs(request: pytest.FixtureRequest) -> dict:
    """{notebook: (its bytes before the run, its seconds or the NotebookFailed)}, from the background smoke run."""
    import json

    from nbtools_loader import runs as nb_runs

    run = request.config.stash.get(SMOKE, None)
    assert run is not None, "the smoke run was not started (pytest_collection_finish in tests/conftest.py)"
    run["process"].wait()
    if not run["out"].is_file():
        pytest.fail(f"the smoke run wrote no outcomes:\n{run['log'].read_text()[-4000:]}", pytrace=False)
    record = {Path(k): v for k, v in json.loads(run["out"].read_text()).items()}
    return {nb: (run["before"][nb], nb_runs.NotebookFailed(record[nb]["error"]) if "error" in record[nb]
                 else record[nb]["seconds"]) for nb in run["before"]}


@pytest.fixture(scope="module")
def setup():
    """The toy ResNet-18 on the CPU with 10 classes, shared by a test file's tests that only train it."""
    from mentor.lab.train import build_setup

    return build_setup(num_classes=10)


@pytest.fixture
def batches():
    """Endless batches of two 32-pixel images with labels of 10 classes, on the CPU."""
    from mentor.lab.data import device_batches

    return device_batches(2, 32, 10)


@pytest.fixture
def loss():
    """A CUDA loss of one step (for the tests marked @gpu)."""
    import torch

    return torch.rand((), device="cuda") + 1.0
