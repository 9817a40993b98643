"""scripts/nbtools.py, and the modules of scripts/nb/ that do its work, for the tests that need them (scripts/ is no
package: its folder goes on sys.path, as nbtools.py puts it there itself)."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "scripts") not in sys.path:
    sys.path.insert(0, str(REPO / "scripts"))
_spec = importlib.util.spec_from_file_location("nbtools", REPO / "scripts" / "nbtools.py")
nbtools = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nbtools)

from nb import book, check, convert, gpu, hashes, outputs, render, runs, waivers  # noqa: E402

__all__ = ["nbtools", "book", "check", "convert", "gpu", "hashes", "outputs", "render", "runs", "waivers"]
