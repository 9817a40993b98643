"""Write the Sphinx inventories (objects.inv) that link the API reference to Python, PyTorch and TorchMetrics.

The book builds without network, so intersphinx cannot fetch the projects' own inventories. These small
inventories list only the names that mentor's signatures and docstrings use, each with its page in the
project's published documentation. `python scripts/inventories.py` rewrites book/_inv/*.inv;
`--check` fails when the committed files list other names or pages than this script writes (tests/test_book.py runs it).
Add a name here when a new signature needs it; a name missing from here stays plain text in the book.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "book" / "_inv"

# project: (version, {name: (role, uri relative to the project's docs root)})
INVENTORIES: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "python": ("3", {
        "collections.Counter": ("class", "library/collections.html#collections.Counter"),
        "collections.abc.Callable": ("class", "library/collections.abc.html#collections.abc.Callable"),
        "collections.abc.Iterable": ("class", "library/collections.abc.html#collections.abc.Iterable"),
        "collections.abc.Iterator": ("class", "library/collections.abc.html#collections.abc.Iterator"),
        "collections.abc.Mapping": ("class", "library/collections.abc.html#collections.abc.Mapping"),
        "collections.abc.Sequence": ("class", "library/collections.abc.html#collections.abc.Sequence"),
        "os.PathLike": ("class", "library/os.html#os.PathLike"),
        "pathlib.Path": ("class", "library/pathlib.html#pathlib.Path"),
    }),
    "torch": ("stable", {
        "torch.Tensor": ("class", "tensors.html#torch.Tensor"),
        "torch.device": ("class", "tensor_attributes.html#torch.device"),
        "torch.dtype": ("class", "tensor_attributes.html#torch.dtype"),
        # autodoc writes these classes under the module that defines them
        "torch.nn.modules.module.Module": ("class", "generated/torch.nn.Module.html#torch.nn.Module"),
        "torch.optim.optimizer.Optimizer": ("class", "optim.html#torch.optim.Optimizer"),
        "torch.profiler.profiler.profile": ("class", "profiler.html#torch.profiler.profile"),
        "torch.utils.data.dataloader.DataLoader": ("class", "data.html#torch.utils.data.DataLoader"),
        "torch.utils.data.dataset.Dataset": ("class", "data.html#torch.utils.data.Dataset"),
    }),
    "torchmetrics": ("stable", {
        "torchmetrics.metric.Metric": ("class", "references/metric.html#torchmetrics.Metric"),
        "torchmetrics.collections.MetricCollection": ("class", "pages/overview.html#metriccollection"),
        "torchmetrics.classification.stat_scores.MulticlassStatScores": (
            "class", "classification/stat_scores.html#torchmetrics.classification.MulticlassStatScores"),
    }),
}


def inventory(project: str, version: str, names: dict[str, tuple[str, str]]) -> bytes:
    """The bytes of a version-2 Sphinx inventory for ``names``."""
    header = ("# Sphinx inventory version 2\n"
              f"# Project: {project}\n# Version: {version}\n"
              "# The remainder of this file is compressed using zlib.\n").encode()
    body = "".join(f"{name} py:{role} 1 {uri} -\n" for name, (role, uri) in sorted(names.items()))
    return header + zlib.compress(body.encode(), 9)


def _text(data: bytes) -> str:
    """An inventory's header and decompressed body (zlib's bytes may differ between zlib builds)."""
    lines = data.split(b"\n", 4)
    try:
        return (b"\n".join(lines[:4]) + b"\n" + zlib.decompress(lines[4])).decode()
    except (IndexError, zlib.error):
        return "not an inventory"


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print("usage: python scripts/inventories.py [--check]", file=sys.stderr)
        return 2
    stale = []
    for project, (version, names) in INVENTORIES.items():
        path = OUT / f"{project}.inv"
        data = inventory(project, version, names)
        if check:
            if not path.is_file() or _text(path.read_bytes()) != _text(data):
                stale.append(str(path))
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    if stale:
        print("out of date: " + ", ".join(stale) + "; run `python scripts/inventories.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
