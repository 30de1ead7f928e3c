"""The set-up cell's helpers: seeding repeats, the device is found, the cell text is canonical."""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest
import torch

from helpers.lab.environment import COURSE_REPO, SETUP_CELL, pick_device, seed_everything, start


def draw() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), torch.rand(()).item()


def test_seed_everything_repeats_every_generator():
    seed_everything(3)
    first = draw()
    seed_everything(3)
    assert draw() == first
    seed_everything(4)
    assert draw() != first


def test_start_prints_a_line_nbval_can_compare(capsys):
    device = start(seed=0)
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"device: {device.type} | seed: 0 | torch ")
    assert device == pick_device()


def test_setup_cell_installs_from_the_one_repository_address_only_when_needed():
    assert f"pip install -q git+{COURSE_REPO}'" in SETUP_CELL
    assert 'find_spec("helpers") is None and os.system(' in SETUP_CELL
    compile(SETUP_CELL, "<setup cell>", "exec")


def test_setup_cell_is_at_most_five_lines_before_the_first_idea():
    assert len(SETUP_CELL.splitlines()) <= 5


def test_setup_cell_says_what_to_do_when_the_install_fails(tmp_path):
    """Run the cell where `helpers` cannot be found and pip fails: it must stop with advice."""
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\necho 'ERROR: repository not found' >&2\nexit 1\n")
    fake_python.chmod(0o755)
    cell = SETUP_CELL.replace('find_spec("helpers")', 'find_spec("no_such_course_package")')
    namespace = {"__name__": "setup_cell"}
    sys_executable = sys.executable
    try:
        sys.executable = str(fake_python)
        with pytest.raises(SystemExit) as stop:
            exec(compile(cell, "<setup cell>", "exec"), namespace)
    finally:
        sys.executable = sys_executable
    message = str(stop.value)
    assert COURSE_REPO in message
    assert "pip install ./FOLDER" in message and "'In Colab'" in message
