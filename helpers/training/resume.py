"""Save a training run of any model and optimizer, and resume it where it stopped (notebook 11).

`helpers.model.checkpoints` saves the course's own GPTs and rebuilds them from their config.
A run of any other model is resumed into a model and an optimizer the user builds again the
same way; the file carries what they cannot rebuild:

    save_run(path, model, optimizer, step, **extra)   weights, optimizer state, the step, torch's
                                                       random state and plain `extra` values
    load_run(path, model, optimizer=None)             all of it back into them; returns the step
                                                       and `extra` (a RunState)

The safety of the course's checkpoints holds: the file is read with
torch.load(weights_only=True), which never runs code from it; a SHA-256 of every tensor in it
is verified; and a model or optimizer that does not match the file (other names, shapes or
classes) is refused, naming the first difference, before anything is changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.model.checkpoints import (
    CheckpointError,
    _check_device,
    _check_plain,
    _read_checkpoint,
    weights_checksum,
)

FORMAT = "course-run/1"
WRITER = "helpers.training.resume.save_run(path, model, optimizer, step)"


@dataclass(frozen=True)
class RunState:
    """What `load_run` gives back besides the weights and optimizer state it loads in place."""

    step: int
    extra: dict[str, Any]


def _tensors(state: Any, prefix: str = "") -> dict[str, Tensor]:
    """Every tensor in a nested dict/list, by its path: what the checksum covers."""
    found: dict[str, Tensor] = {}
    if isinstance(state, Tensor):
        found[prefix] = state
    elif isinstance(state, dict):
        for key in sorted(state, key=str):
            found.update(_tensors(state[key], f"{prefix}/{key}"))
    elif isinstance(state, (list, tuple)):
        for index, item in enumerate(state):
            found.update(_tensors(item, f"{prefix}/{index}"))
    return found


def _check_pair(model: Any, optimizer: Any) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model is a {type(model).__name__}, expected a torch.nn.Module")
    if optimizer is None or isinstance(optimizer, torch.optim.Optimizer):
        return
    # A pair such as helpers.training.muon.MuonWithAdamW is saved and loaded by its own methods.
    if not all(callable(getattr(optimizer, name, None)) for name in ("state_dict", "load_state_dict")):
        raise TypeError(f"optimizer is a {type(optimizer).__name__}, expected a torch.optim.Optimizer "
                        "or an object with state_dict() and load_state_dict() (or None)")


def _group_sizes(state: Any) -> list[int]:
    """The number of parameters in each group of an optimizer's state dict, or of the optimizers
    nested in one (MuonWithAdamW's {"muon": ..., "adamw": ...}), in order."""
    if isinstance(state, dict) and "param_groups" in state:
        return [len(group["params"]) for group in state["param_groups"]]
    if isinstance(state, dict):
        return [size for key in sorted(state) for size in _group_sizes(state[key])]
    return []


def save_run(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None,
             step: int, **extra: Any) -> Path:
    """Write the run to `path`: the model's state dict, the optimizer's (if any), `step` (the
    number of steps taken), torch's CPU random state, and plain `extra` values (numbers,
    strings, tensors, lists and dicts of them, e.g. a data loader's position)."""
    _check_pair(model, optimizer)
    checks.non_negative_int("step", step)
    for key, value in extra.items():
        _check_plain(f"extra value {key!r}", value)
    target = Path(path)
    if target.is_dir() or not target.parent.is_dir():
        raise ValueError(f"path {str(target)!r} is a folder or lies in a folder that does not "
                         "exist, expected a file name in an existing folder, such as 'run.pt'")
    state = {"format": FORMAT, "model_class": type(model).__name__, "model": model.state_dict(),
             "optimizer_class": type(optimizer).__name__ if optimizer is not None else None,
             "optimizer": optimizer.state_dict() if optimizer is not None else None,
             "step": int(step), "rng": torch.get_rng_state(), "extra": dict(extra)}
    state["checksum"] = weights_checksum(_tensors(state))
    torch.save(state, target)
    return target


def _refuse_mismatch(saved: dict[str, Tensor], model: nn.Module, path: Path) -> None:
    """Raise naming the first parameter whose name or shape differs between file and model."""
    ours = model.state_dict()
    missing, unexpected = sorted(set(ours) - set(saved)), sorted(set(saved) - set(ours))
    if missing or unexpected:
        raise CheckpointError(f"{path} was saved from another model: the model has "
                              f"{missing[:3]} that the file lacks and the file has {unexpected[:3]} "
                              "that the model lacks")
    for name, tensor in ours.items():
        if not isinstance(saved[name], Tensor) or saved[name].shape != tensor.shape:
            got = tuple(saved[name].shape) if isinstance(saved[name], Tensor) else type(saved[name]).__name__
            raise CheckpointError(f"{path} holds {name} of shape {got}, but the model's is "
                                  f"{tuple(tensor.shape)}: build the model with the run's sizes")


def _read_run(path: str | Path) -> tuple[Path, dict[str, Any]]:
    if not isinstance(path, str | Path):
        raise TypeError(f"path is {path!r:.60} ({type(path).__name__}), expected a str or Path")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path is {str(path)!r}: no such file")
    _check_device("cpu")
    state = _read_checkpoint(path, "cpu", writer=WRITER)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{path} is not a saved run (format {found!r}), expected a file "
                              f"written by {WRITER}")
    expected = {"model": dict, "step": int, "rng": Tensor, "extra": dict, "checksum": str}
    wrong = [key for key, kind in expected.items() if not isinstance(state.get(key), kind)]
    if wrong:
        raise CheckpointError(f"{path} has no valid {wrong[0]!r} entry, expected a file written by {WRITER}")
    if weights_checksum(_tensors({k: v for k, v in state.items() if k != "checksum"})) != state["checksum"]:
        raise CheckpointError(f"{path} is corrupted: its tensors do not match the checksum saved "
                              "with them (a bad copy?); save the run again")
    return path, state


def load_run(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
             restore_rng: bool = True) -> RunState:
    """Load a run saved by `save_run` into `model` (and `optimizer`), in place; restore torch's
    random state unless `restore_rng` is False. Returns the step and the extra values."""
    _check_pair(model, optimizer)
    checks.boolean("restore_rng", restore_rng)
    path, state = _read_run(path)
    _refuse_mismatch(state["model"], model, path)
    if optimizer is not None:
        if state["optimizer"] is None or state["optimizer_class"] != type(optimizer).__name__:
            raise CheckpointError(f"{path} holds the state of a {state['optimizer_class']} optimizer, "
                                  f"but a {type(optimizer).__name__} was given")
        saved_groups = _group_sizes(state["optimizer"])
        our_groups = _group_sizes(optimizer.state_dict())
        if saved_groups != our_groups:
            raise CheckpointError(f"{path} holds an optimizer over parameter groups of sizes "
                                  f"{saved_groups}, but the optimizer's are {our_groups}")
    model.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if restore_rng:
        torch.set_rng_state(state["rng"])
    return RunState(step=int(state["step"]), extra=dict(state["extra"]))
