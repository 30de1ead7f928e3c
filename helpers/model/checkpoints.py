"""Saving a trained model and loading it back, safely.

Defined in notebook 7, "GPT", section 9 (saving and loading a checkpoint):

    save_checkpoint    the model's class and config, its weights, optionally the optimiser's
                       state, and plain `extra` values, with torch.save
    load_checkpoint    the model back, read with torch.load(weights_only=True), which never runs
                       code from the file
    CheckpointError    a file that is not such a checkpoint (a ValueError saying what it is)
    weights_checksum   the SHA-256 of a state dict, stored on save and verified on load

The weights carry a SHA-256 checksum, verified on load: torch ignores the zip archive's own
checksums, so without it a flipped byte would load as a silently different weight. Before
anything is built, the config is compared with what the weights in the file can support (the
number of blocks, a context length within MAX_CONTEXT_LENGTH), so a hostile config cannot make
loading build 100,000 layers.

Both models of the course are supported: `helpers.model.gpt.GPT` and `helpers.model.modern.ModernGPT`
(ARCHITECTURES). A checkpoint written before the class was stored is read as a GPT.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from helpers.model.gpt import GPT, GPTConfig
from helpers.model.modern import ModernConfig, ModernGPT

# The models a checkpoint can hold, by the name stored in the file: (model class, config class).
ARCHITECTURES: dict[str, tuple[type[nn.Module], type]] = {
    "GPT": (GPT, GPTConfig),
    "ModernGPT": (ModernGPT, ModernConfig),
}
CHECKSUM = "sha256"  # of every weight's name, dtype, shape and bytes, in the state dict's order
MAX_CONTEXT_LENGTH = 2**20  # a ModernGPT builds a RoPE table this long: cap what a file may ask
_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.")


def weights_checksum(weights: dict[str, Tensor]) -> str:
    """The SHA-256 (hex) of a state dict: every entry's name, dtype, shape and raw bytes."""
    digest = hashlib.sha256()
    for name, tensor in weights.items():
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(flat.view(torch.uint8).numpy() if flat.numel() else b"")
    return digest.hexdigest()


def save_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    **extra: Any) -> Path:
    """Save the model's class and config, its weights, (optionally) the optimiser state and
    plain `extra` values.

    Only tensors, numbers, strings and containers of them go in, so `load_checkpoint` can use
    torch.load(weights_only=True), which refuses to run code hidden in a file. Anything else in
    `extra` (a Path, a numpy number) is refused here, naming its key, rather than saved into a
    file that could not be loaded back.
    """
    architecture = next((name for name, (cls, _) in ARCHITECTURES.items() if type(model) is cls), None)
    if architecture is None:
        raise TypeError(f"model is a {type(model).__name__}, expected one of "
                        f"{', '.join(ARCHITECTURES)} (helpers.model.gpt.GPT or helpers.model.modern.ModernGPT)")
    for key, value in extra.items():
        check_plain(f"extra value {key!r}", value)
    for field, value in asdict(model.config).items():  # a numpy int here would save, then not load
        check_plain(f"model.config.{field}", value)
    target = Path(path)
    if target.is_dir() or not target.parent.is_dir():
        raise ValueError(f"path {str(target)!r} is a folder or lies in a folder that does not "
                         "exist, expected a file name in an existing folder, such as 'model.pt'")
    weights = model.state_dict()
    state = {"architecture": architecture, "config": asdict(model.config), "model": weights,
             "checksum": {CHECKSUM: weights_checksum(weights)}, "extra": dict(extra)}
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    torch.save(state, path)
    return Path(path)


PLAIN_TYPES = (bool, int, float, str, type(None), Tensor)  # what weights_only loading accepts


MAX_NESTING = 100  # levels of lists and dicts a plain value may have (pickle recurses per level)


def check_plain(what: str, value: Any, depth: int = 0, seen: set[int] | None = None) -> None:
    """Raise a TypeError unless `value` is a plain scalar, string, tensor, or a list, tuple or
    dict (with str or int keys) of them, at most MAX_NESTING levels deep.

    A container met again (the same list twice, or [x, x] nested 40 deep) is checked once: the
    walk is linear in the number of distinct objects, as pickle's is.
    """
    seen = set() if seen is None else seen
    if type(value) in (list, tuple, dict):
        if id(value) in seen:
            return
        seen.add(id(value))
        if depth >= MAX_NESTING:
            raise ValueError(f"{what} is nested more than {MAX_NESTING} levels deep, expected plain "
                             f"values in at most {MAX_NESTING} levels of lists and dicts")
    if type(value) in (list, tuple):
        for i, item in enumerate(value):
            check_plain(f"{what}[{i}]", item, depth + 1, seen)
    elif type(value) is dict:
        for key, item in value.items():
            if type(key) not in (str, int):
                raise TypeError(f"{what} has the key {key!r} (a {type(key).__name__}), expected "
                                "str or int keys")
            check_plain(f"{what}[{key!r}]", item, depth + 1, seen)
    elif type(value) not in PLAIN_TYPES and not isinstance(value, Tensor):
        hint = " (use float(...) or int(...))" if hasattr(value, "item") else \
            " (use str(...))" if isinstance(value, Path) else ""
        raise TypeError(f"{what} is {value!r}, a {type(value).__name__}: expected a bool, int, "
                        f"float, str, None, tensor, or a list or dict of them{hint}, which "
                        "load_checkpoint can read back safely")


class CheckpointError(ValueError):
    """A file that `load_checkpoint` cannot read as a course checkpoint."""


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> tuple[nn.Module, dict]:
    """The model (a GPT or a ModernGPT) saved at `path` and the whole saved dictionary (for "optimizer" and "extra").

    The file is read with torch.load(weights_only=True), which loads tensors and plain values
    only and never runs code. A file that is not a checkpoint of `save_checkpoint` (another
    kind of file, a truncated one, a whole pickled model, a bare state dict) raises a
    CheckpointError (a ValueError) saying what was found. The saved config is checked, and
    the weights' shapes compared with it on the meta device, before any memory is allocated.
    """
    if not isinstance(path, str | Path):
        raise TypeError(f"path is {path!r:.60} ({type(path).__name__}), expected a str or Path")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path is {str(path)!r}: no such file")
    check_device(device)
    state = read_checkpoint(path, device)
    if not isinstance(state, dict) or "config" not in state or "model" not in state:
        keys = sorted(map(str, state))[:5] if isinstance(state, dict) else []
        looks_like_weights = bool(keys) and all(isinstance(v, Tensor) for v in state.values())
        found = ("a bare state dict (weights without a config, e.g. torch.save(model.state_dict()))"
                 if looks_like_weights else f"a {type(state).__name__}"
                 + (f" with the keys {keys}" if keys else ""))
        raise CheckpointError(f"{path} holds {found}, expected a checkpoint with 'config' and "
                              "'model' entries: save with helpers.model.checkpoints.save_checkpoint(path, model)")
    model_class, config_class = _architecture_of(state, path)
    config = _config_from(state["config"], config_class, path)
    _check_size_supported(config, state["model"], path)
    _check_weights_fit(model_class, config, state["model"], path)
    _verify_checksum(state, path)
    model = model_class(config).to(device)
    model.load_state_dict(state["model"])
    return model, state


def check_device(device: torch.device | str) -> None:
    """Raise a ValueError naming `device` unless torch knows it and this machine has it (else
    torch.load's failure would read as a damaged file)."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        raise ValueError(f"device is {device!r}, expected 'cpu', 'cuda' or a torch.device") from None
    backend = getattr(torch, kind, None)
    available = getattr(backend, "is_available", lambda: False)
    if kind != "cpu" and not available():
        raise ValueError(f"device is {device!r}, but this machine has no {kind}: expected 'cpu'")
    index = torch.device(device).index
    if kind != "cpu" and index is not None:
        count = backend.device_count()  # every torch backend with is_available() has it
        if index >= count:
            raise ValueError(f"device is {device!r}, but this machine has {count} {kind} "
                             f"device(s): expected an index below {count}")


def read_checkpoint(path: Path, device: torch.device | str,
                     writer: str = "helpers.model.checkpoints.save_checkpoint(path, model)") -> Any:
    """torch.load(weights_only=True), its errors turned into what the student can act on;
    `writer` names the function that writes such files, for the messages."""
    if not isinstance(path, Path):
        raise TypeError(f"path is {path!r:.60} ({type(path).__name__}), expected a pathlib.Path")
    with path.open("rb") as file:
        head = file.read(4)
    if head[:1] in (b"{", b"["):
        raise CheckpointError(f"{path} is a JSON file (a tokenizer's or a config's?), expected "
                              f"a checkpoint written by {writer.split('(')[0]}")
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as error:  # noqa: BLE001 - every failure gets the course's message
        text = str(error)
        if "Unsupported global" in text or "weights_only" in text and "GLOBAL" in text:
            what = ("a whole pickled object (torch.save(model)?), which could run code when "
                    "loaded, so it is not loaded")
        elif head == b"PK\x03\x04":
            what = "a damaged or truncated checkpoint (the zip archive is incomplete)"
        else:
            what = "not a PyTorch checkpoint"
        raise CheckpointError(f"{path} is {what}: expected a file written by {writer}") from None


def _architecture_of(state: dict, path: Path) -> tuple[type[nn.Module], type]:
    """The model and config classes a checkpoint names (GPT when it names none)."""
    name = state.get("architecture", "GPT")
    if not isinstance(name, str) or name not in ARCHITECTURES:  # a list would not even hash
        raise CheckpointError(f"{path} holds a model of architecture {name!r}, expected one of "
                              f"{', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def _config_from(saved: Any, config_class: type, path: Path) -> Any:
    """The config of a checkpoint, checked (types and sizes) before anything is built."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"{path} has a 'config' of type {type(saved).__name__}, expected a "
                              f"dict of {config_class.__name__} fields")
    known = set(config_class.__dataclass_fields__)
    unknown = sorted(set(map(str, saved)) - known)
    if unknown:
        raise CheckpointError(f"{path} has a config with unknown fields {unknown}, expected "
                              f"fields among {sorted(known)}")
    try:
        return config_class(**saved)
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{path} has an invalid config: {error}") from None


def _check_weights_fit(model_class: type[nn.Module], config: Any, weights: Any, path: Path) -> None:
    """Compare the saved weights' names and shapes with the model built on the meta device
    (no memory), so a config that does not match its weights is caught before allocating."""
    if not isinstance(weights, dict):
        raise CheckpointError(f"{path} has 'model' of type {type(weights).__name__}, expected a "
                              "state dict of tensors")
    odd = [name for name, t in weights.items() if not isinstance(name, str) or not isinstance(t, Tensor)]
    if odd:
        raise CheckpointError(f"{path} has 'model' entries that are not {{name: tensor}}: "
                              f"{odd[:3]!r:.120} (the first: a {type(odd[0]).__name__} key, a "
                              f"{type(weights[odd[0]]).__name__} value), expected a state dict of tensors")
    with torch.device("meta"):
        shapes_only = model_class(config)
    expected = {name: tuple(t.shape) for name, t in shapes_only.state_dict().items()}
    got = {name: tuple(t.shape) for name, t in weights.items()}
    if got != expected:
        missing = sorted(set(expected) - set(got))[:3]
        wrong = sorted(n for n in set(expected) & set(got) if expected[n] != got[n])[:3]
        detail = (f"missing {missing}" if missing else
                  f"{wrong[0]} has shape {got[wrong[0]]}, the config gives {expected[wrong[0]]}"
                  if wrong else f"unexpected {sorted(set(got) - set(expected))[:3]}")
        raise CheckpointError(f"{path} has weights that do not match its config ({detail})")
    not_float = [name for name, t in weights.items() if not t.is_floating_point()][:3]
    if not_float:
        raise CheckpointError(f"{path} has weights of dtype {weights[not_float[0]].dtype} "
                              f"({not_float}), expected floating-point weights")


def _check_size_supported(config: Any, weights: Any, path: Path) -> None:
    """Refuse a config that asks for more (or fewer) blocks than the file has weights for, or a
    context length past MAX_CONTEXT_LENGTH, before a single module is built."""
    if not isinstance(weights, dict):
        raise CheckpointError(f"{path} has 'model' of type {type(weights).__name__}, expected a "
                              "state dict of tensors")
    blocks = {int(m.group(1)) for key in weights if (m := _BLOCK_KEY.match(str(key)))}
    if config.n_layers != len(blocks) or blocks != set(range(len(blocks))):
        raise CheckpointError(f"{path} has a config with n_layers = {config.n_layers:,}, but its "
                              f"weights hold {len(blocks):,} blocks"
                              + ("" if blocks == set(range(len(blocks))) else " (not numbered 0, 1, ...)")
                              + ": expected the two to agree")
    if config.context_length > MAX_CONTEXT_LENGTH:
        raise CheckpointError(f"{path} has a config with context_length = {config.context_length:,}, "
                              f"expected at most MAX_CONTEXT_LENGTH = {MAX_CONTEXT_LENGTH:,}")


def _verify_checksum(state: dict, path: Path) -> None:
    """Compare the weights with the checksum saved beside them (files from before checksums
    were stored have none, and are loaded as they are)."""
    saved = state.get("checksum")
    if saved is None:
        return
    if not isinstance(saved, dict) or not isinstance(saved.get(CHECKSUM), str):
        raise CheckpointError(f"{path} has a 'checksum' entry {saved!r:.80}, expected "
                              f"{{'{CHECKSUM}': '<hex digest>'}}")
    actual = weights_checksum(state["model"])
    if actual != saved[CHECKSUM]:
        raise CheckpointError(f"{path} is corrupted: its weights' {CHECKSUM} is {actual[:16]}..., "
                              f"the checksum saved with them is {saved[CHECKSUM][:16]}...: the file "
                              "changed after it was saved (a bad copy or download?); save it again")
