"""scripts/nbtools.py for the tests that need it (scripts/ is no package)."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("nbtools", REPO / "scripts" / "nbtools.py")
nbtools = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nbtools)
