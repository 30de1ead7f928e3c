"""Notebook set-up: one call that seeds every generator, picks a device and styles the figures.

Every notebook's first code cell is the same text, `SETUP_CELL`: in a fresh Colab runtime it
installs this package from `COURSE_REPO` (the one place the address is written), locally it only
imports. `tools/build_notebooks.py` writes it into every notebook and a test checks that none
drifts from it.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

COURSE_REPO = "https://github.com/transformer-course/transformer-course"

SETUP_CELL = f'''\
import importlib.util, os, sys  # set-up: in a fresh Colab runtime this installs the course package first
if importlib.util.find_spec("helpers") is None and os.system(f'"{{sys.executable}}" -m pip install -q git+{COURSE_REPO}'):
    raise SystemExit("Could not install the course from {COURSE_REPO}: upload the course folder and run !pip install ./FOLDER, or see the README's 'In Colab'.")
from helpers.lab.environment import start
device = start(seed=0)'''


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and PyTorch's generators (CPU and every GPU) with `seed`."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds CUDA and MPS generators
    os.environ["PYTHONHASHSEED"] = str(seed)  # for subprocesses; this one's hash seed is fixed


def pick_device() -> torch.device:
    """The fastest device present: CUDA, then Apple's MPS, then the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def start(seed: int = 0, quiet: bool = False) -> torch.device:
    """Seed everything, pick the device, style the figures; print one line saying what was picked.

    The printed line is `device: <type>` and `seed: <seed>`; only the device type is machine
    dependent, and the tests' nbval sanitiser maps it to one word.
    """
    seed_everything(seed)
    device = pick_device()
    torch.set_printoptions(precision=4, sci_mode=False)
    np.set_printoptions(precision=4, suppress=True)
    from helpers.lab import plots  # matplotlib is imported only by notebooks, never by model code

    plots.use_course_style()
    if not quiet:
        print(f"device: {device.type} | seed: {seed} | torch {torch.__version__.split('+')[0]}")
    return device
