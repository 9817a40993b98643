"""The package's layout: the library (``mentor.*``) never imports the lab (``mentor.lab.*``), every module stays
small, and a module's ``if __name__ == "__main__":`` block comes after everything it defines."""

import ast
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "mentor"
LIBRARY = sorted(p for p in PACKAGE.glob("*.py"))
LAB = sorted((PACKAGE / "lab").glob("*.py"))
MAX_LINES = 500


def mentor_imports(path: Path, root: Path = REPO) -> set[str]:
    """The ``mentor`` modules a file imports anywhere (top level or inside functions), relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {n for n in names if n == "mentor" or n.startswith("mentor.")}


def test_the_two_parts_exist():
    assert {p.stem for p in LIBRARY} >= {"suite", "readback", "syncs", "sync_free", "flat_sync", "pytest_plugin"}
    assert {p.stem for p in LAB} >= {"env", "data", "train", "stats", "comparison", "configs", "compare", "bench",
                                     "plots", "blocks", "worker"}


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.name)
def test_no_library_module_imports_the_lab(path):
    lab = sorted(n for n in mentor_imports(path) if n == "mentor.lab" or n.startswith("mentor.lab."))
    assert not lab, f"{path.relative_to(REPO)} imports {lab}: the library must work without the lab"


def test_the_import_check_sees_imports_inside_functions(tmp_path):
    pkg = tmp_path / "mentor"
    pkg.mkdir()
    module = pkg / "x.py"
    module.write_text("def f():\n    from mentor.lab.bench import main\n    from .lab import plots\n")
    assert mentor_imports(module, root=tmp_path) == {"mentor.lab.bench", "mentor.lab.bench.main", "mentor.lab",
                                                     "mentor.lab.plots"}


def test_importing_the_library_loads_no_lab_module():
    code = ("import sys, mentor, mentor.suite, mentor.readback, mentor.syncs, mentor.sync_free, mentor.flat_sync, "
            "mentor.pytest_plugin; print(sorted(m for m in sys.modules if m.startswith('mentor.lab')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("path", LIBRARY + LAB, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_stays_small(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(REPO)} has {lines} lines: split it by job (at most {MAX_LINES})"


def _is_main_guard(node: ast.stmt) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


@pytest.mark.parametrize("path", LIBRARY + LAB, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_main_block_comes_last(path):
    body = ast.parse(path.read_text(encoding="utf-8")).body
    guards = [i for i, node in enumerate(body) if _is_main_guard(node)]
    assert guards in ([], [len(body) - 1]), (f"{path.relative_to(REPO)}: the __main__ block stands at statement "
                                             f"{guards[0] + 1} of {len(body)}; move it to the end of the module")


def public_names(path: Path) -> list[str]:
    """The functions and classes a library module's source defines for its users (pytest's hook functions aside).

    Read from the source, so that the subclasses the module makes at run time (``NoNanCheckMeanMetric``, ...)
    do not count: their factory's example covers them."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))
            and not node.name.startswith(("_", "pytest_"))]


@pytest.mark.parametrize("path", [p for p in LIBRARY if p.stem != "__init__"], ids=lambda p: p.name)
def test_every_public_name_of_the_library_has_an_example(path):
    module = f"mentor.{path.stem}"
    names = public_names(path)
    assert names, f"{module} defines nothing public"
    missing = [n for n in names if ">>>" not in (inspect.getdoc(getattr(importlib.import_module(module), n)) or "")]
    assert not missing, f"{module}: {missing} have no example in their docstring"


def test_lab_modules_that_locate_the_repository_find_its_root(monkeypatch):
    """The worker and the releases module put the repository root on a child's PYTHONPATH (so that it imports
    mentor), and the old torchmetrics release is looked for in the root's .venv: both are paths from __file__."""
    from mentor.lab import releases, worker

    assert worker.REPO == releases.REPO == REPO
    monkeypatch.delenv(releases.SITE_VARIABLE, raising=False)
    expected = REPO / ".venv" / "torchmetrics-1.6.1"
    assert releases.old_release_site() == (expected if (expected / "torchmetrics" / "__init__.py").is_file() else None)


def test_the_labs_docstring_lists_every_lab_module_once():
    """mentor.lab's docstring is the lab's table of contents: one line per module, none missing, none stale."""
    import mentor.lab

    listed = re.findall(r"^- ``mentor\.lab\.(\w+)``: \S", mentor.lab.__doc__, flags=re.M)
    modules = sorted(p.stem for p in (PACKAGE / "lab").glob("*.py") if p.stem != "__init__")
    assert sorted(listed) == modules, f"listed but missing: {set(listed) - set(modules)}; not listed: {set(modules) - set(listed)}"


def test_the_api_page_documents_every_module_once():
    """book/api.md is where the chapters' {py:func} links land: every module of mentor (library and lab) has
    one automodule there, so that a link to a new module's function resolves instead of failing the build."""
    page = (REPO / "book" / "api.md").read_text(encoding="utf-8")
    documented = re.findall(r"^\.\. automodule:: (mentor[\w.]*)$", page, flags=re.M)
    modules = sorted(
        ".".join(("mentor", *p.relative_to(PACKAGE).with_suffix("").parts))
        for p in PACKAGE.rglob("*.py")
        if p.stem != "__init__" and not p.stem.startswith("_")
    )
    assert len(documented) == len(set(documented)), f"documented twice: {sorted(documented)}"
    assert sorted(documented) == modules, (f"documented but missing: {set(documented) - set(modules)}; "
                                           f"not documented: {set(modules) - set(documented)}")


def _mentor_imports(path: Path, package: Path) -> set[str]:
    """The mentor modules that the file at ``path`` imports anywhere in it (at its top or inside a function)."""
    name = ".".join(path.relative_to(package.parent).with_suffix("").parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")[: -node.level]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    modules = {".".join(p.relative_to(package.parent).with_suffix("").parts) for p in package.rglob("*.py")}
    return {m.removesuffix(".__init__") for m in found if m in modules or f"{m}.__init__" in modules} - {name}


def test_no_two_modules_of_mentor_import_each_other_even_through_others() -> None:
    """The import graph of mentor's modules has no cycle, not even through an import inside a function (the one
    between mentor.lab.comparison and mentor.lab.plots made every chapter that drew a comparison depend on both)."""
    package = Path(__file__).resolve().parent.parent / "mentor"
    graph = {".".join(p.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__"):
             _mentor_imports(p, package) for p in package.rglob("*.py")}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif len(path) < 12:
                visit(nxt, path + [nxt])

    for start in sorted(graph):
        visit(start, [start])
    packages = {name for name in graph if (package.parent / name.replace(".", "/") / "__init__.py").exists()}
    # a package's __init__ runs before its modules: "mentor.lab.x imports mentor.lab" is how Python loads it
    real = [c for c in cycles if not any(b in packages and a.startswith(b + ".") for a, b in zip(c, c[1:]))]
    assert graph["mentor.lab.comparison"] >= {"mentor.lab.plots"}  # the graph sees imports inside a function
    assert real == []
