"""What of mentor a notebook's code can run (scripts/nb/symbols.py): the hash of each file covers its module-level code
and the functions and classes reached by name, so that a change elsewhere leaves a stored run current."""

from __future__ import annotations

import textwrap
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from nbtools_loader import hashes as nb_hashes
from nbtools_loader import nbtools  # noqa: F401 (puts scripts/ on sys.path)

from nb.symbols import TOP, Reach, _mentor_strings


def package(tmp_path: Path, files: dict[str, str]) -> Path:
    """A made-up ``mentor`` package under ``tmp_path`` with ``files`` (path -> source, dedented)."""
    root = tmp_path / "mentor"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def reached(root: Path, code: str) -> dict[str, list[str]]:
    """Module -> the names of its reached chunks, sorted (``<module>`` is its module-level code)."""
    return {m: sorted(c) for m, c in sorted(Reach(root).from_code(textwrap.dedent(code)).reached.items())}


LIB = {
    "suite.py": """
        import torch
        from mentor._state import restore

        LIMIT = 64

        class Suite:
            def update(self, x):
                return _check(x)

            def compute(self):
                return 1

        def _check(x):
            return x

        def helper():
            return restore()
        """,
    "_state.py": """
        def restore():
            return 0

        def unused():
            return 1
        """,
    "sync_free.py": """
        from mentor._state import restore

        def fix(metric):
            return restore()
        """,
    "lab/__init__.py": "",
    "lab/configs.py": """
        from mentor.sync_free import fix

        def catalogue():
            return [fix]

        def suite_config():
            from mentor.suite import Suite
            return Suite()
        """,
}


def test_only_the_functions_and_classes_reached_by_name_count(tmp_path: Path) -> None:
    root = package(tmp_path, LIB)
    assert reached(root, "from mentor.lab.configs import catalogue\ncatalogue()") == {
        "mentor": [TOP], "mentor._state": [TOP, "restore"], "mentor.lab": [TOP],
        "mentor.lab.configs": [TOP, "catalogue"], "mentor.sync_free": [TOP, "fix"]}
    # the lazy import inside suite_config runs only when it is called: then the class counts whole
    assert reached(root, "from mentor.lab.configs import suite_config\nsuite_config()") == {
        "mentor": [TOP], "mentor._state": [TOP], "mentor.lab": [TOP], "mentor.lab.configs": [TOP, "suite_config"],
        "mentor.suite": [TOP, "Suite", "_check"], "mentor.sync_free": [TOP]}
    # imported but never read: nothing of it runs
    assert reached(root, "from mentor.lab.configs import suite_config") == {
        "mentor": [TOP], "mentor._state": [TOP], "mentor.lab": [TOP], "mentor.lab.configs": [TOP],
        "mentor.sync_free": [TOP]}


def test_a_change_stales_only_the_notebooks_that_reach_it(tmp_path: Path) -> None:
    """The issue's example: a change to the body of the suite's compute leaves a notebook that only uses the
    catalogue current, and changes the hash of one that builds the suite."""
    root = package(tmp_path, LIB)
    part_one = new_notebook(cells=[new_code_cell("from mentor.lab.configs import catalogue\ncatalogue()")])
    part_two = new_notebook(cells=[new_code_cell("from mentor.lab.configs import suite_config\nsuite_config()")])
    before = [nb_hashes.mentor_sources(nb, root) for nb in (part_one, part_two)]
    suite = root / "suite.py"
    suite.write_text(suite.read_text().replace("return 1", "return 2"))
    after = [nb_hashes.mentor_sources(nb, root) for nb in (part_one, part_two)]
    assert after[0] == before[0]
    assert nb_hashes.changed_modules(before[1], after[1]) == ["suite.py"]
    # the file-level scheme of earlier runs stales both: configs imports the suite
    assert "suite.py" in nb_hashes.mentor_sources(part_one, root, scheme="ast-1")
    # a docstring or a comment changes nothing; module-level code changes every notebook that imports the module
    suite.write_text(suite.read_text().replace("LIMIT = 64", "LIMIT = 64  # launchers kept"))
    assert [nb_hashes.mentor_sources(nb, root) for nb in (part_one, part_two)] == after
    (root / "_state.py").write_text((root / "_state.py").read_text().replace("return 1", "return 2"))
    assert [nb_hashes.mentor_sources(nb, root) for nb in (part_one, part_two)] == after  # unused() is reached by none
    (root / "_state.py").write_text("import os\n" + (root / "_state.py").read_text())
    now = [nb_hashes.mentor_sources(nb, root) for nb in (part_one, part_two)]
    assert [nb_hashes.changed_modules(a, b) for a, b in zip(after, now)] == [["_state.py"], ["_state.py"]]


def test_module_aliases_are_followed_through_their_attributes(tmp_path: Path) -> None:
    root = package(tmp_path, LIB)
    assert reached(root, "from mentor.lab import configs\nconfigs.catalogue()") == reached(
        root, "from mentor.lab.configs import catalogue\ncatalogue()")
    assert reached(root, "import mentor.lab.configs\nmentor.lab.configs.catalogue()") == reached(
        root, "from mentor.lab.configs import catalogue\ncatalogue()")
    # a module used as a value (passed on, looked into by others), or imported with *: every part of it counts
    assert reached(root, "from mentor import suite\nprint(suite)")["mentor.suite"] == [
        TOP, "Suite", "_check", "helper"]
    assert reached(root, "from mentor.suite import *\nhelper()")["mentor.suite"] == [TOP, "Suite", "_check", "helper"]


def test_what_cannot_be_followed_by_name_counts_whole(tmp_path: Path) -> None:
    root = package(tmp_path, {
        **LIB,
        "worker.py": """
            from mentor.suite import helper

            def main():
                return helper()

            def other():
                return 0
            """,
        "lazy.py": """
            def __getattr__(name):
                return globals()["_make_" + name]()

            def _make_thing():
                return 1
            """,
        "ops.py": """
            import torch

            @torch.library.custom_op("mentor::op", mutates_args=())
            def op(x):
                return x

            def plain():
                return 0
            """,
    })
    launched = reached(root, "import subprocess, sys\nsubprocess.run([sys.executable, '-m', 'mentor.worker'])")
    assert launched["mentor.worker"] == [TOP, "main", "other"]
    assert launched["mentor.suite"] == [TOP, "helper"]
    # a name the module makes on demand: its __getattr__, which reads globals(): the module counts whole
    assert reached(root, "from mentor.lazy import thing\nthing")["mentor.lazy"] == [TOP, "__getattr__", "_make_thing"]
    # a registration that runs at import counts for every importer; a plain function only where it is called
    assert reached(root, "from mentor.ops import plain")["mentor.ops"] == [TOP, "op"]
    # code that runs pytest loads the package's pytest plugin through its entry point, unnamed
    plugin = package(tmp_path / "p", {"pytest_plugin.py": "def pytest_configure(config):\n    return None\n"})
    assert reached(plugin, "import subprocess, sys\nsubprocess.run([sys.executable, '-m', 'pytest', '-q'])") == {
        "mentor": [TOP], "mentor.pytest_plugin": [TOP, "pytest_configure"]}


@pytest.mark.parametrize(("text", "modules"), [
    ("mentor.lab.worker", {"mentor.lab.worker"}),
    ("python -m mentor.lab.bench --configs naive", {"mentor.lab.bench"}),
    ("from mentor.syncs import sync_guard\n\ndef test_step():\n    pass\n", {"mentor.syncs"}),
    ("import mentor.readback as r", {"mentor.readback"}),
    ("results from an older mentor.lab.bench; re-run the comparison.", set()),
    ("see mentor.suite.FusedMetrics", set()),
])
def test_only_strings_that_launch_or_import_a_module_count(text: str, modules: set[str]) -> None:
    assert _mentor_strings(text) == modules


def test_a_notebook_that_imports_nothing_of_mentor_reaches_nothing(tmp_path: Path) -> None:
    root = package(tmp_path, LIB)
    nb = new_notebook(cells=[new_code_cell("import torch\nx = torch.ones(2)")])
    assert nb_hashes.mentor_sources(nb, root) == {}
    assert nb_hashes.mentor_sources(nbformat.from_dict(nb), root, scheme="ast-1") == {}
