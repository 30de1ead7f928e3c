#!/usr/bin/env python3
"""Make sure Debian's Chromium is installed, for the browser tests.

    python3 tools/install_browser.py      # prints the browser's path; installs it first if missing

The browser tests (tests/browser/) drive a real JupyterLab and the course website with the Python
`playwright` package and Debian's `chromium` (`/usr/bin/chromium`): Playwright's own browser
download does not work on the course's machines. Installing means, as root on a Debian-like
system, `apt-get update` and `apt-get install -y chromium fonts-noto-color-emoji` (the font draws
the notebooks' emoji on the screenshots). Standard library only, so `course.py` can call it before
the virtual environment exists. Set COURSE_CHROMIUM to use another Chromium or Chrome binary.

Who installs it, when it is missing:
- this script, run by hand: it installs (running it is the consent);
- the browser suite's fixture (`ensure_chromium(ask=...)`) in CI (CI=true): it installs, as CI
  machines expect;
- the fixture anywhere else: never silently. On a terminal it asks first (y/N); with no terminal
  to ask on, or on a "no", the browser tests are skipped with a message naming the one command
  that installs it (`install_command()`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

DEFAULT_CHROMIUM = Path("/usr/bin/chromium")
PACKAGES = ["chromium", "fonts-noto-color-emoji"]
SCRIPT = "tools/install_browser.py"


class BrowserMissing(RuntimeError):
    """Chromium is not installed and could not be installed from here."""


class BrowserNotInstalled(BrowserMissing):
    """Chromium is missing and, outside CI, nobody said yes to installing it: skip, don't fail."""


def chromium_path() -> Path:
    return Path(os.environ.get("COURSE_CHROMIUM", str(DEFAULT_CHROMIUM)))


def in_ci(environ: dict[str, str] | None = None) -> bool:
    """True on a CI machine: GitHub Actions, GitLab and most others set CI=true."""
    return (os.environ if environ is None else environ).get("CI", "").lower() == "true"


def can_install() -> bool:
    """apt-get is here and we are root: `install()` can work without a password."""
    return shutil.which("apt-get") is not None and hasattr(os, "geteuid") and os.geteuid() == 0


def install_command() -> str:
    """The one command that installs Chromium on this machine, as its user would type it."""
    if shutil.which("apt-get") is None:
        return ("your system's Chromium package, then COURSE_CHROMIUM=/path/to/chromium "
                "(no apt-get here)")
    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    return f"{'' if as_root else 'sudo '}python3 {SCRIPT}"


def ask_on_terminal(question: str, stdin: TextIO | None = None, stdout: TextIO | None = None
                    ) -> bool | None:
    """The user's yes (True) or no (False) to `question`; None when stdin is not a terminal."""
    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    if stdin is None or not stdin.isatty():
        return None
    stdout.write(f"{question} [y/N] ")
    stdout.flush()
    return stdin.readline().strip().lower() in ("y", "yes")


def install(quiet: bool = False) -> None:
    """apt-get update, then apt-get install -y the packages (root only; see `can_install`)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    output = None if not quiet else subprocess.DEVNULL
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", *PACKAGES]):
        if not quiet:
            print("+", " ".join(command), flush=True)
        subprocess.run(command, check=True, env=env, stdout=output)


def ensure_chromium(quiet: bool = False, ask: Callable[[str], bool | None] | None = None,
                    consent: bool = False) -> Path:
    """The path of an installed Chromium, installing Debian's package first if it is missing
    and we may: with `consent` (the user ran this script), in CI, or when `ask` (a question on
    the user's terminal, None when there is none) gets a yes. Otherwise BrowserNotInstalled,
    naming the command; BrowserMissing when it cannot be installed from here."""
    path = chromium_path()
    if path.exists():
        return path
    if path != DEFAULT_CHROMIUM:
        raise BrowserMissing(f"COURSE_CHROMIUM={path} does not exist")
    if not (consent or in_ci()):
        question = (f"The browser tests need Chromium ({path} is missing). Install it now with "
                    f"apt-get (apt-get update; apt-get install -y {' '.join(PACKAGES)})?")
        answer = ask(question) if ask is not None and can_install() else None
        if not answer:
            raise BrowserNotInstalled(
                f"Chromium is missing ({path}), so the browser tests are skipped. Install it "
                f"with: {install_command()}")
    if not can_install():
        raise BrowserMissing(
            f"{path} is missing. Install Debian's chromium with: {install_command()} (as root: "
            f"apt-get update && apt-get install -y {' '.join(PACKAGES)}), point COURSE_CHROMIUM "
            "at a Chromium binary, or leave the browser tests out with pytest -m 'not browser'.")
    install(quiet)
    if not path.exists():
        raise BrowserMissing(f"apt-get installed chromium but {path} is still missing")
    return path


def main() -> int:
    try:
        print(ensure_chromium(consent=True))
    except (BrowserMissing, subprocess.CalledProcessError) as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
