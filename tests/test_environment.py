"""The set-up cell's helpers: seeding repeats, the device is found, the cell text is canonical."""

from __future__ import annotations

import random

import numpy as np
import torch

from helpers.environment import COURSE_REPO, SETUP_CELL, pick_device, seed_everything, start


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
    assert f"git+{COURSE_REPO}" in SETUP_CELL
    assert 'find_spec("helpers") is None' in SETUP_CELL
    compile(SETUP_CELL, "<setup cell>", "exec")
