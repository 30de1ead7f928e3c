"""What the set-up cell calls: seeding repeats, the device is found, the printed line is
the same on every machine and torch version. (The cell itself: tests/lab/test_setup_cell.py.)"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.lab.environment import pick_device, seed_everything, start

ROOT = Path(__file__).resolve().parents[2]


def draw() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), torch.rand(()).item()


def test_seed_everything_repeats_every_generator():
    seed_everything(3)
    first = draw()
    seed_everything(3)
    assert draw() == first
    seed_everything(4)
    assert draw() != first


def test_start_prints_a_line_nbval_can_compare_and_no_version(capsys):
    device = start(seed=0)
    line = capsys.readouterr().out.strip()
    assert line == f"device: {device.type} | seed: 0"  # nothing that depends on the torch installed
    assert torch.__version__.split("+")[0] not in line
    assert device == pick_device()


def test_a_python_without_torch_is_told_the_one_command_that_installs_the_course():
    probe = "import sys; sys.modules['torch'] = None; import helpers.lab.environment"
    ran = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert ran.returncode == 1
    assert "this Python has no torch" in ran.stderr
    assert f'%pip install -e "{ROOT}"' in ran.stderr and "restart the kernel" in ran.stderr


def test_apple_silicon_stays_on_the_cpu_unless_asked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    assert pick_device().type == "cpu"
    monkeypatch.setenv("COURSE_DEVICE", "mps")
    assert pick_device().type == "mps"


def test_a_device_that_is_not_there_or_not_known_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    for asked, says in (("mps", "no MPS device"), ("cuda", "no CUDA device"), ("tpu", "cpu, cuda or mps")):
        monkeypatch.setenv("COURSE_DEVICE", asked)
        with pytest.raises(ValueError, match=says):
            pick_device()
