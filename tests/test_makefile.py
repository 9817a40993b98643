"""The Makefile: its venv rule (which interpreter creates .venv, the error for one too old for the pins), and
the browser target of `make test` (which Chromium it installs, and its message when it cannot)."""

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


# `make browser` (a prerequisite of `make test`): the Chromium of the browser test, installed when there is none.
NO_CHROMIUM = ("make test needs Chromium for tests/test_browser.py: run `sudo apt-get install chromium` or "
               "`.venv/bin/python -m playwright install chromium` (or set MENTOR_CHROMIUM=/path/to/chromium, "
               "or MENTOR_SKIP_BROWSER=1 to skip the browser test)")
CHECK = "python tests/site_browser.py"  # the question `make browser` asks: is there a Chromium to drive?
APT = ["apt-get update -qq",
       "apt-get install -y -qq --no-install-recommends chromium (DEBIAN_FRONTEND=noninteractive)"]
PLAYWRIGHT = "python -m playwright install chromium"

# The stand-ins, run by this interpreter: each appends the command it was given to $STUB_LOG. `.venv/bin/python`
# runs everything but Playwright's install with this interpreter (so the question is asked for real, of a HOME with
# no ~/.cache/ms-playwright); the install puts an empty executable where Playwright keeps its Chromium, apt-get's
# puts one at bin/chromium; $STUB_FAILS names the commands that fail instead. `id -u` prints $STUB_UID.
_STUB = f"""#!{sys.executable}
import os, stat, sys
from pathlib import Path

def log(line):
    with open(os.environ["STUB_LOG"], "a") as out:
        out.write(line + "\\n")

def executable(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)

name, args = Path(sys.argv[0]).name, sys.argv[1:]
if name == "id":
    print(os.environ["STUB_UID"] if args == ["-u"] else "uid=" + os.environ["STUB_UID"])
    sys.exit(0)
frontend = os.environ.get("DEBIAN_FRONTEND")
log(" ".join(["python" if name == "python" else name, *args]) + (f" (DEBIAN_FRONTEND={{frontend}})" if frontend else ""))
if name == "python" and args != ["-m", "playwright", "install", "chromium"]:
    os.execv(sys.executable, [sys.executable, *args])
if args[:1] and args[0] in os.environ.get("STUB_FAILS", "").split() or name in os.environ.get("STUB_FAILS", "").split():
    sys.exit(100)
if name == "apt-get" and args[:1] == ["install"]:
    executable(Path(os.environ["STUB_BIN"]) / "chromium")
if name == "python":
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        executable(Path(playwright.chromium.executable_path))
"""


def _browser_folder(tmp_path: Path, *, apt: bool, chromium: bool = False) -> tuple[Path, Path]:
    """A copy of the Makefile and tests/site_browser.py with an installed .venv of stand-ins, and a bin folder
    (the only one on PATH) with `id`, and `apt-get` and `chromium` when asked for."""
    (tmp_path / "repo").mkdir()
    folder = _copy(tmp_path / "repo")
    (folder / "tests").mkdir()
    shutil.copy(REPO / "tests" / "site_browser.py", folder / "tests")
    bin_ = tmp_path / "bin"
    for path in [folder / ".venv" / "bin" / "python", bin_ / "id"] + ([bin_ / "apt-get"] if apt else []):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_STUB)
        path.chmod(0o755)
    if chromium:
        (bin_ / "chromium").write_text("#!/bin/sh\n")
        (bin_ / "chromium").chmod(0o755)
    (folder / ".venv" / ".installed").touch()  # newer than requirements.txt etc.: the venv rule does not run
    return folder, bin_


def _make_browser(folder: Path, bin_: Path, uid: int, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`make browser` with only ``bin_`` on PATH and an empty HOME; its result and the commands the stand-ins ran."""
    log = folder.parent / "commands.log"
    log.write_text("")
    home = folder.parent / "home"
    home.mkdir(exist_ok=True)
    made = subprocess.run([shutil.which("make"), "browser"], cwd=folder, capture_output=True, text=True,
                          env={"PATH": str(bin_), "HOME": str(home), "STUB_LOG": str(log), "STUB_BIN": str(bin_),
                               "STUB_UID": str(uid), **env})
    return made, log.read_text().splitlines()


def _found(folder: Path, bin_: Path) -> str:
    """The Chromium the browser test drives, in the environment `make browser` ran in."""
    return subprocess.run([sys.executable, "tests/site_browser.py"], cwd=folder, capture_output=True, text=True,
                          env={"PATH": str(bin_), "HOME": str(folder.parent / "home")}).stdout.strip()


def test_make_test_runs_the_browser_target_before_pytest(tmp_path: Path) -> None:
    plan = subprocess.run(["make", "-n", "test"], cwd=_copy(tmp_path), capture_output=True, text=True,
                          check=True).stdout
    assert ".venv/bin/python tests/site_browser.py >/dev/null" in plan
    assert plan.index("tests/site_browser.py") < plan.index(".venv/bin/python -m pytest")


def test_a_chromium_on_path_is_used_and_nothing_is_installed(tmp_path: Path) -> None:
    folder, bin_ = _browser_folder(tmp_path, apt=True, chromium=True)
    made, ran = _make_browser(folder, bin_, uid=0)
    assert (made.returncode, made.stdout, made.stderr) == (0, "", "")
    assert ran == [CHECK]
    assert _found(folder, bin_) == str(bin_ / "chromium")


@pytest.mark.parametrize("env", [{"MENTOR_SKIP_BROWSER": "1"}, {"MENTOR_CHROMIUM": "/opt/chrome/chrome"}])
def test_nothing_is_asked_or_installed_when_the_browser_test_is_skipped_or_given_a_chromium(tmp_path, env) -> None:
    folder, bin_ = _browser_folder(tmp_path, apt=True)
    made, ran = _make_browser(folder, bin_, uid=0, **env)
    assert (made.returncode, made.stderr, ran) == (0, "", [])


def test_as_root_with_apt_debians_chromium_is_installed(tmp_path: Path) -> None:
    folder, bin_ = _browser_folder(tmp_path, apt=True)
    made, ran = _make_browser(folder, bin_, uid=0)
    assert made.returncode == 0, made.stderr
    assert ran == [CHECK, *APT, CHECK, CHECK]
    assert made.stdout == "no Chromium for the browser test: installing Debian's chromium package\n"
    assert _found(folder, bin_) == str(bin_ / "chromium")


@pytest.mark.parametrize(("uid", "apt"), [(1000, True), (0, False)], ids=["not root", "no apt-get"])
def test_without_root_or_apt_playwrights_chromium_is_installed_and_found(tmp_path: Path, uid: int, apt: bool) -> None:
    folder, bin_ = _browser_folder(tmp_path, apt=apt)
    made, ran = _make_browser(folder, bin_, uid=uid)
    assert made.returncode == 0, made.stderr
    assert ran == [CHECK, CHECK, PLAYWRIGHT, CHECK]
    assert made.stdout == "no Chromium for the browser test: installing Playwright's own\n"
    # the browser test finds it where Playwright keeps it, in the HOME make ran with
    found = Path(_found(folder, bin_))
    assert found.is_file() and found.is_relative_to(folder.parent / "home" / ".cache" / "ms-playwright")


def test_when_apt_fails_playwrights_chromium_is_installed(tmp_path: Path) -> None:
    folder, bin_ = _browser_folder(tmp_path, apt=True)
    made, ran = _make_browser(folder, bin_, uid=0, STUB_FAILS="install")
    assert made.returncode == 0, made.stderr
    assert ran == [CHECK, *APT, CHECK, PLAYWRIGHT, CHECK]
    assert Path(_found(folder, bin_)).is_relative_to(folder.parent / "home" / ".cache" / "ms-playwright")


@pytest.mark.parametrize(("uid", "fails"), [(1000, "python"), (0, "apt-get python")], ids=["not root", "both fail"])
def test_with_no_way_to_install_chromium_make_stops_with_one_message(tmp_path: Path, uid: int, fails: str) -> None:
    folder, bin_ = _browser_folder(tmp_path, apt=True)
    made, ran = _make_browser(folder, bin_, uid=uid, STUB_FAILS=fails)
    assert made.returncode != 0
    assert ran == [CHECK, *(APT[:1] if uid == 0 else []), CHECK, PLAYWRIGHT, CHECK]
    # the message, then make's own line for the failed target: no traceback, nothing else
    message, make_line = made.stderr.splitlines()
    assert message == NO_CHROMIUM
    assert make_line.startswith("make: *** [Makefile:") and make_line.endswith("browser] Error 1")


def test_ci_leaves_the_chromium_to_make_test() -> None:
    commands = [line for line in (REPO / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert commands == ["make test"]
