"""helpers.model.checkpoints: hostile and damaged files refused with a CheckpointError that names
what is wrong, read in full; what save_checkpoint refuses, named down to the nested key.

Written for the mutation run (benchmarks/mutation.py, issue 30): each test fails on a planted
one-line bug that test_train.py, test_bad_input.py and test_bad_input_newer.py let through.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.model.checkpoints import CheckpointError, load_checkpoint, save_checkpoint
from helpers.model.gpt import GPT, GPTConfig

SMALL = GPTConfig(vocab_size=11, context_length=8, n_layers=2, n_heads=2, d_model=8)


def message(error_type, call) -> str:
    with pytest.raises(error_type) as info:
        call()
    return str(info.value)


def saved(tmp_path: Path, change=None) -> Path:
    """A GPT's checkpoint, then (optionally) `change(state)` applied to what the file holds."""
    torch.manual_seed(0)
    path = save_checkpoint(tmp_path / "model.pt", GPT(SMALL))
    if change is not None:
        state = torch.load(path, weights_only=True)
        change(state)
        torch.save(state, path)
    return path


def test_weights_that_are_not_name_tensor_pairs_are_refused(tmp_path):
    path = saved(tmp_path, lambda state: state["model"].update(junk=5))
    assert message(CheckpointError, lambda: load_checkpoint(path)) == (
        f"{path} has 'model' entries that are not {{name: tensor}}: ['junk'] (the first: a str key, "
        "a int value), expected a state dict of tensors")
    path = saved(tmp_path, lambda state: state["model"].update({0: torch.ones(1)}))
    assert message(CheckpointError, lambda: load_checkpoint(path)) == (
        f"{path} has 'model' entries that are not {{name: tensor}}: [0] (the first: a int key, "
        "a Tensor value), expected a state dict of tensors")


def test_an_architecture_that_is_not_a_name_is_refused(tmp_path):
    path = saved(tmp_path, lambda state: state.update(architecture=["GPT"]))
    assert message(CheckpointError, lambda: load_checkpoint(path)) == (
        f"{path} holds a model of architecture ['GPT'], expected one of GPT, ModernGPT")
