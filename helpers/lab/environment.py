"""Notebook set-up: one call that seeds every generator, picks a device and styles the figures.

Every notebook's first code cell is the same text, `helpers.lab.setup_cell.SETUP_CELL` (beside
`COURSE_REPO`, the one place the course's address is written): it finds the course's `helpers/`
beside the notebook or installs it, then calls `start`. `tools/build_notebooks.py` writes it
into every notebook and a test checks that none drifts from it.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

try:
    import numpy as np
    import torch
except ImportError as missing:  # a Jupyter (Anaconda, a JupyterHub) whose Python lacks the course's needs
    course = Path(__file__).resolve().parents[2]
    command = f'%pip install -e "{course}"' if (course / "pyproject.toml").is_file() else "%pip install torch numpy"
    raise SystemExit(f"this Python has no {missing.name}, which the course needs: run  {command}  in "
                     "a notebook, then restart the kernel") from missing


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and PyTorch's generators (CPU and every GPU) with `seed`."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds CUDA and MPS generators
    os.environ["PYTHONHASHSEED"] = str(seed)  # for subprocesses; this one's hash seed is fixed


def pick_device() -> torch.device:
    """CUDA where there is a GPU, else the CPU. Apple's MPS only when asked (COURSE_DEVICE=mps):
    its kernels round differently and miss some operations, so on a Mac the course's outputs are
    the CPU's unless the student chooses otherwise."""
    asked = os.environ.get("COURSE_DEVICE", "").strip().lower()
    if asked not in ("", "cpu", "cuda", "mps"):
        raise ValueError(f"COURSE_DEVICE must be cpu, cuda or mps, got {asked!r}")
    if asked == "cpu":
        return torch.device("cpu")
    if asked == "mps":
        if getattr(torch.backends, "mps", None) is None or not torch.backends.mps.is_available():
            raise ValueError("COURSE_DEVICE=mps, but this machine has no MPS device (Apple silicon with "
                             "a torch built for it)")
        return torch.device("mps")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if asked == "cuda":
        raise ValueError("COURSE_DEVICE=cuda, but torch sees no CUDA device here")
    return torch.device("cpu")


def start(seed: int = 0, quiet: bool = False, projector: bool | None = None) -> torch.device:
    """Seed everything, pick the device, style the figures; print one line saying what was picked.

    The printed line is `device: <type> | seed: <seed>`, and no version: nothing a notebook prints
    may depend on the installed torch or Python. Only the device type is machine dependent, and
    the tests' nbval sanitiser maps it to one word. projector=True (default: the environment
    variable COURSE_PROJECTOR=1) draws figures for the back row of a lecture hall
    (`helpers.lab.plots.use_course_style`).
    """
    if projector is not None and not isinstance(projector, bool):
        raise TypeError(f"projector must be True, False or None, got {projector!r}")
    seed_everything(seed)
    device = pick_device()
    torch.set_printoptions(precision=4, sci_mode=False)
    np.set_printoptions(precision=4, suppress=True)
    from helpers.lab import plots  # matplotlib is imported only by notebooks, never by model code

    plots.use_course_style(projector)
    if not quiet:
        print(f"device: {device.type} | seed: {seed}")
    return device
