"""helpers.training.by_hand: the training step's core pieces, the fallbacks of notebook 7's exercises.

They equal PyTorch's (F.cross_entropy, torch.optim.AdamW), pass the checkers they stand in for,
train a GPT step for step like the Trainer's plain path, and refuse bad input before any work.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import helpers.lab.exercises as exercises
from helpers.model.gpt import GPT, GPTConfig
from helpers.training.by_hand import HandAdamW, adamw_update, next_token_loss
from helpers.training.trainer import (
    TrainConfig,
    Trainer,
    learning_rate,
    matrices_and_vectors,
    random_batch,
)

SMALL = GPTConfig(vocab_size=11, context_length=8, n_layers=2, n_heads=2, d_model=8)


def small_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(SMALL)


def test_next_token_loss_is_f_cross_entropy_on_the_shifted_pairs():
    model = small_gpt()
    ids = torch.randint(0, SMALL.vocab_size, (3, SMALL.context_length + 1), generator=torch.Generator().manual_seed(1))
    logits = model(ids[:, :-1])
    expected = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    assert torch.allclose(next_token_loss(model, ids), expected, atol=1e-6)


def test_next_token_loss_gives_the_same_gradient_as_f_cross_entropy():
    model, twin = small_gpt(), small_gpt()
    ids = torch.randint(0, SMALL.vocab_size, (2, 6), generator=torch.Generator().manual_seed(2))
    next_token_loss(model, ids).backward()
    F.cross_entropy(twin(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
    for mine, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.allclose(mine.grad, theirs.grad, atol=1e-6)


@pytest.mark.parametrize("lr, betas, eps, decay", [(1e-2, (0.9, 0.99), 1e-8, 0.1), (3e-3, (0.8, 0.999), 1e-6, 0.0),
                                                    (5e-2, (0.0, 0.5), 1e-8, 0.5),
                                                    # the edges: no step at all, betas of 0 given as a list, a large eps and decay
                                                    (0.0, (0.9, 0.99), 1e-8, 0.1), (1e-2, [0.0, 0.0], 1e-3, 0.0),
                                                    (1e-1, (0.5, 0.9), 0.5, 2.0)])
def test_adamw_update_takes_the_steps_of_torch_optim_adamw(lr, betas, eps, decay):
    generator = torch.Generator().manual_seed(3)
    start = torch.randn(4, 5, generator=generator, dtype=torch.float64)
    param = torch.nn.Parameter(start.clone())
    reference = torch.optim.AdamW([param], lr=lr, betas=tuple(betas), eps=eps, weight_decay=decay, foreach=False)
    p, m, v = start.clone(), torch.zeros_like(start), torch.zeros_like(start)
    for t in range(1, 6):
        g = torch.randn(4, 5, generator=generator, dtype=torch.float64)
        param.grad = g.clone()
        reference.step()
        p, m, v = adamw_update(p, g, m, v, t, lr, betas, eps, decay)
        assert torch.allclose(p, param.detach(), rtol=1e-12, atol=1e-14), t
        state = reference.state[param]  # and the running averages themselves
        assert torch.allclose(m, state["exp_avg"], rtol=1e-12, atol=0), t
        assert torch.allclose(v, state["exp_avg_sq"], rtol=1e-12, atol=0), t
    if lr == 0.0:
        assert torch.equal(p, start)  # a rate of 0 moves nothing, decay included


def test_adamw_update_leaves_its_inputs_alone():
    p, g = torch.ones(3), torch.full((3,), 0.5)
    m, v = torch.zeros(3), torch.zeros(3)
    adamw_update(p, g, m, v, 1, 0.1, (0.9, 0.99), 1e-8, 0.1)
    assert torch.equal(p, torch.ones(3)) and torch.equal(m, torch.zeros(3)) and torch.equal(v, torch.zeros(3))


@pytest.mark.parametrize("name, helper", [("gpt.next_token_loss", next_token_loss),
                                          ("gpt.adamw_update", adamw_update),
                                          ("gpt.hand_adamw", HandAdamW)])
def test_the_helpers_are_right_for_the_exercises_they_stand_in_for_but_earn_nothing_as_answers(name, helper):
    passed, said = exercises.evaluate(name, helper, time_limit=60, watched=False)
    assert passed, said  # right, so the cells after a failed exercise run on a correct stand-in
    passed, said = exercises.evaluate(name, helper, time_limit=60)
    assert not passed and "the course's own code" in said and helper.__name__ in said, said


def test_a_loop_on_the_pieces_trains_like_the_trainers_plain_path():
    """Notebook 7's plain loop in miniature: the same batches, schedule, clipping and decay groups
    as Trainer(fast=False), so the losses agree to round-off, step after step."""
    ids = torch.randint(0, SMALL.vocab_size, (400,), generator=torch.Generator().manual_seed(4))
    model, twin = small_gpt(), small_gpt()
    config = TrainConfig(batch_size=4, learning_rate=1e-2, fast=False, eval_batches=1, seed=5)
    trainer = Trainer(twin, ids, ids, config)
    slots = [[p, torch.zeros_like(p), torch.zeros_like(p), decay]
             for params, decay in zip(matrices_and_vectors(model), (config.weight_decay, 0.0), strict=True) for p in params]
    batches, steps = torch.Generator().manual_seed(config.seed), 12
    for step in range(steps):
        lr = learning_rate((step + 1) / steps, config.learning_rate)
        x, y = random_batch(ids, config.batch_size, SMALL.context_length, batches)
        loss = next_token_loss(model, torch.cat([x, y[:, -1:]], dim=1))
        model.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip, foreach=False)
        with torch.no_grad():
            for slot in slots:
                p, m, v, decay = slot
                new_p, slot[1], slot[2] = adamw_update(p, p.grad, m, v, step + 1, lr, (0.9, 0.99), 1e-8, decay)
                p.copy_(new_p)
        assert abs(loss.item() - trainer.train_step(lr)) < 1e-5, step


# --- bad input, refused before any work ---------------------------------------------------------

@pytest.mark.parametrize("model, ids, error, words", [
    ("gpt", torch.zeros(2, 3, dtype=torch.long), TypeError, "model is a str"),
    (None, [[1, 2, 3]], TypeError, "ids is a list"),
    (None, torch.zeros(2, 3), TypeError, "dtype torch.float32"),
    (None, torch.zeros(2, 3, dtype=torch.bool), TypeError, "dtype torch.bool"),
    (None, torch.zeros(5, dtype=torch.long), ValueError, "shape (5,)"),
    (None, torch.zeros(2, 1, dtype=torch.long), ValueError, "at least 2 tokens"),
    (None, torch.zeros(2, 3, 4, dtype=torch.long), ValueError, "shape (2, 3, 4)"),
])
def test_next_token_loss_refuses_what_is_not_a_model_and_windows(model, ids, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        next_token_loss(small_gpt() if model is None else model, ids)


GOOD = {"p": torch.ones(2, 3), "g": torch.ones(2, 3), "m": torch.zeros(2, 3), "v": torch.zeros(2, 3), "t": 1,
        "lr": 1e-2, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.1}


@pytest.mark.parametrize("change, error, words", [
    ({"p": [[1.0]]}, TypeError, "p is a list"),
    ({"g": torch.ones(3, 2)}, ValueError, r"g has shape \(3, 2\), expected p's shape \(2, 3\)"),
    ({"m": torch.zeros(6)}, ValueError, "m has shape"),
    ({"v": torch.zeros(2, 3, dtype=torch.long)}, TypeError, "v has dtype torch.int64"),
    ({"t": 0}, ValueError, "t is 0, expected a positive int"),
    ({"t": 1.0}, TypeError, "t is 1.0"),
    ({"lr": -0.1}, ValueError, "lr is -0.1"),
    ({"lr": float("nan")}, ValueError, "lr is nan"),
    ({"betas": 0.9}, ValueError, "betas is 0.9, expected two numbers"),
    ({"betas": (0.9, 1.0)}, ValueError, r"betas\[1\] is 1.0"),
    ({"betas": (0.9, "0.99")}, TypeError, r"betas\[1\] is '0.99'"),
    ({"eps": 0.0}, ValueError, "eps is 0.0"),
    ({"weight_decay": -1}, ValueError, "weight_decay is -1"),
])
def test_adamw_update_refuses_nonsense_naming_the_argument(change, error, words):
    with pytest.raises(error, match=words):
        adamw_update(**{**GOOD, **change})


def test_hand_adamw_steps_a_model_like_torchs_adamw_with_two_groups():
    model, twin = small_gpt(), small_gpt()
    mine = HandAdamW(adamw_update, *matrices_and_vectors(model), weight_decay=0.1)
    matrices, vectors = matrices_and_vectors(twin)
    theirs = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}],
                               lr=1e-2, betas=(0.9, 0.99), eps=1e-8, foreach=False)
    ids = torch.randint(0, SMALL.vocab_size, (3, 9), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        next_token_loss(model, ids).backward()
        for p, q in zip(model.parameters(), twin.parameters(), strict=True):
            q.grad = p.grad.clone()
        mine.step(1e-2)
        theirs.step()
    assert mine.t == 3
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


@pytest.mark.parametrize("build, message", [
    (lambda p: HandAdamW("adamw", [p], []), "update is a str"),
    (lambda p: HandAdamW(adamw_update, p, []), "matrices is Parameter"),
    (lambda p: HandAdamW(adamw_update, [p], [], betas=(0.9, 1.5)), "betas"),
    (lambda p: HandAdamW(adamw_update, [p], [], eps=0.0), "eps"),
    (lambda p: HandAdamW(adamw_update, [p], [], weight_decay=-1.0), "weight_decay"),
    (lambda p: HandAdamW(adamw_update, [p], [p]), r"^vectors\[0\] \(shape \(2, 2\)\) is also matrices\[0\], "
                                                   "expected each weight once"),  # stepped twice, silently
])
def test_hand_adamw_refuses_bad_input_naming_it(build, message):
    with pytest.raises((TypeError, ValueError), match=message):
        build(torch.nn.Parameter(torch.ones(2, 2)))


def test_hand_adamw_state_dict_is_torchs_layout_and_loads_back_its_settings():
    model = small_gpt()
    matrices, vectors = matrices_and_vectors(model)
    mine = HandAdamW(adamw_update, matrices, vectors, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.3)
    model.zero_grad(set_to_none=True)
    next_token_loss(model, torch.randint(0, SMALL.vocab_size, (2, 5))).backward()
    mine.step(1e-2)
    state = mine.state_dict()
    assert state["t"] == 1 and sorted(state["state"]) == list(range(len(matrices) + len(vectors)))
    assert [(g["params"][:1], g["weight_decay"]) for g in state["param_groups"]] == [([0], 0.3), ([len(matrices)], 0.0)]
    fresh = HandAdamW(adamw_update, matrices, vectors)  # other settings: the state's win, as in torch
    fresh.load_state_dict(state)
    assert (fresh.t, fresh.betas, fresh.eps) == (1, (0.8, 0.9), 1e-6)
    assert [slot[3] for slot in fresh.slots] == [0.3] * len(matrices) + [0.0] * len(vectors)
    assert all(torch.equal(a[1], b[1]) and a[1] is not b[1] for a, b in zip(fresh.slots, mine.slots, strict=True))
    with pytest.raises(ValueError, match=r"^state\['param_groups'\] has groups of sizes \[\d+, \d+\], expected \[1, 0\]"):
        HandAdamW(adamw_update, [matrices[0]], []).load_state_dict(state)
    with pytest.raises(ValueError, match=r"^state is \[\], expected a state_dict\(\)"):
        fresh.load_state_dict([])


def test_hand_adamw_step_wants_gradients_and_a_rate():
    p = torch.nn.Parameter(torch.ones(2, 2))
    optimizer = HandAdamW(adamw_update, [p], [])
    with pytest.raises(ValueError, match="no .grad"):
        optimizer.step(1e-2)
    p.grad = torch.ones(2, 2)
    with pytest.raises(ValueError, match="lr"):
        optimizer.step(-1.0)
    assert optimizer.t == 0


# helpers.training.by_hand, exactly:
#
# Every refusal's whole message (the argument named, what it got, what was expected), the edges
# of each accepted range (the shortest window, beta = 0, lr = 0, a list of betas), and the step
# against torch.optim.AdamW on those edges.

TINY = GPTConfig(vocab_size=5, context_length=4, n_layers=1, n_heads=1, d_model=8)


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(TINY)


@pytest.mark.parametrize("model, ids, error, said", [
    ("gpt", torch.zeros(2, 3, dtype=torch.long), TypeError,
     "model is a str, expected a language model (an nn.Module mapping ids (B, N) to logits (B, N, V))"),
    (None, [[1, 2]], TypeError, "ids is a list, expected a tensor of token ids (B, N + 1)"),
    (None, torch.zeros(2, 3, dtype=torch.complex64), TypeError,
     "ids has dtype torch.complex64, expected integer token ids (torch.long)"),
    (None, torch.zeros(2, 3), TypeError, "ids has dtype torch.float32, expected integer token ids (torch.long)"),
    (None, torch.zeros(2, 3, dtype=torch.bool), TypeError,
     "ids has dtype torch.bool, expected integer token ids (torch.long)"),
    (None, torch.zeros(2, 1, dtype=torch.long), ValueError,
     "ids has shape (2, 1), expected windows (B, N + 1) of at least 2 tokens: N inputs and, one step "
     "later, N targets"),
    (None, torch.zeros(3, dtype=torch.long), ValueError, "ids has shape (3,), expected windows (B, N + 1)"),
])
def test_next_token_loss_messages(model, ids, error, said):
    with pytest.raises(error, match="^" + re.escape(said)):
        next_token_loss(tiny_gpt() if model is None else model, ids)


def test_next_token_loss_on_the_shortest_windows_is_f_cross_entropy():
    model = tiny_gpt()
    ids = torch.tensor([[1, 2], [3, 0], [4, 4]])  # N = 1: one input and one target per window
    expected = F.cross_entropy(model(ids[:, :1]).flatten(0, 1), ids[:, 1])
    assert torch.allclose(next_token_loss(model, ids), expected, atol=1e-6)
    assert next_token_loss(model, ids).shape == ()


@pytest.mark.parametrize("change, error, said", [
    ({"p": [[1.0]]}, TypeError, "p is a list, expected a tensor"),
    ({"g": [[1.0]]}, TypeError, "g is a list, expected a tensor"),
    ({"m": None}, TypeError, "m is a NoneType, expected a tensor"),
    ({"v": 0.0}, TypeError, "v is a float, expected a tensor"),
    ({"p": torch.ones(2, 3, dtype=torch.long)}, TypeError, "p has dtype torch.int64, expected a floating-point tensor"),
    ({"g": torch.ones(2, 3, dtype=torch.int32)}, TypeError, "g has dtype torch.int32, expected a floating-point tensor"),
    ({"m": torch.zeros(2, 3, dtype=torch.bool)}, TypeError, "m has dtype torch.bool, expected a floating-point tensor"),
    ({"v": torch.zeros(2, 3, dtype=torch.long)}, TypeError, "v has dtype torch.int64, expected a floating-point tensor"),
    ({"g": torch.ones(3, 2)}, ValueError, "g has shape (3, 2), expected p's shape (2, 3)"),
    ({"m": torch.zeros(6)}, ValueError, "m has shape (6,), expected p's shape (2, 3)"),
    ({"v": torch.zeros(2, 3, 1)}, ValueError, "v has shape (2, 3, 1), expected p's shape (2, 3)"),
    ({"t": 0}, ValueError, "t is 0, expected a positive int"),
    ({"lr": -0.1}, ValueError, "lr is -0.1, expected a finite number >= 0"),
    ({"lr": float("inf")}, ValueError, "lr is inf, expected a finite number >= 0"),
    ({"betas": 0.9}, ValueError, "betas is 0.9, expected two numbers (beta1, beta2)"),
    ({"betas": (0.9,)}, ValueError, "betas is (0.9,), expected two numbers (beta1, beta2)"),
    ({"betas": (0.9, 0.99, 0.999)}, ValueError, "betas is (0.9, 0.99, 0.999), expected two numbers (beta1, beta2)"),
    ({"betas": (-0.1, 0.9)}, ValueError, "betas[0] is -0.1, expected a number in [0, 1)"),
    ({"betas": (1.0, 0.9)}, ValueError, "betas[0] is 1.0, expected a number in [0, 1)"),
    ({"betas": (0.9, 1.0)}, ValueError, "betas[1] is 1.0, expected a number in [0, 1)"),
    ({"eps": 0.0}, ValueError, "eps is 0.0, expected a finite number > 0"),
    ({"weight_decay": -1}, ValueError, "weight_decay is -1, expected a finite number >= 0 (0 = no decay)"),
    ({"weight_decay": float("inf")}, ValueError, "weight_decay is inf, expected a finite number >= 0 (0 = no decay)"),
])
def test_adamw_update_messages(change, error, said):
    with pytest.raises(error, match="^" + re.escape(said) + "$"):
        adamw_update(**{**GOOD, **change})
