"""A real JupyterLab server on 127.0.0.1 and a real headless Chromium to drive it.

`LabServer` starts `jupyter-lab` from this Python's environment on copies of the notebooks (Lab
saves what it opens), with a token, `--allow-root`, no port retries and a settings directory of
its own that turns off the news and update checks; `stop()` shuts its kernels down and ends the
server by its own PID. `launch_chromium` starts Debian's Chromium through Playwright with the
flags the course's machines need.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]

# Lab settings for the test server: no news feed, no update check, no toasts over the notebook.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false", "checkForUpdates": False},
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LabServer:
    """`jupyter-lab` serving `root_dir` on 127.0.0.1; use as a context manager or call stop()."""

    def __init__(self, root_dir: Path, state_dir: Path, log_path: Path) -> None:
        self.root_dir = root_dir
        self.state_dir = state_dir
        self.log_path = log_path
        self.token = secrets.token_hex(16)
        self.port = 0
        self.process: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # The kernel should meet matplotlib as a student's JupyterLab does: the inline backend
        # (the test command's MPLBACKEND=Agg would turn every figure into nothing).
        env.pop("MPLBACKEND", None)
        for name in ("config", "data", "runtime"):
            (self.state_dir / name).mkdir(parents=True, exist_ok=True)
            env[f"JUPYTER_{name.upper()}_DIR"] = str(self.state_dir / name)
        env["JUPYTER_PLATFORM_DIRS"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _write_settings(self) -> Path:
        settings = self.state_dir / "lab-settings"
        for relative, values in LAB_SETTINGS.items():
            path = settings / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values, indent=2))
        return settings

    def start(self, timeout: float = 120.0) -> LabServer:
        settings = self._write_settings()
        workspaces = self.state_dir / "workspaces"
        workspaces.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # closed in stop()
        for _attempt in range(3):  # a port taken between free_port() and the bind: try another
            self.port = free_port()
            command = [
                sys.executable, "-m", "jupyterlab", "--no-browser",
                "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
                "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
                "--allow-root", f"--ServerApp.root_dir={self.root_dir}",
                f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={workspaces}",
                "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
            ]
            self.process = subprocess.Popen(command, cwd=self.root_dir, env=self._environment(),
                                            stdout=self._log, stderr=subprocess.STDOUT)
            if self._wait_until_ready(timeout):
                return self
            self._end_process()
        raise RuntimeError(f"jupyter-lab did not start; see {self.log_path}:\n{self.log_tail()}")

    def _wait_until_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                self.api("GET", "/api/status")
                return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        return False

    def api(self, method: str, path: str) -> object:
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def lab_url(self, notebook: str) -> str:
        return f"{self.url}/lab/tree/{notebook}?token={self.token}&reset"

    def shutdown_kernels(self) -> None:
        """Shut every running kernel down through the REST API, as Lab's "Shut Down All" does."""
        for kernel in self.api("GET", "/api/kernels"):
            try:
                self.api("DELETE", f"/api/kernels/{kernel['id']}")
            except urllib.error.HTTPError as error:
                if error.code != 404:
                    raise

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _end_process(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)  # this server's own PID, nothing broader
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                self.shutdown_kernels()
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # the server is going anyway; stopping it ends its kernels too
        self._end_process()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LabServer:
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()


def copy_notebooks(paths: list[Path], target: Path) -> Path:
    """Copy the notebooks into `target` (Lab saves what it opens: never serve the originals)."""
    target.mkdir(parents=True, exist_ok=True)
    for path in paths:
        shutil.copy2(path, target / path.name)
    return target


def launch_chromium(playwright, executable: Path):
    """Debian's Chromium, headless, through Playwright (its own browser download is not used)."""
    return playwright.chromium.launch(executable_path=str(executable), headless=True,
                                      args=CHROMIUM_FLAGS)
