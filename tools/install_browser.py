#!/usr/bin/env python3
"""Make sure Debian's Chromium is installed, for the JupyterLab-in-a-browser tests.

    python3 tools/install_browser.py      # prints the browser's path; installs it first if missing

The browser tests (tests/browser/) drive a real JupyterLab with the Python `playwright` package
and Debian's `chromium` (`/usr/bin/chromium`): Playwright's own browser download does not work
on the course's machines. When the browser is missing and we are root on a Debian-like system
(CI is), this runs `apt-get update` and `apt-get install -y chromium fonts-noto-color-emoji` (the
font draws the notebooks' emoji on the screenshots); otherwise it says what to run. Standard library only, so `course.py` can call it before the virtual environment exists.
Set COURSE_CHROMIUM to use another Chromium or Chrome binary.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT_CHROMIUM = Path("/usr/bin/chromium")


class BrowserMissing(RuntimeError):
    """Chromium is not installed and could not be installed from here."""


def chromium_path() -> Path:
    return Path(os.environ.get("COURSE_CHROMIUM", str(DEFAULT_CHROMIUM)))


def ensure_chromium(quiet: bool = False) -> Path:
    """The path of an installed Chromium; installs Debian's package first if it is missing."""
    path = chromium_path()
    if path.exists():
        return path
    if path != DEFAULT_CHROMIUM:
        raise BrowserMissing(f"COURSE_CHROMIUM={path} does not exist")
    apt = shutil.which("apt-get")
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if apt is None or not is_root:
        raise BrowserMissing(
            f"{path} is missing. Install Debian's chromium (as root: apt-get update && "
            "apt-get install -y chromium), point COURSE_CHROMIUM at a Chromium binary, or leave "
            "the browser tests out with pytest -m 'not browser'.")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    output = None if not quiet else subprocess.DEVNULL
    install = ["apt-get", "install", "-y", "chromium", "fonts-noto-color-emoji"]
    for command in (["apt-get", "update"], install):
        if not quiet:
            print("+", " ".join(command), flush=True)
        subprocess.run(command, check=True, env=env, stdout=output)
    if not path.exists():
        raise BrowserMissing(f"apt-get installed chromium but {path} is still missing")
    return path


def main() -> int:
    try:
        print(ensure_chromium())
    except (BrowserMissing, subprocess.CalledProcessError) as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
