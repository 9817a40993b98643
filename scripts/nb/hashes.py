"""What of a notebook and of ``mentor`` a stored run depends on, as hashes: code cells, imported modules, outputs."""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from nbformat import NotebookNode

from nb.book import REPO


CELL_SEPARATOR = "\n# ---- next code cell ----\n"
MEASURE_TAG = "measure"
"""The tag of a code cell that measures: it runs on the GPU machine (``gpu-run``), writes what it measured under
``book/results/``, and keeps the outputs of that run. Every other code cell presents: ``render`` re-executes it
on any machine from the stored results."""
SCOPES = ("all", "measure", "present")
"""Which code cells a hash covers: every one (a notebook not split into the two roles), the measuring ones, or
the presenting ones."""


MENTOR = REPO / "mentor"


def mentor_hash(package: Path | None = None) -> str:
    """SHA-256 of the ``mentor`` package's source: every ``.py`` file, by relative path and content."""
    package = MENTOR if package is None else package
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


MAGIC_LINE = re.compile(r"^\s*[%!].*$", re.MULTILINE)
MENTOR_NAME = re.compile(r"\bmentor((?:\.\w+)*)")


def _is_doc(node: ast.AST) -> bool:
    """A bare string statement: a docstring or a comment-like string, which imports nothing."""
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def is_measure(cell: Any) -> bool:
    """Whether a cell is a code cell tagged :data:`MEASURE_TAG`."""
    return cell.get("cell_type") == "code" and MEASURE_TAG in cell.get("metadata", {}).get("tags", [])


def is_split(nb: NotebookNode) -> bool:
    """Whether ``nb`` is split into measuring and presenting cells: a cell is tagged :data:`MEASURE_TAG`, or its
    stored record says so (``metadata.mentor.scope == "measure"``, a page whose cells all present).

    >>> from nbformat.v4 import new_code_cell, new_notebook
    >>> is_split(new_notebook(cells=[new_code_cell("x = 1")])), is_split(new_notebook(cells=[
    ...     new_code_cell("x = 1", metadata={"tags": ["measure"]})]))
    (False, True)
    """
    return nb.metadata.get("mentor", {}).get("scope") == "measure" or any(is_measure(c) for c in nb.cells)


def code_cells(nb: NotebookNode, scope: str = "all") -> list[Any]:
    """The code cells of ``nb`` that ``scope`` (:data:`SCOPES`) covers, in order."""
    if scope not in SCOPES:
        raise ValueError(f"scope is one of {', '.join(SCOPES)}, not {scope!r}")
    return [cell for cell in nb.cells if cell.get("cell_type") == "code"
            and (scope == "all" or is_measure(cell) == (scope == "measure"))]


HASH_SCHEME = "ast-2"
"""How ``gpu-run`` hashes code now, stored as ``metadata.mentor.hash_scheme``. Code is hashed by its syntax tree,
so that comments, line breaks and the layout of code (and, in ``mentor`` modules, docstrings and other bare
strings, which run no code) do not make a stored run stale; a cell's magic lines and whether it ends in ``;``
(which hides its value) still count. ``ast-2`` hashes, of each ``mentor`` file, only what the notebook's code can
run (:mod:`nb.symbols`): its module-level code and the functions and classes reached by name. ``ast-1`` hashed
every file imported, whole: runs stored with it are checked that way until they are run again (a waiver written
now records ``ast-2``). A run stored without ``hash_scheme`` was hashed as text (``raw``). Line numbers do not
count either, so a warning or traceback stored in an output may quote a line number that has since moved."""


def _tree_text(node: Any) -> str:
    """A syntax tree as text, with no line numbers and no empty fields (so Python 3.11 to 3.13 agree)."""
    if isinstance(node, ast.JoinedStr):  # f-string pieces: Python 3.12 keeps empty ones and splits some
        values: list[Any] = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                if values and isinstance(values[-1], str):
                    values[-1] += value.value
                elif value.value:
                    values.append(value.value)
            else:
                values.append(value)
        return "JoinedStr(" + ", ".join(repr(v) if isinstance(v, str) else _tree_text(v) for v in values if v != "") + ")"
    if isinstance(node, ast.AST):
        fields = []
        for name in node._fields:
            value = getattr(node, name, None)
            if value is None or value == []:
                continue
            fields.append(f"{name}={_tree_text(value)}")
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return "[" + ", ".join(_tree_text(item) for item in node) + "]"
    return repr(node)


def _without_bare_strings(tree: ast.AST) -> ast.AST:
    """``tree`` with every bare string statement (docstrings too) dropped; a body left empty gets ``pass``."""
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if isinstance(body, list) and any(_is_doc(item) for item in body):
                kept = [item for item in body if not _is_doc(item)]
                setattr(node, name, kept or ([ast.Pass()] if name == "body" else []))
    return tree


def cell_fingerprint(source: str) -> str:
    r"""What of a code cell's ``source`` can change what it does: its syntax tree, magic lines and a final ``;``.

    >>> cell_fingerprint("x = f(1,  2)  # a comment") == cell_fingerprint("x = f(\n    1, 2\n)")
    True
    >>> cell_fingerprint("x") == cell_fingerprint("x;")
    False
    """
    magics = MAGIC_LINE.findall(source)
    code = MAGIC_LINE.sub("", source)
    try:
        tree = _tree_text(ast.parse(code))
    except SyntaxError:
        return "text:" + "\n".join(line.rstrip() for line in source.splitlines())
    return "\n".join(magics) + "\n" + tree + ("\n;" if _ends_in_semicolon(code) else "")


def _ends_in_semicolon(code: str) -> bool:
    """Whether the last token of ``code`` (comments and line ends aside) is ``;``, which hides the cell's value."""
    import io
    import tokenize

    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type not in skip]
    except (tokenize.TokenError, SyntaxError):
        return code.rstrip().endswith(";")
    return bool(tokens) and tokens[-1].string == ";"


@functools.lru_cache(maxsize=2048)
def module_fingerprint(text: str) -> str:
    r"""What of a ``mentor`` module's ``text`` can change what it does: its syntax tree without bare strings.

    >>> module_fingerprint("def f():\n    'Doc.'\n    return 1  # one") == module_fingerprint("def f():\n    return 1")
    True
    """
    try:
        return _tree_text(_without_bare_strings(ast.parse(text)))
    except SyntaxError:
        return "text:" + text


@functools.lru_cache(maxsize=2048)
def imported_modules(source: str, module: str = "") -> frozenset[str]:
    """Dotted names of the ``mentor`` modules that Python ``source`` may import.

    Counts ``import mentor.x``, ``from mentor import x``, relative imports inside the package
    (``module`` is the dotted name of the file being read) and, to catch ``python -m mentor.x``
    launches, any string constant that names ``mentor.x`` (docstrings excepted). IPython magic and
    shell lines are skipped. It over-counts rather than misses: a name that is not a module of the
    package is dropped later by :func:`mentor_sources`.

    >>> sorted(imported_modules("from mentor.lab.compare import compare\\nimport mentor.lab.trace as t"))
    ['mentor.lab.compare', 'mentor.lab.compare.compare', 'mentor.lab.trace']
    """
    tree = ast.parse(MAGIC_LINE.sub("", source))
    docs = {id(node.value) for node in ast.walk(tree) if _is_doc(node)}
    package = module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            names.update("mentor" + match for match in MENTOR_NAME.findall(node.value))
    return frozenset(name for name in names if name == "mentor" or name.startswith("mentor."))


def _module_file(name: str, package: Path) -> Path | None:
    """The file of dotted module ``name`` inside ``package`` (named ``mentor``), or None if it is not one."""
    parts = name.split(".")[1:]
    for candidate in (package.joinpath(*parts).with_suffix(".py") if parts else None,
                      package.joinpath(*parts, "__init__.py")):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def mentor_sources(nb: NotebookNode, package: Path | None = None, scheme: str = HASH_SCHEME,
                   scope: str = "all") -> dict[str, str]:
    """SHA-256 of each ``mentor`` file that ``nb``'s code (the cells of ``scope``) reaches (path relative to the
    package -> hash).

    Under ``ast-2`` (:data:`HASH_SCHEME`) a file's hash covers only what of it the code can run: its
    module-level code and the functions and classes the code reaches by name (:mod:`nb.symbols`, which says what
    that analysis cannot see); a change elsewhere in the file leaves the hash, and the stored run, as they were.
    Under ``ast-1`` and ``raw`` (runs stored before ``ast-2``) it covers every file the code imports, directly or
    through other modules, whole. Either way the package's ``__init__.py`` is included whenever any module is,
    since Python imports it first.
    """
    package = MENTOR if package is None else package
    code = "\n".join(_source(cell) for cell in code_cells(nb, scope))
    if scheme not in ("raw", "ast-1"):
        from nb.symbols import Reach

        return Reach(package).from_code(MAGIC_LINE.sub("", code)).sources()
    pending, seen = list(imported_modules(code)), set()
    while pending:
        name = pending.pop()
        path = _module_file(name, package)
        if name in seen or path is None:
            continue
        seen.add(name)
        pending.append(name.rpartition(".")[0] if "." in name else name)  # the parent package runs first
        pending.extend(imported_modules(path.read_text(), module=name if path.name != "__init__.py" else name + ".x"))
    files = {_module_file(name, package) for name in seen}
    return {str(path.relative_to(package)): _file_hash(path, scheme) for path in sorted(f for f in files if f is not None)}


def _file_hash(path: Path, scheme: str) -> str:
    """SHA-256 of a module: of its :func:`module_fingerprint` (``ast-1``) or of its bytes (``raw``)."""
    if scheme == "raw":
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return hashlib.sha256(module_fingerprint(path.read_text(encoding="utf-8")).encode()).hexdigest()


def stored_scheme(meta: dict) -> str:
    """The :data:`HASH_SCHEME` a stored run's hashes were made with: ``raw`` when it records none."""
    return meta.get("hash_scheme", "raw")


def outputs_hash(nb: NotebookNode, scope: str = "all") -> str:
    """SHA-256 of the outputs of the code cells of ``scope``, as stored (so a hand edit of an output changes it).

    The measuring cells' outputs are hashed as one sequence, in order: an output that moves, unchanged, from the
    end of one measuring cell to the start of the next (a cell split in two) keeps the hash; the split itself
    changes the measuring code, which a rerun or a waiver must answer for.
    """
    outputs: list[Any] = [cell.get("outputs", []) for cell in code_cells(nb, scope)]
    if scope == "measure":
        outputs = [output for cell_outputs in outputs for output in cell_outputs]
    return hashlib.sha256(json.dumps(outputs, sort_keys=True).encode()).hexdigest()


def _source(cell: Any) -> str:
    return "".join(cell.source) if isinstance(cell.source, list) else cell.source


def code_hash(nb: NotebookNode, scheme: str = HASH_SCHEME, scope: str = "all") -> str:
    """SHA-256 of the code cells of ``scope``: of their :func:`cell_fingerprint` (``ast-1``), or of their sources
    with trailing whitespace stripped (``raw``); outputs, metadata (tags too) and markdown don't count."""
    cells = []
    for cell in code_cells(nb, scope):
        source = _source(cell)
        if scheme == "raw":
            cells.append("\n".join(line.rstrip() for line in source.splitlines()))
        else:
            cells.append(cell_fingerprint(source))
    return hashlib.sha256(CELL_SEPARATOR.join(cells).encode()).hexdigest()


def sources_digest(sources: dict[str, str]) -> str:
    """SHA-256 of a :func:`mentor_sources` mapping (module path -> hash), independent of its order."""
    return hashlib.sha256(json.dumps(sources, sort_keys=True).encode()).hexdigest()


def changed_modules(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """The module paths whose hash differs between two :func:`mentor_sources` mappings (added and removed ones too)."""
    return sorted(f for f in set(recorded) | set(current) if recorded.get(f) != current.get(f))


def measure_digest(nb: NotebookNode, scheme: str = HASH_SCHEME) -> str:
    """SHA-256 of what a split notebook's measurement depends on: its measuring cells' code and the ``mentor``
    modules they import. A waiver of a measurement accepts exactly this digest, made with the scheme it records
    (the current one when it was written), whatever scheme the measurement's own hashes used."""
    return sources_digest({"code": code_hash(nb, scheme, "measure"),
                           "modules": sources_digest(mentor_sources(nb, scheme=scheme, scope="measure"))})


def file_hash(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
