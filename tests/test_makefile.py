"""The Makefile's venv rule: which interpreter creates .venv, and the error for one too old for the pins."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _copy(tmp_path: Path) -> Path:
    """The Makefile and the files its venv rule depends on, in a folder with no .venv."""
    for name in ("Makefile", "requirements.txt", "constraints.txt", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path)
    return tmp_path


def test_the_venv_is_created_from_python_when_it_names_another_interpreter(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    plan = subprocess.run(["make", "-n", "test", "PYTHON=/opt/py/python3.12"], cwd=folder,
                          capture_output=True, text=True, check=True).stdout
    assert "|| /opt/py/python3.12 -m venv .venv" in plan
    plan = subprocess.run(["make", "-n", "test"], cwd=folder, capture_output=True, text=True, check=True).stdout
    assert "|| python3 -m venv .venv" in plan
    assert ".venv/bin/python -m pytest" in plan


def test_an_interpreter_older_than_3_11_is_refused_by_name(tmp_path: Path) -> None:
    """An interpreter that reports Python 3.10 (a real one, told to report that version) stops make before the venv
    is made, with a message that names it, says what the pins need and how to pass another."""
    folder = _copy(tmp_path)
    fake = folder / "python3.10"
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.version_info = (3, 10, 14)\n"
                    "sys.version = '3.10.14 (told)'\nexec(sys.argv[2])\n")
    fake.chmod(0o755)
    made = subprocess.run(["make", "book", f"PYTHON={fake}"], cwd=folder, capture_output=True, text=True)
    assert made.returncode != 0
    assert (f"{fake} is Python 3.10.14; the pins of requirements.txt need Python 3.11 or later: "
            "name one with PYTHON, e.g. PYTHON=python3.11 make book") in made.stderr
    assert not (folder / ".venv").exists()
