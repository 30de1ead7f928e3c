"""Gradient accumulation and activation recomputation: the same gradients, fewer saved bytes."""

from __future__ import annotations

import pytest
import torch

from helpers.model.gpt import GPT, GPTConfig
from helpers.scale.recompute import SavedTensorMeter, compare_memory_and_time, gradient_step

CONFIG = GPTConfig(vocab_size=32, context_length=32, n_layers=2, n_heads=2, d_model=32)


def _setup():
    torch.manual_seed(0)
    ids = torch.randint(0, CONFIG.vocab_size, (8, CONFIG.context_length + 1))
    return GPT(CONFIG).double(), ids[:, :-1], ids[:, 1:]


def test_accumulation_and_recomputation_give_the_same_gradients_with_fewer_saved_bytes():
    model, ids, targets = _setup()
    plain = gradient_step(model, ids, targets)
    peaks = {}
    for k, recompute in ((4, False), (1, True), (4, True)):
        result = gradient_step(model, ids, targets, k, recompute)
        gap = max((result["grads"][n] - plain["grads"][n]).abs().max().item() for n in plain["grads"])
        assert gap < 1e-12, (k, recompute, gap)
        assert abs(result["loss"] - plain["loss"]) < 1e-12
        peaks[(k, recompute)] = result["peak_bytes"]
    print(plain["peak_bytes"], peaks)
    assert 3.5 < plain["peak_bytes"] / peaks[(4, False)] < 4.5  # a quarter of the rows at a time
    assert plain["peak_bytes"] / peaks[(1, True)] > 2  # block inputs + one block's tensors
    assert peaks[(4, True)] < min(peaks[(4, False)], peaks[(1, True)])


def test_the_meter_counts_what_autograd_saves():
    weight = torch.nn.Linear(4, 4, bias=False)
    x = torch.randn(10, 4, requires_grad=True)
    with SavedTensorMeter(weight) as meter:
        y = torch.tanh(weight(x))  # saves x (160 bytes; the weight is not counted) and tanh's output
        assert meter.now == 2 * 10 * 4 * 4
        y.sum().backward()
    assert meter.peak == 320 and meter.now == 0  # freed with the graph


def test_compare_returns_the_four_combinations():
    model, ids, targets = _setup()
    table = compare_memory_and_time(model.float(), ids, targets, accumulation=2, repeats=1)
    assert list(table) == ["plain", "accumulate x2", "recompute", "both"]
    assert all(row["seconds"] > 0 for row in table.values())
    assert table["both"]["peak_bytes"] < table["plain"]["peak_bytes"]


def test_recompute_arguments_are_checked():
    model, ids, targets = _setup()
    with pytest.raises(ValueError, match="accumulation=3"):
        gradient_step(model, ids, targets, accumulation=3)
    with pytest.raises(ValueError, match="accumulation"):
        gradient_step(model, ids, targets, accumulation=0)
    with pytest.raises(TypeError, match="recompute"):
        gradient_step(model, ids, targets, recompute="yes")
    with pytest.raises(ValueError, match="same shape"):
        gradient_step(model, ids, targets[:, :3])
    with pytest.raises(TypeError, match="course GPT"):
        gradient_step(torch.nn.Linear(2, 2), ids, targets)
    with pytest.raises(TypeError, match="model"):
        SavedTensorMeter("gpt")
    with pytest.raises(ValueError, match="repeats"):
        compare_memory_and_time(model, ids, targets, repeats=0)


@pytest.mark.parametrize("rows, tokens", [(0, 8), (2, 0)])
def test_an_empty_batch_is_refused_before_a_nan_loss(rows, tokens):
    model, _, _ = _setup()
    empty = torch.zeros(rows, tokens, dtype=torch.long)
    with pytest.raises(ValueError, match=rf"^ids has shape \({rows}, {tokens}\), expected at least one row"):
        gradient_step(model, empty, empty)


def test_ids_outside_the_vocabulary_or_of_a_float_dtype_are_refused_by_name():
    model, ids, targets = _setup()
    with pytest.raises(ValueError, match=r"^targets contains the id \d+, expected ids in \[0, 31\]"):
        gradient_step(model, ids, targets + 32)
    with pytest.raises(TypeError, match="ids has dtype torch.float32"):
        gradient_step(model, ids.float(), targets)
