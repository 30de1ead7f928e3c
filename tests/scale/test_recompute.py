"""Gradient accumulation and activation recomputation: the same gradients, fewer saved bytes."""

from __future__ import annotations

import time
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers.model.gpt import GPT, GPTConfig
from helpers.scale import recompute as rc
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


# helpers.scale.recompute: the saved-tensor meter against counts made by hand, the recomputed
# loss and gradients against plain autograd, the peak against one block's saved tensors, the
# comparison's calls and timing, every refusal's message.
#

TWO_LAYERS = GPTConfig(vocab_size=32, context_length=16, n_layers=2, n_heads=2, d_model=16)


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    ids = torch.randint(0, TWO_LAYERS.vocab_size, (4, TWO_LAYERS.context_length + 1))
    return GPT(TWO_LAYERS).double(), ids[:, :-1], ids[:, 1:]


def _grads_by_autograd(model, ids, targets):
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_the_meter_counts_each_saved_storage_once_and_no_weight():
    linear = nn.Linear(4, 3, bias=False)
    x = torch.randn(10, 4, requires_grad=True)              # 160 bytes
    with SavedTensorMeter(linear) as meter:
        y = x * x                                            # saves x twice: counted once
        assert (meter.now, meter.peak) == (160, 160)
        z = linear(x[:2]).exp()                              # x[:2]: x's storage again; exp's output 24 bytes
        assert (meter.now, meter.peak) == (184, 184) and len(meter.alive) == 2
        assert meter.alive[x.untyped_storage().data_ptr()] == [3, 160]
        del y
        assert (meter.now, meter.peak) == (184, 184) and meter.alive[x.untyped_storage().data_ptr()][0] == 1
        z.sum().backward()                                   # frees z's graph
        assert (meter.now, meter.peak, meter.alive) == (0, 184, {})
    assert meter.weights == {linear.weight.untyped_storage().data_ptr()}


def test_a_weight_passes_through_and_everything_else_is_held_and_given_back():
    linear = nn.Linear(2, 2)
    meter = SavedTensorMeter(linear)
    assert meter._pack(linear.weight) is linear.weight and meter.now == 0
    x = torch.ones(3)
    held = meter._pack(x)
    assert isinstance(held, rc._Held) and held.meter is meter and held.tensor is x
    assert SavedTensorMeter._unpack(held) is x and SavedTensorMeter._unpack(linear.weight) is linear.weight
    assert (meter.now, meter.peak) == (12, 12)
    del held
    assert (meter.now, meter.peak, meter.alive) == (0, 12, {})


def test_gradients_under_the_meter_are_autograds():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    x = torch.randn(4, 3)
    mlp(x).square().sum().backward()
    expected = [p.grad.clone() for p in mlp.parameters()]
    mlp.zero_grad()
    with SavedTensorMeter(mlp) as meter:
        mlp(x).square().sum().backward()
    assert meter.peak > 0
    for p, g in zip(mlp.parameters(), expected, strict=True):
        assert torch.equal(p.grad, g)


def test_the_meter_stops_counting_when_its_block_ends():
    x = torch.randn(5, requires_grad=True)
    with SavedTensorMeter(nn.Linear(1, 1)) as meter:
        pass
    y = x.exp()
    assert (meter.now, meter.peak, meter.alive) == (0, 0, {})
    del y


def test_the_meter_needs_a_module():
    with pytest.raises(TypeError, match="^model is a str, expected a torch.nn.Module$"):
        SavedTensorMeter("gpt")


@pytest.mark.parametrize("recompute", [False, True])
def test_the_loss_is_the_models_next_token_loss(setup, recompute):
    model, ids, targets = setup
    expected = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
    assert rc._loss(model, ids, targets, recompute) == expected


@pytest.mark.parametrize("accumulation, recompute", [(1, False), (2, False), (1, True), (2, True)])
def test_a_step_gives_autograds_gradients_and_loss_whatever_the_pieces(setup, accumulation, recompute):
    model, ids, targets = setup
    loss, expected = _grads_by_autograd(model, ids, targets)
    for _ in range(2):  # the second step starts from zero gradients again
        result = gradient_step(model, ids, targets, accumulation, recompute)
        assert result["loss"] == pytest.approx(loss, rel=1e-12, abs=0)
        for name, grad in expected.items():
            torch.testing.assert_close(result["grads"][name], grad, rtol=0, atol=1e-12)
    model.zero_grad(set_to_none=False)  # zeroes the model's gradients in place
    assert all(g.abs().sum() > 0 for g in result["grads"].values())  # copies, not the model's own


def test_the_loss_adds_the_pieces_losses_over_k(setup):
    model, ids, targets = setup
    pieces = [F.cross_entropy(model(i).flatten(0, 1), t.flatten()).item() / 2
              for i, t in zip(ids.chunk(2), targets.chunk(2), strict=True)]
    assert gradient_step(model, ids, targets, 2)["loss"] == pieces[0] + pieces[1]


def test_recomputing_keeps_a_blocks_tensors_at_a_time_and_pieces_divide_the_peak(setup):
    """Recomputed in the backward under the meter (use_reentrant=True), one block's saved tensors
    are alive at once: at least what one block saves, metered alone; fewer than both blocks'."""
    model, ids, targets = setup
    x = model.drop(model.embed(ids)).detach().requires_grad_(True)
    with SavedTensorMeter(model) as meter:
        out = model.blocks[0](x)
        one_block = meter.now
        del out
    peaks = {(k, r): gradient_step(model, ids, targets, k, r)["peak_bytes"] for k in (1, 2) for r in (False, True)}
    assert one_block < peaks[(1, True)] < peaks[(1, False)] - one_block
    assert one_block / 2 < peaks[(2, True)] < peaks[(2, False)] - one_block / 2
    assert 1.8 < peaks[(1, False)] / peaks[(2, False)] < 2.2
    assert 1.8 < peaks[(1, True)] / peaks[(2, True)] < 2.2


@pytest.mark.parametrize("call, error, message", [
    (lambda m, i, t: gradient_step(nn.Linear(2, 2), i, t), TypeError,
     "^model is a Linear, expected the course GPT$"),
    (lambda m, i, t: gradient_step(m, i, t, accumulation=0), ValueError,
     "^accumulation is 0, expected a positive int$"),
    (lambda m, i, t: gradient_step(m, i, t, recompute="yes"), TypeError, "^recompute is 'yes'"),
    (lambda m, i, t: gradient_step(m, i, t[:, :3]), ValueError,
     r"^ids and targets must be two \(B, N\) tensors of the same shape$"),
    (lambda m, i, t: gradient_step(m, i[0], t[0]), ValueError, "^ids and targets must be two"),
    (lambda m, i, t: gradient_step(m, i.tolist(), t), ValueError, "^ids and targets must be two"),
    (lambda m, i, t: gradient_step(m, i, t.tolist()), ValueError, "^ids and targets must be two"),
    (lambda m, i, t: gradient_step(m, i, t, accumulation=3), ValueError,
     "^batch of 4 rows cannot be cut into accumulation=3 equal pieces: expected B divisible by 3$"),
])
def test_a_step_names_what_is_wrong(setup, call, error, message):
    with pytest.raises(error, match=message):
        call(*setup)


def test_the_comparison_runs_each_combination_repeats_times_and_keeps_the_fastest(monkeypatch):
    clock, calls = [0.0], []
    durations = iter([5.0, 2.0, 3.0, 4.0, 1.0, 6.0, 9.0, 8.0])

    def step(model, ids, targets, k, recompute):
        calls.append((model, ids, targets, k, recompute))
        clock[0] += next(durations)
        return {"peak_bytes": 100 * len(calls)}

    monkeypatch.setattr(rc, "gradient_step", step)
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    table = compare_memory_and_time("model", "ids", "targets", accumulation=3, repeats=2)
    assert calls == [("model", "ids", "targets", k, r) for k, r in
                     ((1, False), (1, False), (3, False), (3, False), (1, True), (1, True), (3, True), (3, True))]
    assert table == {"plain": {"peak_bytes": 200, "seconds": 2.0},
                     "accumulate x3": {"peak_bytes": 400, "seconds": 3.0},
                     "recompute": {"peak_bytes": 600, "seconds": 1.0},
                     "both": {"peak_bytes": 800, "seconds": 8.0}}


def test_the_comparison_accumulates_over_4_pieces_3_times_unless_told(monkeypatch):
    calls = []
    monkeypatch.setattr(rc, "gradient_step", lambda *args: calls.append(args[3:]) or {"peak_bytes": 0})
    assert list(compare_memory_and_time(None, None, None)) == ["plain", "accumulate x4", "recompute", "both"]
    assert calls == [(1, False)] * 3 + [(4, False)] * 3 + [(1, True)] * 3 + [(4, True)] * 3


def test_the_comparison_needs_a_positive_number_of_repeats(setup):
    with pytest.raises(ValueError, match="^repeats is 0, expected a positive int$"):
        compare_memory_and_time(*setup, repeats=0)


def test_recomputing_asks_for_the_reentrant_checkpoint_explicitly(setup):
    """torch warns (and will refuse) when use_reentrant is left to its default."""
    model, ids, targets = setup
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gradient_step(model, ids, targets, 2, recompute=True)


def test_the_pieces_are_cut_along_the_rows_not_the_positions(setup):
    model, ids, targets = setup
    ids, targets = ids[:, :15], targets[:, :15]  # 4 rows of 15 positions: 2 pieces of 2 rows
    loss, expected = _grads_by_autograd(model, ids, targets)
    result = gradient_step(model, ids, targets, accumulation=2)
    assert result["loss"] == pytest.approx(loss, rel=1e-12, abs=0)
    with pytest.raises(ValueError, match="^batch of 4 rows cannot be cut into accumulation=3 equal pieces"):
        gradient_step(model, ids[:, :12], targets[:, :12], accumulation=3)
