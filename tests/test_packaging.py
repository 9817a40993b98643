"""The package as a reader installs it: the library needs torch and torchmetrics only, the lab's packages come with
the ``lab`` extra.

Two checks, each in another process (so the ``subprocess`` mark; neither needs the network):

- a Python whose import system finds neither the lab's packages (matplotlib, torchvision, tensorboard, tqdm) nor
  ``mentor.lab`` imports ``mentor`` and every library module, found by listing ``mentor/*.py`` so that a new module
  is checked as soon as it lands, and updates and computes ``FusedMetrics`` on the CPU. The packages are taken
  away as if they were not installed, their metadata too: torchmetrics imports matplotlib when the metadata says
  it is there (``_MATPLOTLIB_AVAILABLE = RequirementCache("matplotlib")``, torchmetrics/utilities/imports.py:52,
  read at torchmetrics/utilities/plot.py:25; RequirementCache reads the installed version first,
  lightning_utilities/core/imports.py:126-133), and ``import torch._dynamo`` probes ``importlib.util.find_spec``
  for tqdm and expects None for a missing package (torch/_dynamo/trace_rules.py:3802, torch 2.14.1), so a finder
  that raised ImportError there would fail an import that works without tqdm;
- pip builds a wheel from a copy of the tree (``--no-build-isolation --no-index``: the venv's setuptools, nothing
  downloaded), whose METADATA must require torch and torchmetrics and nothing else outside an extra, and which
  must ship ``mentor/py.typed`` and every module of the package, the lab's included.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from importlib import metadata, util
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "mentor"
LIBRARY = sorted(f"mentor.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__")
"""Every library module (mentor/*.py, private helpers and the pytest plugin included; not mentor.lab)."""
EXTRA_OF = {"mentor.lightning": "lightning"}
"""The library modules that need one of mentor's extras (pyproject.toml), by the extra's name; the others need none."""
LAB_PACKAGES = ("matplotlib", "torchvision", "tensorboard", "tqdm")
"""What the ``lab`` extra adds to the library's dependencies (import names, which are also the distributions')."""
UNIMPORTABLE = (*LAB_PACKAGES, "mentor.lab")
EXTRAS = {"lab": set(LAB_PACKAGES), "test": {"pytest", "hypothesis"}, "lightning": {"lightning"},
          "accelerate": {"accelerate"}}
"""mentor's extras and the distributions each adds."""

# Run by `python -c CHECK ARGS` from the repository root (so that it imports this tree's mentor); ARGS is the JSON of
# [the names to refuse, the modules to import, whether to run FusedMetrics]. It prints one JSON object.
CHECK = r'''
import importlib, importlib.metadata, importlib.util, json, re, sys

refused, modules, run_suite = json.loads(sys.argv[1])
already = sorted(m for m in sys.modules if any(m == r or m.startswith(r + ".") for r in refused))


def _refused(name):
    return any(name == r or name.startswith(r + ".") for r in refused)


def _normal(name):
    return re.sub(r"[-_.]+", "-", name).lower()


hidden = {_normal(r) for r in refused if "." not in r}


class WithoutThem:
    """A finder of sys.meta_path that finds none of the refused packages, nor their installed metadata.

    It answers as for a package that is not installed: find_spec gives None (importlib.util.find_spec's probes, which
    torch._dynamo makes for tqdm, see no package; an import raises ModuleNotFoundError), and importlib.metadata, which
    asks every finder for distributions, sees none of theirs."""

    def __init__(self, finder):
        self.finder = finder

    def __getattr__(self, attribute):
        return getattr(self.finder, attribute)

    def find_spec(self, name, path=None, target=None):
        return None if _refused(name) else self.finder.find_spec(name, path, target)

    def find_distributions(self, *args, **kwargs):
        find = getattr(self.finder, "find_distributions", None)  # a finder without it finds no distribution
        return () if find is None else (d for d in find(*args, **kwargs)
                                        if _normal(d.metadata["Name"] or "") not in hidden)


sys.meta_path[:] = [WithoutThem(finder) for finder in sys.meta_path]
for module in ["mentor", *modules]:
    importlib.import_module(module)  # an import of a refused package ends the process here, with its traceback
out = {"already": already, "imported": sorted(m for m in sys.modules if m == "mentor" or m.startswith("mentor.")),
       "loaded": sorted(m for m in sys.modules if _refused(m))}

if run_suite:
    import torch
    from mentor.suite import FusedMetrics

    metrics = FusedMetrics(num_classes=4, per_class=True)
    logits = torch.tensor([[4.0, 0, 0, 0], [0, 4.0, 0, 0], [0, 4.0, 0, 0], [4.0, 0, 0, 0]])  # predicts 0, 1, 1, 0
    metrics.update(torch.tensor(0.5), logits, torch.tensor([0, 0, 1, 2]))
    metrics.update(torch.tensor(0.25), torch.tensor([0, 0, 2, 3]), torch.tensor([0, 0, 1, 3]))
    out["suite"] = {name: value.tolist() for name, value in metrics.compute().items()}

# the refusals themselves, last (a probe of mentor.lab imports mentor): each must fail as for a missing package
out["probes"] = {}
for name in refused:
    try:
        importlib.import_module(name)
        out["probes"][name] = "imported"
    except ModuleNotFoundError:
        out["probes"][name] = "refused" if importlib.util.find_spec(name) is None else "found but not imported"
for name in hidden:
    try:
        importlib.metadata.version(name)
        out["probes"][f"metadata of {name}"] = "found"
    except importlib.metadata.PackageNotFoundError:
        out["probes"][f"metadata of {name}"] = "hidden"
print(json.dumps(out))
'''


def _installs(requirements: list[str]) -> set[str]:
    """The distributions that installing ``requirements`` brings, by normalized name: them and, transitively, their
    unconditional requirements, as the installed distributions' metadata states them."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in seen or (requirement.marker is not None and not requirement.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            todo += [Requirement(r) for r in metadata.requires(name) or []]
        except metadata.PackageNotFoundError:
            pass
    return seen


def _check(refused: list[str], modules: list[str], run_suite: bool) -> dict:
    done = subprocess.run([sys.executable, "-c", CHECK, json.dumps([refused, modules, run_suite])],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, f"importing {modules} without {refused} failed:\n{done.stderr[-6000:]}"
    return json.loads(done.stdout.splitlines()[-1])


def _refused_all(result: dict, refused: list[str]) -> None:
    """The process really lacked the refused packages: none was imported before or after, and each probe failed."""
    assert result["already"] == [] and result["loaded"] == []
    hidden = [name for name in refused if "." not in name]
    assert result["probes"] == {**dict.fromkeys(refused, "refused"),
                                **{f"metadata of {name}": "hidden" for name in hidden}}


def test_the_library_modules_are_found_by_listing_the_package() -> None:
    assert {"mentor.suite", "mentor.syncs", "mentor.readback", "mentor.pytest_plugin", "mentor._fused_kernel"} <= set(
        LIBRARY)
    assert not any(name.startswith("mentor.lab") for name in LIBRARY)
    assert set(EXTRA_OF) <= set(LIBRARY), f"EXTRA_OF names a module that is gone: {set(EXTRA_OF) - set(LIBRARY)}"


@pytest.mark.subprocess
def test_the_library_imports_and_computes_without_the_labs_packages() -> None:
    modules = [name for name in LIBRARY if name not in EXTRA_OF]
    result = _check(list(UNIMPORTABLE), modules, run_suite=True)
    _refused_all(result, list(UNIMPORTABLE))
    assert set(result["imported"]) >= {"mentor", *modules}
    expected = {"loss": 0.375, **{f"{score}_{average}": value for score in ("accuracy", "precision", "recall", "f1")
                                  for average, value in (("micro", 0.625), ("macro", 0.5625), ("weighted", 0.625),
                                                         ("per_class", [0.75, 0.5, 0.0, 1.0]))}}
    # 8 labels, 5 right: per class (tp, fp, fn) = (3, 1, 1), (1, 1, 1), (0, 1, 1), (1, 0, 0); every value is exact
    assert {name: result["suite"].get(name) for name in expected} == expected


@pytest.mark.subprocess
@pytest.mark.parametrize("module", sorted(EXTRA_OF))
def test_a_module_of_an_extra_imports_with_that_extras_packages_only(module: str) -> None:
    """mentor.lightning needs mentor[lightning]: lightning brings tqdm, so only the lab's other packages are refused."""
    extra = EXTRA_OF[module]
    for name in sorted(EXTRAS[extra]):
        if util.find_spec(name) is None:
            pytest.skip(f"{module} needs mentor[{extra}]: {name} is not installed here")
    brought = _installs(sorted(EXTRAS[extra]))
    refused = [name for name in UNIMPORTABLE if canonicalize_name(name) not in brought]
    assert "mentor.lab" in refused and "matplotlib" in refused
    result = _check(refused, [module], run_suite=False)
    _refused_all(result, refused)
    assert module in result["imported"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    """A wheel built by pip from a copy of what the build reads (pyproject.toml, README.md, LICENSE, mentor/), with
    the setuptools of this environment (torch 2.14.1 requires setuptools>=77.0.3, what pyproject.toml's
    build-system asks for) and nothing from an index."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    shutil.copytree(PACKAGE, source / "mentor", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source)
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-q", str(source), "-w", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    (built,) = out.glob("mentor-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


def _dist_info(archive: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in archive.namelist() if re.fullmatch(rf"mentor-[^/]+\.dist-info/{name}", n)]
    return archive.read(path).decode()


@pytest.mark.subprocess
def test_the_wheel_requires_torch_and_torchmetrics_and_puts_the_rest_under_extras(wheel: zipfile.ZipFile) -> None:
    fields = Parser().parsestr(_dist_info(wheel, "METADATA"))
    requirements = [Requirement(r) for r in fields.get_all("Requires-Dist") or []]
    assert sorted(canonicalize_name(r.name) for r in requirements if r.marker is None) == ["torch", "torchmetrics"]
    by_extra: dict[str, set[str]] = {}
    for requirement in (r for r in requirements if r.marker is not None):
        match = re.fullmatch(r'extra == "([\w-]+)"', str(requirement.marker))
        assert match, f"{requirement} is required outside an extra"
        by_extra.setdefault(match[1], set()).add(canonicalize_name(requirement.name))
    assert by_extra == EXTRAS
    assert set(fields.get_all("Provides-Extra") or []) == set(EXTRAS)


@pytest.mark.subprocess
def test_the_wheel_ships_py_typed_every_module_and_the_plugins_entry_point(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert "mentor/py.typed" in names and wheel.read("mentor/py.typed") == b""
    modules = {p.relative_to(REPO).as_posix() for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    assert modules and "mentor/lab/__init__.py" in modules
    assert modules <= names, f"not in the wheel: {sorted(modules - names)}"
    assert not [n for n in names if n.split("/")[0] in ("tests", "book", "scripts")]
    points = configparser.ConfigParser()
    points.read_string(_dist_info(wheel, "entry_points.txt"))
    assert dict(points["pytest11"]) == {"mentor": "mentor.pytest_plugin"}
