"""What of ``mentor`` a notebook's code can run: the module-level code, functions and classes it reaches.

A stored run is stale when code it ran has changed. Hashing every module that a notebook imports, directly or
through other modules, over-counts badly: a chapter that imports one helper from a module that also holds the
fused suite's configuration goes stale at every change of the suite. This module follows names instead of
modules, statically, from the notebook's code cells:

- Importing a module runs its module-level code (``top``): every top-level statement but the ``def`` and
  ``class`` statements, whose bodies run only when called. The package ``__init__`` modules above it run too.
  That code, and what it names, is always part of what a notebook that imports the module can run.
- A function or class is reached when reached code names it: ``from mentor.x import f``, then ``f``; a module
  alias's attribute (``from mentor import x``, then ``x.f``); a name re-exported by another module; a base
  class; a default argument. A class counts whole, every method with it: a method runs through its instance,
  which static analysis cannot follow, but the instance is made by code that names the class.
- Some code is counted whole, because what it runs cannot be read from its names: a module named in a string
  (``python -m mentor.lab.worker``: the other process runs any of it); a module used as a value rather than
  through an attribute; a function that calls ``globals()``; a module's ``__getattr__`` (then that module);
  and a ``def`` or ``class`` whose decorator is a call other than a known side-effect-free one
  (:data:`PURE_DECORATORS`), or a class whose body calls something at import: registrations such as
  ``torch.library.custom_op`` run at import and change what other code does, by name strings that are not
  followed (``torch.ops.mentor.fused_update``).
- Code that runs pytest (a string constant ``"pytest"`` or an ``import pytest``) reaches
  ``mentor.pytest_plugin`` whole: the installed package registers it as a pytest entry point, so every pytest
  session in the environment loads it, although no code names it.

What this cannot see, and so does not count: a function reached only through a name computed at run time
(``getattr(module, name)`` with a name that is not a constant, an attribute set on a module from outside), a
method of a class whose instances are made outside the notebook's process by code that does not name the class
(unpickling), and annotations (every module that defines functions uses ``from __future__ import annotations``,
under which they are not evaluated at run time). Within those limits it over-counts rather than misses: a name is followed in every
scope that could bind it, local variables that shadow a module-level name included.

Each module file's hash (:func:`reached_sources`) covers its module-level code and the reached functions and
classes, each as its syntax tree without docstrings, so that a change elsewhere in the file leaves it unchanged.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

TOP = "<module>"
"""The name of a module's module-level code among its chunks."""
WHOLE = "*"
"""In :func:`reach`'s answer: every chunk of the module."""
PURE_DECORATORS = frozenset({"dataclass", "field", "lru_cache", "cache", "wraps", "total_ordering", "no_grad",
                             "inference_mode", "contextmanager"})
"""Decorators, called with arguments, that only wrap or describe what they decorate (by their last name)."""
PYTEST_PLUGIN = "mentor.pytest_plugin"


@dataclass
class Chunk:
    """One piece of a module: its module-level code, or one top-level function or class."""

    fingerprint: str
    names: set[str] = field(default_factory=set)  # the names it reads
    bare: set[str] = field(default_factory=set)  # of those, the ones read other than as an attribute's base
    attributes: set[tuple[str, str]] = field(default_factory=set)  # (dotted base, attribute) pairs it reads
    aliases: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # its imports of mentor names
    whole: set[str] = field(default_factory=set)  # modules it names in a string
    always: bool = False  # runs, or changes behaviour, at import (see the module docstring)
    uses_globals: bool = False


@dataclass
class Module:
    """A ``mentor`` module, read into chunks (:data:`TOP` and one per top-level ``def`` or ``class``)."""

    name: str
    path: Path
    chunks: dict[str, Chunk]


def _last_name(node: ast.AST) -> str:
    while isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _imports(node: ast.AST, module: str) -> dict[str, tuple[str, str | None]]:
    """The ``mentor`` names an import statement in ``module`` binds: local name -> (module, name), with name None
    for a module. ``import mentor.x.y`` binds ``mentor`` and imports ``mentor.x.y``: it is keyed by a NUL and
    the module's name, so that the import is followed and ``mentor.x.y.f`` read as attributes."""
    out: dict[str, tuple[str, str | None]] = {}
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name == "mentor" or alias.name.startswith("mentor."):
                if alias.asname:
                    out[alias.asname] = (alias.name, None)
                else:
                    out["mentor"] = ("mentor", None)
                    out["\0" + alias.name] = (alias.name, None)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: ``module`` of a package's __init__ ends in ".__init__"
            base = ".".join(module.split(".")[: -node.level] + ([node.module] if node.module else []))
        if base == "mentor" or base.startswith("mentor."):
            for alias in node.names:
                out[alias.asname or alias.name] = (base, alias.name)
    return out


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


_LAUNCH = re.compile(r"(?:^|-m\s+|import\s+|from\s+)(mentor(?:\.\w+)+)")


def _mentor_strings(text: str) -> set[str]:
    """The ``mentor`` modules a string launches or imports: the whole string a dotted name (``"-m",
    "mentor.lab.worker"``), or a name after ``-m``, ``import`` or ``from`` in it (a command line, the text of a
    file that is run). A module named in other words (an error message) runs nothing.

    >>> sorted(_mentor_strings("mentor.lab.worker")), sorted(_mentor_strings("from mentor.syncs import sync_guard"))
    (['mentor.lab.worker'], ['mentor.syncs'])
    >>> _mentor_strings("re-run it with python mentor.lab.bench"), _mentor_strings("see mentor.lab.bench")
    (set(), set())
    """
    if re.fullmatch(r"mentor(?:\.\w+)+", text.strip()):
        return {text.strip()}
    return {m.group(1) for m in _LAUNCH.finditer(text)}


def _annotations(nodes: list[ast.AST]) -> set[int]:
    """The ids of every node inside an annotation of ``nodes``."""
    skipped: set[int] = set()
    for node in nodes:
        for n in ast.walk(node):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = [*n.args.posonlyargs, *n.args.args, *n.args.kwonlyargs, n.args.vararg, n.args.kwarg]
                for a in args:
                    if a is not None and a.annotation is not None:
                        skipped.update(id(x) for x in ast.walk(a.annotation))
                if n.returns is not None:
                    skipped.update(id(x) for x in ast.walk(n.returns))
            elif isinstance(n, ast.AnnAssign):
                skipped.update(id(x) for x in ast.walk(n.annotation))
    return skipped


def read_chunk(nodes: list[ast.AST], module: str, fingerprint: str) -> Chunk:
    """The references of ``nodes`` (one chunk's statements in ``module``), annotations and docstrings left out."""
    chunk = Chunk(fingerprint)
    docs = {id(n.value) for node in nodes for n in ast.walk(node)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
    skipped = _annotations(nodes)
    bases: set[int] = set()
    for node in nodes:
        for n in ast.walk(node):
            if id(n) in skipped:
                continue
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                chunk.aliases.update(_imports(n, module))
            elif isinstance(n, ast.Attribute):
                parts = _dotted(n)
                if parts is not None:
                    chunk.attributes.update((".".join(parts[:i]), parts[i]) for i in range(1, len(parts)))
                    inner = n
                    while isinstance(inner, ast.Attribute):
                        inner = inner.value
                    bases.add(id(inner))
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
                chunk.whole.update(_mentor_strings(n.value))
    for node in nodes:
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in skipped:
                chunk.names.add(n.id)
                if id(n) not in bases:
                    chunk.bare.add(n.id)
                if n.id == "globals":
                    chunk.uses_globals = True
    return chunk


def _strip_bodies(node: ast.AST) -> ast.AST:
    """A copy of a ``def`` or ``class`` statement cut to what runs at import: decorators, defaults, bases, and a
    class body's statements, its methods cut the same way."""
    import copy

    node = copy.deepcopy(node)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        node.body = [ast.Pass()]
    elif isinstance(node, ast.ClassDef):
        node.body = [_strip_bodies(n) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else n
                     for n in node.body]
    return node


def _calls_at_import(node: ast.AST) -> bool:
    """Whether a ``def`` or ``class`` statement calls, at import, something other than a :data:`PURE_DECORATORS`
    (a decorator with arguments, a call in a class body or in a default value)."""
    return any(isinstance(n, ast.Call) and _last_name(n) not in PURE_DECORATORS for n in ast.walk(_strip_bodies(node)))


def read_module(name: str, path: Path) -> Module:
    """``path`` (module ``name``; a package's ``__init__.py`` is read as ``name``) split into chunks; the same text
    read before is not parsed again."""
    return _read_module(name, path, path.read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=1024)
def _read_module(name: str, path: Path, text: str) -> Module:
    from nb.hashes import _tree_text, _without_bare_strings

    tree = _without_bare_strings(ast.parse(text))
    inside = name + ".__init__" if path.name == "__init__.py" else name
    chunks: dict[str, Chunk] = {}
    top: list[ast.AST] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            chunk = read_chunk([node], inside, _tree_text(node))
            chunk.always = _calls_at_import(node)
            chunks[node.name] = chunk
        else:
            top.append(node)
    chunks[TOP] = read_chunk(top, inside, _tree_text(top))
    chunks[TOP].always = True
    return Module(name, path, chunks)


class Reach:
    """The chunks of the ``mentor`` package at ``package`` that some code reaches: :meth:`from_code` follows them,
    :meth:`sources` hashes them, :attr:`reached` names them (module -> chunk names)."""

    def __init__(self, package: Path) -> None:
        self.package = package
        self._modules: dict[str, Module | None] = {}
        self.reached: dict[str, set[str]] = {}

    def module(self, name: str) -> Module | None:
        """Module ``name`` read from the package, or None when it is not one of its modules."""
        if name not in self._modules:
            parts = name.split(".")
            path = None
            if parts[0] == "mentor" and all(p.isidentifier() for p in parts):
                for candidate in (self.package.joinpath(*parts[1:]).with_suffix(".py") if parts[1:] else None,
                                  self.package.joinpath(*parts[1:], "__init__.py")):
                    if candidate is not None and candidate.is_file():
                        path = candidate
                        break
            self._modules[name] = None if path is None else read_module(name, path)
        return self._modules[name]

    def from_code(self, source: str) -> Reach:
        """Follow what Python ``source`` (a notebook's code cells, magics removed) reaches."""
        tree = ast.parse(source)
        root = read_chunk(list(tree.body), "__main__", "")
        if "pytest" in root.names or any(
                (isinstance(n, ast.Constant) and n.value == "pytest")
                or (isinstance(n, ast.Import) and any(a.name == "pytest" for a in n.names)) for n in ast.walk(tree)):
            root.whole.add(PYTEST_PLUGIN)
        self._follow(None, root)
        return self

    def _submodule(self, target: tuple[str, str | None]) -> tuple[str, str | None]:
        """``(module, name)`` as ``(module.name, None)`` when ``name`` is a submodule and not a name of the module."""
        module_name, name = target
        if name is not None and self.module(f"{module_name}.{name}") is not None:
            module = self.module(module_name)
            if module is None or name not in module.chunks:
                return f"{module_name}.{name}", None
        return target

    def _import(self, name: str) -> Module | None:
        """Import module ``name``: its packages, then its module-level code and what runs at its import."""
        module = self.module(name)
        if module is None or name in self.reached:
            return module
        self.reached[name] = set()
        if "." in name:
            self._import(name.rpartition(".")[0])
        for chunk_name, chunk in module.chunks.items():
            if chunk.always:
                self._include(module, chunk_name)
        return module

    def _whole(self, name: str) -> None:
        module = self._import(name)
        if module is not None:
            for chunk_name in module.chunks:
                self._include(module, chunk_name)

    def _include(self, module: Module, chunk_name: str) -> None:
        done = self.reached.setdefault(module.name, set())
        if chunk_name in done or chunk_name not in module.chunks:
            return
        done.add(chunk_name)
        chunk = module.chunks[chunk_name]
        if chunk.uses_globals:
            self._whole(module.name)
        self._follow(module, chunk)

    def _target(self, target: tuple[str, str | None], bare: bool = True) -> None:
        """Follow an imported name: ``(module, name)``, or ``(module, None)`` for the module itself, which counts
        whole when ``bare`` (used as a value), and only imported otherwise."""
        module_name, name = self._submodule(target)
        if name is None or name == "*":  # the module, or every name of it (``from mentor.x import *``)
            (self._whole if bare or name == "*" else self._import)(module_name)
            return
        module = self._import(module_name)
        if module is None:
            return
        if name in module.chunks:
            self._include(module, name)
            return
        top = module.chunks[TOP]
        if name in top.aliases:
            self._target(top.aliases[name])
        elif "__getattr__" in module.chunks:  # a name made on demand: the module's __getattr__ makes it
            self._include(module, "__getattr__")

    def _attributes(self, module_name: str, base: str, attributes: dict[str, set[str]]) -> None:
        """Follow the attributes read of module alias ``base`` (module ``module_name``), submodules included."""
        self._import(module_name)
        for attr in sorted(attributes.get(base, ())):
            child, name = self._submodule((module_name, attr))
            if name is None:
                self._import(child)
                self._attributes(child, f"{base}.{attr}", attributes)
                if f"{base}.{attr}" not in attributes:  # the submodule itself used as a value
                    self._whole(child)
            else:
                self._target((module_name, attr), bare=False)

    def _follow(self, module: Module | None, chunk: Chunk) -> None:
        """Follow what ``chunk`` of ``module`` (None: the notebook's code) reads."""
        for name in sorted(chunk.whole):
            self._whole(name)
        aliases = {**(module.chunks[TOP].aliases if module else {}), **chunk.aliases}
        for key, target in sorted(chunk.aliases.items()):  # the imports it runs
            module_name, name = self._submodule(target)
            self._import(module_name)
            if key.startswith("\0"):
                self._import(target[0])
            if name == "*":  # every public name of the module, read by names this analysis cannot tie to it
                self._whole(module_name)
        attributes: dict[str, set[str]] = {}
        for base, attr in chunk.attributes:
            attributes.setdefault(base, set()).add(attr)
        for name in sorted(chunk.names):
            target = aliases.get(name)
            if target is not None:
                target = self._submodule(target)
                if target[1] is None:
                    self._attributes(target[0], name, attributes)
                    if name in chunk.bare:
                        self._whole(target[0])
                else:
                    self._target(target)
            elif module is not None and name in module.chunks:
                self._include(module, name)

    def sources(self) -> dict[str, str]:
        """SHA-256 of each reached module file over its reached chunks' fingerprints (path relative to the package
        -> hash), sorted by path."""
        out = {}
        for name, chunks in self.reached.items():
            module = self.module(name)
            if module is not None:
                chosen = sorted((c, module.chunks[c].fingerprint) for c in chunks)
                out[str(module.path.relative_to(self.package))] = hashlib.sha256(
                    json.dumps(chosen).encode()).hexdigest()
        return dict(sorted(out.items()))
