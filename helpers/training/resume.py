"""Save a training run of any model and optimizer, and resume it where it stopped (notebook 11).

`helpers.model.checkpoints` saves the course's own GPTs and rebuilds them from their config.
A run of any other model is resumed into a model and an optimizer the user builds again the
same way; the file carries what they cannot rebuild:

    save_run(path, model, optimizer, step, **extra)   weights, optimizer state, the step, torch's
                                                       random state and plain `extra` values
    load_run(path, model, optimizer=None)             all of it back into them; returns the step
                                                       and `extra` (a RunState)

The safety of the course's checkpoints holds: the file is read with
torch.load(weights_only=True), which never runs code from it; a SHA-256 of every tensor and
value in it is verified (linear in the file's size even where a hostile file
shares one list between many places); and a model or optimizer that does not match the file
(other names, shapes, classes, or the same weights in another order) is refused, naming the
first difference, before anything is changed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.model.checkpoints import (
    CheckpointError,
    check_device,
    check_plain,
    read_checkpoint,
)

FORMAT = "course-run/2"  # /2: the optimizer's weights by name, and a checksum of every value
WRITER = "helpers.training.resume.save_run(path, model, optimizer, step)"


@dataclass(frozen=True)
class RunState:
    """What `load_run` gives back besides the weights and optimizer state it loads in place."""

    step: int
    extra: dict[str, Any]


_LEAF_TYPES = (bool, int, float, str, type(None), torch.dtype)  # hashed by their repr


def _walk(state: Any) -> Iterator[tuple[str, Any]]:
    """Every leaf of a nested dict/list/tuple with its path, depth first, dict keys sorted.

    A container met a second time (a file may share one list between places: 40 nested [x, x]
    are 2^40 paths) is not walked again: its path is given with the path it was first met at,
    so the walk is linear in the file's size. No recursion, so no depth is too deep.
    """
    first_seen: dict[int, str] = {}
    stack: list[tuple[str, Any]] = [("", state)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict | list | tuple):
            if id(value) in first_seen:
                yield path, f"<the container at {first_seen[id(value)] or '/'}>"
                continue
            first_seen[id(value)] = path
            items = (sorted(value.items(), key=lambda item: repr(item[0])) if isinstance(value, dict)
                     else enumerate(value))
            stack.extend(reversed([(f"{path}/{key!r}", item) for key, item in items]))
        else:
            yield path, value


def _run_checksum(state: dict[str, Any]) -> str:
    """The SHA-256 (hex) of everything in a run's state but its "checksum": each tensor's path,
    dtype, shape and bytes, each number's or string's path and value, and where lists are shared."""
    digest = hashlib.sha256()
    for path, value in _walk({key: item for key, item in state.items() if key != "checksum"}):
        if isinstance(value, Tensor):
            flat = value.detach().cpu().contiguous().reshape(-1)
            digest.update(f"{path}|{flat.dtype}|{tuple(value.shape)}|".encode())
            digest.update(flat.view(torch.uint8).numpy() if flat.numel() else b"")
        else:
            shown = repr(value) if isinstance(value, _LEAF_TYPES) else type(value).__name__
            digest.update(f"{path}|{type(value).__name__}|{shown}\n".encode())
    return digest.hexdigest()


def _check_pair(model: Any, optimizer: Any) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model is a {type(model).__name__}, expected a torch.nn.Module")
    if optimizer is None or isinstance(optimizer, torch.optim.Optimizer):
        return
    # A pair such as helpers.training.muon.MuonWithAdamW is saved and loaded by its own methods.
    if not (all(callable(getattr(optimizer, name, None)) for name in ("state_dict", "load_state_dict"))
            and isinstance(getattr(optimizer, "param_groups", None), list)):
        raise TypeError(f"optimizer is a {type(optimizer).__name__}, expected a torch.optim.Optimizer "
                        "or an object with state_dict(), load_state_dict() and param_groups (or None)")


def _optimizer_weights(model: nn.Module, optimizer: Any) -> list[str]:
    """The model's name of each weight the optimizer holds, in the order its state lists them."""
    names = {id(p): name for name, p in model.named_parameters()}
    return [names.get(id(p), "<a tensor outside the model>")
            for group in optimizer.param_groups for p in group["params"]]


def _group_sizes(state: Any, depth: int = 0) -> list[int]:
    """The number of parameters in each group of an optimizer's state dict, or of the optimizers
    nested one level in one (MuonWithAdamW's {"muon": ..., "adamw": ...}), in order; -1 for a
    group that is not {"params": [...], ...}. A file's deeper dicts are not walked."""
    if isinstance(state, dict) and "param_groups" in state:
        groups = state["param_groups"] if isinstance(state["param_groups"], list) else [None]
        return [len(g["params"]) if isinstance(g, dict) and isinstance(g.get("params"), list) else -1
                for g in groups]
    if isinstance(state, dict) and depth == 0:
        return [size for key in sorted(state, key=str) for size in _group_sizes(state[key], depth + 1)]
    return []


def save_run(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None,
             step: int, **extra: Any) -> Path:
    """Write the run to `path`: the model's state dict, the optimizer's (if any), `step` (the
    number of steps taken), torch's CPU random state, and plain `extra` values (numbers,
    strings, tensors, lists and dicts of them, e.g. a data loader's position)."""
    _check_pair(model, optimizer)
    checks.non_negative_int("step", step)
    for key, value in extra.items():
        check_plain(f"extra value {key!r}", value)
    if not isinstance(path, str | Path):
        raise TypeError(f"path is {path!r:.60} ({type(path).__name__}), expected a str or Path")
    target = Path(path)
    if target.is_dir() or not target.parent.is_dir():
        raise ValueError(f"path {str(target)!r} is a folder or lies in a folder that does not "
                         "exist, expected a file name in an existing folder, such as 'run.pt'")
    state = {"format": FORMAT, "model_class": type(model).__name__, "model": model.state_dict(),
             "optimizer_class": type(optimizer).__name__ if optimizer is not None else None,
             "optimizer": optimizer.state_dict() if optimizer is not None else None,
             "optimizer_weights": _optimizer_weights(model, optimizer) if optimizer is not None else None,
             "step": int(step), "rng": torch.get_rng_state(), "extra": dict(extra)}
    state["checksum"] = _run_checksum(state)
    torch.save(state, target)
    return target


def _refuse_mismatch(saved: dict[str, Tensor], model: nn.Module, path: Path) -> None:
    """Raise naming the first parameter whose name or shape differs between file and model."""
    ours = model.state_dict()
    missing, unexpected = sorted(set(ours) - set(saved)), sorted(set(saved) - set(ours), key=str)
    if missing or unexpected:
        raise CheckpointError(f"{path} was saved from another model: the model has "
                              f"{missing[:3]} that the file lacks and the file has {unexpected[:3]} "
                              "that the model lacks")
    for name, tensor in ours.items():
        if not isinstance(saved[name], Tensor) or saved[name].shape != tensor.shape:
            got = tuple(saved[name].shape) if isinstance(saved[name], Tensor) else type(saved[name]).__name__
            raise CheckpointError(f"{path} holds {name} of shape {got}, but the model's is "
                                  f"{tuple(tensor.shape)}: build the model with the run's sizes")


def _refuse_other_order(saved: Any, ours: list[str], path: Path) -> None:
    """Raise unless the optimizer lists the model's weights in the order the run's did.

    An optimizer's state names each weight only by its position, so loading it into an
    optimizer built over the weights in another order would put layer 0's moments on layer 1.
    The file knows the names, but it is refused rather than remapped: a changed order means the
    optimizer was built another way (other groups, other settings), which the user should see.
    """
    if saved == ours:
        return
    if not (isinstance(saved, list) and len(saved) == len(ours)):
        raise CheckpointError(f"{path} has 'optimizer_weights' {saved!r:.80}, expected the names of "
                              f"the optimizer's {len(ours)} weights")
    i = next(i for i, (a, b) in enumerate(zip(saved, ours, strict=True)) if a != b)
    raise CheckpointError(f"{path} holds the optimizer state of {saved[i]!r} as weight {i}, but the "
                          f"optimizer lists {ours[i]!r} there: build it over the weights in the run's "
                          "order (the same call, e.g. model.parameters()), or its moments would land "
                          "on other weights")


def _read_run(path: str | Path) -> tuple[Path, dict[str, Any]]:
    if not isinstance(path, str | Path):
        raise TypeError(f"path is {path!r:.60} ({type(path).__name__}), expected a str or Path")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path is {str(path)!r}: no such file")
    check_device("cpu")
    state = read_checkpoint(path, "cpu", writer=WRITER)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{path} is not a saved run (format {found!r}), expected a file "
                              f"written by {WRITER}")
    expected = {"model": dict, "step": int, "rng": Tensor, "extra": dict, "checksum": str,
                "optimizer_weights": list | type(None)}
    wrong = [key for key, kind in expected.items() if not isinstance(state.get(key), kind)]
    if wrong:
        raise CheckpointError(f"{path} has no valid {wrong[0]!r} entry, expected a file written by {WRITER}")
    if _run_checksum(state) != state["checksum"]:
        raise CheckpointError(f"{path} is corrupted: its tensors and values do not match the "
                              "checksum saved with them (a bad copy?); save the run again")
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
        if state["optimizer"] is None:
            raise CheckpointError(f"{path} holds no optimizer state (it was saved with optimizer=None), "
                                  f"but a {type(optimizer).__name__} was given: load it with optimizer=None")
        if state["optimizer_class"] != type(optimizer).__name__:
            raise CheckpointError(f"{path} holds the state of a {state['optimizer_class']} optimizer, "
                                  f"but a {type(optimizer).__name__} was given")
        saved_groups = _group_sizes(state["optimizer"])
        our_groups = _group_sizes(optimizer.state_dict())
        if saved_groups != our_groups:
            raise CheckpointError(f"{path} holds an optimizer over parameter groups of sizes "
                                  f"{saved_groups}, but the optimizer's are {our_groups}")
        _refuse_other_order(state["optimizer_weights"], _optimizer_weights(model, optimizer), path)
    model.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if restore_rng:
        torch.set_rng_state(state["rng"])
    return RunState(step=int(state["step"]), extra=dict(state["extra"]))
