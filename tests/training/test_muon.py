"""helpers.training.muon: Muon by hand, and the Trainer's optimizer="muon".

Muon takes torch.optim.Muon's steps bit for bit (torch.equal, no tolerance): both run the same
operations in the same order and dtype (Newton-Schulz in bfloat16, the momentum as lerps), so
any difference in the idea (a coefficient, a transpose, Nesterov, the learning-rate scale, the
weight decay) shows in the last bit. With Newton-Schulz in float32 (ns_dtype, what the Trainer
uses without native bf16) the steps differ from torch's by bf16's rounding of the orthogonalised
matrix only, which the tolerance there is derived from. The Newton-Schulz properties are checked
in float32.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers.model.gpt import GPT, GPTConfig
from helpers.model.modern import ModernConfig, ModernGPT
from helpers.training.muon import (
    Muon,
    MuonWithAdamW,
    muon_lr_scale,
    muon_param_groups,
    muon_update,
    newton_schulz,
    split_for_muon,
)
from helpers.training.trainer import TrainConfig, Trainer, learning_rate, random_batch

SMALL = GPTConfig(vocab_size=11, context_length=8, n_layers=2, n_heads=2, d_model=8)
SHAPES = [(8, 8), (4, 12), (12, 4)]  # square, wide, tall


def small_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(SMALL)


def token_ids(n: int = 400, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, SMALL.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


# --- equal to torch.optim.Muon --------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=["square", "wide", "tall"])
@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("rule", ["original", "match_rms_adamw"])
@pytest.mark.parametrize("lr, decay, momentum", [(0.02, 0.1, 0.95), (0.05, 0.0, 0.9), (0.0, 0.5, 0.0)])
def test_muon_takes_the_steps_of_torch_optim_muon_bit_for_bit(shape, nesterov, rule, lr, decay, momentum):
    generator = torch.Generator().manual_seed(1)
    start = torch.randn(*shape, generator=generator)
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    mine = Muon([ours], lr=lr, weight_decay=decay, momentum=momentum, nesterov=nesterov, rule=rule)
    reference = torch.optim.Muon([theirs], lr=lr, weight_decay=decay, momentum=momentum,
                                 nesterov=nesterov, adjust_lr_fn=rule)
    for _ in range(4):
        grad = torch.randn(*shape, generator=generator)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        mine.step()
        reference.step()
        assert torch.equal(ours, theirs), (ours - theirs).abs().max()
    assert torch.equal(mine.state[ours]["momentum_buffer"], reference.state[theirs]["momentum_buffer"])
    assert lr == 0.0 and decay == 0.5 or not torch.equal(ours, start)  # it moved (unless lr is 0)


@pytest.mark.parametrize("shape", SHAPES, ids=["square", "wide", "tall"])
def test_muon_with_float32_newton_schulz_differs_from_torch_by_bf16_rounding_only(shape):
    generator = torch.Generator().manual_seed(7)
    start = torch.randn(*shape, generator=generator)
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    lr, steps = 0.02, 4
    mine = Muon([ours], lr=lr, ns_dtype=torch.float32)
    reference = torch.optim.Muon([theirs], lr=lr)
    for _ in range(steps):
        grad = torch.randn(*shape, generator=generator)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        mine.step()
        reference.step()
    # The momentum does not depend on the weights, so each step adds at most lr x scale x the
    # largest bf16-vs-float32 gap of a Newton-Schulz entry (< 0.05, the test below), no more.
    bound = steps * lr * muon_lr_scale(shape) * 0.05
    gap = (ours - theirs).abs().max().item()
    assert 0 < gap < bound, (gap, bound)


def test_muon_steps_a_whole_gpt_as_torch_optim_muon_does_bit_for_bit():
    # Many matrices of a few shapes (square, wide, tall, each several times): the batched step.
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, context_length=8, n_layers=3, n_heads=2, d_model=16))
    ours, _, _ = split_for_muon(model)
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    assert len({tuple(p.shape) for p in ours}) == 3 and len(ours) == 18
    mine, reference = Muon(ours, lr=0.03), torch.optim.Muon(theirs, lr=0.03)
    generator = torch.Generator().manual_seed(3)
    for _ in range(3):
        for a, b in zip(ours, theirs, strict=True):
            a.grad = torch.randn(a.shape, generator=generator)
            b.grad = a.grad.clone()
        mine.step()
        reference.step()
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


# The course's shapes and a few more. A stack of matrices runs the same lines as one matrix (a
# stack of one), and its batched products round as the one matrix's do, bit for bit, in bf16
# and float32, the Gram form included (a side of 8 or more: below that a small product may take
# another kernel).
BATCH_SHAPES = [(128, 128), (512, 128), (128, 512), (16, 16), (32, 8), (8, 32), (100, 37), (40, 64)]


BIT_FOR_BIT = [pytest.param(shape, dtype, id=f"{shape}-{name}") for shape in BATCH_SHAPES
               for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"))
               if min(shape) >= 8]


@pytest.mark.parametrize("shape,dtype", BIT_FOR_BIT)
def test_newton_schulz_of_a_stack_is_that_of_each_matrix_alone_bit_for_bit(shape, dtype):
    ms = torch.randn(2, 3, *shape, generator=torch.Generator().manual_seed(8))
    ms[0, 1] *= 100.0  # each matrix is scaled by its own norm
    stacked = newton_schulz(ms, dtype=dtype)
    assert stacked.dtype == dtype and stacked.shape == ms.shape
    alone = torch.stack([torch.stack([newton_schulz(m, dtype=dtype) for m in row]) for row in ms])
    assert torch.equal(stacked, alone)
    assert torch.equal(newton_schulz(ms.flatten(0, 1), dtype=dtype), alone.flatten(0, 1))


@pytest.mark.parametrize("shape", SHAPES, ids=["square", "wide", "tall"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_update_of_a_stack_is_that_of_each_matrix_alone_bit_for_bit(shape, nesterov):
    generator = torch.Generator().manual_seed(11)
    p, g, buf = (torch.randn(4, *shape, generator=generator) for _ in range(3))
    new_p, new_buf = muon_update(p, g, buf, lr=0.03, nesterov=nesterov, ns_dtype=torch.float32)
    alone = [muon_update(*each, lr=0.03, nesterov=nesterov, ns_dtype=torch.float32)
             for each in zip(p, g, buf, strict=True)]
    assert torch.equal(new_p, torch.stack([q for q, _ in alone]))
    assert torch.equal(new_buf, torch.stack([b for _, b in alone]))
    assert not torch.equal(new_p, p)


def plain_newton_schulz(m: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The textbook iteration on X X^T whatever the shape, in m's dtype: the reference of the Gram form."""
    a, b, c = 3.4445, -4.7750, 2.0315
    tall = m.shape[-2] > m.shape[-1]
    x = m.mT if tall else m
    x = x / x.norm(dim=(-2, -1), keepdim=True)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


@pytest.mark.parametrize("shape", [(512, 128), (128, 512), (32, 8), (100, 37), (8, 3), (3, 8)], ids=str)
def test_newton_schulz_in_float32_agrees_to_rounding_and_is_as_close_to_float64(shape):
    # Wide (or tall) matrices iterate on the Gram matrix in float32: other roundings, not worse.
    ms = torch.randn(4, *shape, generator=torch.Generator().manual_seed(9))
    ours = newton_schulz(ms, dtype=torch.float32).double()
    plain = plain_newton_schulz(ms).double()
    exact = plain_newton_schulz(ms.double())
    assert (ours - plain).abs().max() < 1e-5  # entries below 1: a few float32 roundings
    # Its distance to float64 is the plain one's (measured 4.1e-7 against 5.8e-7 at (128, 512)),
    # up to a factor of 2.
    assert (ours - exact).abs().max() <= 2 * (plain - exact).abs().max() + 1e-7


def test_the_gram_form_is_the_polynomial_of_newton_schulz():
    # Two iterations by hand, (a I + b G + c G^2) X twice, in float64: the Gram form must match.
    x = torch.randn(3, 6, 20, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    a, b, c = 3.4445, -4.7750, 2.0315
    y = x / x.norm(dim=(1, 2), keepdim=True)
    for _ in range(2):
        g = y @ y.mT
        y = (a * torch.eye(6, dtype=torch.float64) + b * g + c * g @ g) @ y
    assert torch.allclose(newton_schulz(x, steps=2, dtype=torch.float64), y, atol=1e-12)


def test_muon_update_is_one_step_of_muon_and_leaves_its_inputs_alone():
    generator = torch.Generator().manual_seed(2)
    p, g = torch.randn(6, 10, generator=generator), torch.randn(6, 10, generator=generator)
    buf = torch.zeros_like(p)
    copies = [t.clone() for t in (p, g, buf)]
    new_p, new_buf = muon_update(p, g, buf, lr=0.03, weight_decay=0.2)
    param = torch.nn.Parameter(p.clone())
    param.grad = g.clone()
    reference = torch.optim.Muon([param], lr=0.03, weight_decay=0.2)
    reference.step()
    assert torch.equal(new_p, param) and torch.equal(new_buf, reference.state[param]["momentum_buffer"])
    assert all(torch.equal(a, b) for a, b in zip((p, g, buf), copies, strict=True))


def test_a_parameter_without_a_gradient_is_left_alone():
    used, unused = torch.nn.Parameter(torch.ones(3, 4)), torch.nn.Parameter(torch.ones(4, 3))
    used.grad = torch.full((3, 4), 0.5)
    Muon([used, unused], lr=0.1).step()
    assert not torch.equal(used, torch.ones(3, 4)) and torch.equal(unused, torch.ones(4, 3))


# --- Newton-Schulz and the learning-rate scale ----------------------------------------------

@pytest.mark.parametrize("shape", [(16, 16), (8, 40), (40, 8)], ids=["square", "wide", "tall"])
def test_newton_schulz_keeps_the_singular_vectors_and_brings_the_values_near_one(shape):
    m = torch.randn(*shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    out = newton_schulz(m, dtype=torch.float32).double()
    values = torch.linalg.svdvals(out)
    assert 0.6 < values.min() and values.max() < 1.25, values      # the quintic's band, not exactly 1
    u, _, vh = torch.linalg.svd(m, full_matrices=False)
    core = u.T @ out @ vh.T                                        # diagonal iff the vectors are kept
    assert (core - torch.diag(torch.diagonal(core))).abs().max() < 1e-5
    assert (torch.diagonal(core) > 0).all()


def test_newton_schulz_in_bf16_is_the_float32_result_to_bf16_precision():
    m = torch.randn(24, 40, generator=torch.Generator().manual_seed(4))
    gap = (newton_schulz(m).float() - newton_schulz(m, dtype=torch.float32)).abs().max()
    assert gap < 0.05, gap  # entries up to about 0.5, bf16 keeps 8 bits: a few 2^-8 per product


def test_newton_schulz_of_a_tall_matrix_is_the_transpose_of_its_transpose():
    m = torch.randn(30, 7, generator=torch.Generator().manual_seed(5))
    assert torch.equal(newton_schulz(m), newton_schulz(m.T).T)


def test_newton_schulz_ignores_the_scale_of_its_input():
    m = torch.randn(6, 9, generator=torch.Generator().manual_seed(6))
    assert torch.allclose(newton_schulz(m, dtype=torch.float32), newton_schulz(1000 * m, dtype=torch.float32),
                          atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_newton_schulz_of_huge_finite_entries_is_that_of_ordinary_ones(dtype):
    # Entries around 1e20 square to inf in float32 and bf16: the norm overflowed and the result
    # was all zeros. A power-of-two scale (2^66 ~ 7e19) must not change a single bit, whatever
    # the input's dtype; 1e20 is the same matrix up to rounding of the input.
    m = torch.randn(6, 9, generator=torch.Generator().manual_seed(6))
    ordinary = newton_schulz(m, dtype=dtype)
    assert ordinary.abs().max() > 0.5
    assert torch.equal(newton_schulz(m * 2.0**66, dtype=dtype), ordinary)
    assert torch.equal(newton_schulz(m.double() * 2.0**1000, dtype=dtype), newton_schulz(m.double(), dtype=dtype))
    assert torch.equal(newton_schulz(torch.stack([m, m * 2.0**66]), dtype=dtype),
                       newton_schulz(torch.stack([m, m]), dtype=dtype))
    reference = newton_schulz(m, dtype=torch.float32)  # bf16 is within 0.05 of it (the test above)
    gap = (newton_schulz(m * 1e20, dtype=dtype).float() - reference).abs().max()
    assert gap < (0.05 if dtype == torch.bfloat16 else 1e-5), gap


def test_learning_rate_scale_follows_each_rule():
    assert muon_lr_scale((512, 128)) == 2.0 and muon_lr_scale((128, 512)) == 1.0
    assert muon_lr_scale((128, 512), "match_rms_adamw") == pytest.approx(0.2 * math.sqrt(512))
    assert muon_lr_scale(torch.Size([64, 64]), "match_rms_adamw") == pytest.approx(1.6)


# --- who gets which optimiser ---------------------------------------------------------------

def test_split_for_muon_gives_muon_the_hidden_linears_and_adamw_the_rest():
    model = small_gpt()
    hidden, matrices, vectors = split_for_muon(model)
    names = {id(p): name for name, p in model.named_parameters()}
    assert all(names[id(p)].startswith("blocks.") and p.dim() == 2 for p in hidden)
    assert {names[id(p)] for p in matrices} == {"embed.token.weight", "embed.position.weight"}  # head tied
    assert all(p.dim() == 1 for p in vectors)
    assert len(hidden) == 2 * 6  # per block: q, k, v, out, up, down
    assert len(hidden) + len(matrices) + len(vectors) == len(list(model.parameters()))


def test_split_for_muon_sends_an_untied_head_to_adamw():
    model = ModernGPT(ModernConfig(vocab_size=11, context_length=8, n_layers=1, n_heads=2, d_model=8))
    hidden, matrices, _ = split_for_muon(model)
    assert any(p is model.lm_head.weight for p in matrices)
    assert not any(p is model.lm_head.weight for p in hidden)


def test_split_for_muon_refuses_a_head_name_that_matches_no_module():
    # a misspelt head would match nothing and the untied head would go to Muon
    model = ModernGPT(ModernConfig(vocab_size=11, context_length=8, n_layers=1, n_heads=2, d_model=8,
                                   tie_weights=False))
    with pytest.raises(ValueError, match="^head_names has 'lm_haed', which names no module of the model, "
                                         "expected the output head's name"):
        split_for_muon(model, head_names=("lm_head", "lm_haed"))
    assert any(p is model.lm_head.weight for p in split_for_muon(model, head_names=("lm_head",))[1])


def test_muon_with_adamw_refuses_a_weight_listed_twice():
    model = small_gpt()
    hidden, matrices, vectors = split_for_muon(model)
    with pytest.raises(ValueError, match=r"^param_groups' group 1, weight 2 \(shape \(8, 8\)\) is also "
                                         r"group 0, weight 0, expected each weight in one group"):
        MuonWithAdamW(muon_param_groups(hidden, [*matrices, hidden[0]], vectors))
    with pytest.raises(ValueError, match=r"^param_groups' group 0, weight 1 .* is also group 0, weight 0"):
        MuonWithAdamW(muon_param_groups([hidden[0], hidden[0]], matrices, vectors))


def test_muon_with_adamw_steps_both_parts_and_its_state_round_trips():
    model = small_gpt()
    optimizer = MuonWithAdamW(muon_param_groups(*split_for_muon(model), muon_lr=0.02, adamw_lr=1e-3))
    ids = token_ids()
    x, y = random_batch(ids, 4, SMALL.context_length, torch.Generator().manual_seed(0))
    before = [p.detach().clone() for p in model.parameters()]
    F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    optimizer.step()
    assert all(not torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert [(g["use_muon"], g["lr"]) for g in optimizer.param_groups] == [(True, 0.02), (False, 1e-3), (False, 1e-3)]
    twin = MuonWithAdamW(muon_param_groups(*split_for_muon(small_gpt()), muon_lr=0.02, adamw_lr=1e-3))
    twin.load_state_dict(optimizer.state_dict())
    assert len(twin.state) == len(optimizer.state) == len(list(model.parameters()))
    assert twin.muon.state is twin.state and twin.adamw.param_groups[0] is twin.param_groups[1]  # shared
    hidden = optimizer.param_groups[0]["params"][0]
    assert torch.equal(twin.state[twin.param_groups[0]["params"][0]]["momentum_buffer"],
                       optimizer.state[hidden]["momentum_buffer"])
    optimizer.zero_grad()
    assert all(p.grad is None for p in model.parameters())


# --- bad input ------------------------------------------------------------------------------

def matrix() -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.ones(3, 4))


@pytest.mark.parametrize("make, error, words", [
    (lambda: Muon([torch.nn.Parameter(torch.ones(5))]), ValueError, r"params.*\(5,\).*2-D.*AdamW"),
    (lambda: Muon([torch.nn.Parameter(torch.ones(2, 3, 4))]), ValueError, r"params.*\(2, 3, 4\)"),
    (lambda: Muon(matrix()), TypeError, "params is a single tensor"),
    (lambda: Muon([matrix()], lr=-0.1), ValueError, r"lr is -0.1, expected a finite number >= 0"),
    (lambda: Muon([matrix()], lr=float("nan")), ValueError, "lr is nan"),
    (lambda: Muon([matrix()], lr="0.02"), TypeError, "lr is '0.02'"),
    (lambda: Muon([matrix()], momentum=1.0), ValueError, r"momentum is 1.0, expected a number in \[0, 1\)"),
    (lambda: Muon([matrix()], momentum=float("inf")), ValueError, "momentum is inf"),
    (lambda: Muon([matrix()], weight_decay=-1), ValueError, "weight_decay is -1"),
    (lambda: Muon([matrix()], nesterov="True"), TypeError, "nesterov is 'True'"),
    (lambda: Muon([matrix()], rule="adamw"), ValueError, "rule is 'adamw', expected one of 'original'"),
    (lambda: Muon([matrix()], steps=0), ValueError, "steps is 0, expected a positive int"),
    (lambda: Muon([matrix()], steps=5.0), TypeError, "steps is 5.0"),
    (lambda: Muon([matrix()], steps=100), ValueError, "steps is 100, expected fewer than 100"),
    (lambda: Muon([matrix()], eps=0.0), ValueError, "eps is 0.0, expected a finite number > 0"),
    (lambda: Muon([matrix()], coefficients=(1.0, 2.0)), ValueError, r"coefficients is \(1.0, 2.0\), expected three"),
    (lambda: Muon([matrix()], coefficients=(1.0, float("nan"), 2.0)), ValueError, r"coefficients\[1\] is nan"),
    (lambda: Muon([matrix()], coefficients=(0, 0, 0)), ValueError,
     r"^coefficients is \(0, 0, 0\), expected a > 0 in \(a, b, c\), such as NS_COEFFICIENTS"),
    (lambda: newton_schulz(torch.ones(2, 2), coefficients=(-1.0, 0.0, 0.0)), ValueError, "expected a > 0"),
    (lambda: newton_schulz(torch.ones(4)), ValueError, r"m has shape \(4,\), expected a matrix \(A, B\) or a stack"),
    (lambda: newton_schulz(torch.ones(0, 3, 4)), ValueError, r"m has shape \(0, 3, 4\)"),
    (lambda: newton_schulz(torch.ones(2, 2, dtype=torch.long)), TypeError, "m has dtype torch.int64"),
    (lambda: newton_schulz([[1.0, 2.0]]), TypeError, "m is a list"),
    (lambda: newton_schulz(torch.tensor([[1.0, float("inf")]])), ValueError, "m holds NaN or inf"),
    (lambda: newton_schulz(torch.ones(2, 2), dtype=torch.int32), TypeError, "dtype is torch.int32"),
    (lambda: newton_schulz(torch.full((2, 3, 4), float("nan"))), ValueError, "m holds NaN"),
    (lambda: newton_schulz(torch.ones(2, 3, 4), steps=0), ValueError, "steps is 0"),
    (lambda: Muon([matrix()], ns_dtype="bf16"), TypeError, "ns_dtype is 'bf16'"),
    (lambda: muon_update(torch.ones(2, 3), torch.ones(3, 2), torch.zeros(2, 3), lr=0.1),
     ValueError, r"g has shape \(3, 2\), expected p's shape \(2, 3\)"),
    (lambda: muon_update(torch.ones(2, 3), torch.ones(2, 3), None, lr=0.1), TypeError, "buf is a NoneType"),
    (lambda: muon_update(torch.ones(2, 3), torch.ones(2, 3), torch.zeros(2, 3), lr=0.1, momentum=1.0), ValueError,
     "momentum is 1.0"),
    (lambda: muon_lr_scale((3, 4, 5)), ValueError, r"shape is \(3, 4, 5\), expected a matrix's shape"),
    (lambda: muon_lr_scale((0, 4)), ValueError, r"shape\[0\] is 0"),
    (lambda: split_for_muon("gpt"), TypeError, "model is 'gpt'"),
    (lambda: split_for_muon(small_gpt(), head_names="lm_head"), TypeError, "head_names is 'lm_head'"),
    (lambda: muon_param_groups([], [], [matrix()]), ValueError, "hidden is empty"),
    (lambda: muon_param_groups([matrix()], [], [], muon_lr=0), ValueError, "muon_lr is 0"),
    (lambda: muon_param_groups([matrix()], [], [], adamw_lr=float("inf")), ValueError, "adamw_lr is inf"),
    (lambda: muon_param_groups(matrix(), [], []), TypeError, "hidden is Parameter, expected a list"),
    (lambda: MuonWithAdamW([{"params": [matrix()]}]), TypeError, "param_groups' group 0 has use_muon=None"),
    (lambda: MuonWithAdamW([]), TypeError, "param_groups is a list of 0, expected a non-empty list of dicts"),
    (lambda: MuonWithAdamW([{"params": [matrix()], "use_muon": False}]), ValueError,
     "param_groups has no group with use_muon=True"),
    (lambda: MuonWithAdamW([{"params": [matrix()], "use_muon": True, "lr": -1.0}]), ValueError, "lr is -1.0"),
    (lambda: MuonWithAdamW([{"params": [torch.nn.Parameter(torch.ones(3))], "use_muon": True}]), ValueError,
     r"params \(group 0, weight 0\) has shape \(3,\), expected a 2-D matrix"),
    (lambda: TrainConfig(optimizer="sgd"), ValueError, "optimizer is 'sgd', expected one of 'adamw', 'muon'"),
    (lambda: TrainConfig(optimizer="muon", muon_learning_rate=-1.0), ValueError, "muon_learning_rate is -1.0"),
])
def test_bad_input_is_refused_naming_the_argument(make, error, words):
    with pytest.raises(error, match=words):
        make()


# --- the Trainer ----------------------------------------------------------------------------

@pytest.mark.parametrize("fast, precision", [(False, "fp32"), (True, "fp32"), (True, "bf16")])
def test_trainer_with_muon_lowers_the_loss_of_a_small_gpt(fast, precision):
    model, ids = small_gpt(), (torch.arange(2000) * 3) % SMALL.vocab_size  # a pattern to learn
    trainer = Trainer(model, ids[:1600], ids[1600:], TrainConfig(
        batch_size=8, optimizer="muon", fast=fast, precision=precision, eval_every=1000))
    assert isinstance(trainer.optimizer, MuonWithAdamW)
    assert trainer.optimizer.muon.param_groups[0]["ns_dtype"] == trainer.dtype  # emulated bf16 is slow
    before = trainer.evaluate()["train"]
    history = trainer.fit(steps=40, progress_bar=False)
    assert history.train_losses[-1] < before - 0.25, (before, history.train_losses)  # 2.40 -> 2.06
    hidden = trainer.optimizer.muon.param_groups[0]
    assert hidden["lr"] == pytest.approx(history.lrs[-1] * TrainConfig.muon_learning_rate / 2e-3)  # the same schedule


def test_muon_trainer_steps_are_muon_steps_with_float32_newton_schulz():
    model, ids = small_gpt(), token_ids()
    trainer = Trainer(model, ids, ids, TrainConfig(batch_size=4, optimizer="muon", fast=False, grad_clip=1e9))
    twin = small_gpt()
    hidden, matrices, vectors = split_for_muon(twin)
    lr = 1e-3
    reference = Muon(hidden, lr=lr * (TrainConfig.muon_learning_rate / 2e-3), weight_decay=0.1,
                     ns_dtype=torch.float32)  # lr: the Trainer's
    adamw = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}],
                              lr=lr, betas=(0.9, 0.99), foreach=False)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        trainer.train_step(lr)
        x, y = random_batch(ids, 4, SMALL.context_length, generator)
        twin.zero_grad(set_to_none=True)
        F.cross_entropy(twin(x).flatten(0, 1), y.flatten()).backward()
        reference.step()
        adamw.step()
    for ours, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(ours, theirs)


def test_the_default_trainer_is_still_plain_adamw_bit_for_bit():
    model, twin, ids = small_gpt(), small_gpt(), token_ids()
    trainer = Trainer(model, ids, ids, TrainConfig(batch_size=4, fast=False))
    matrices = [p for p in twin.parameters() if p.dim() >= 2]
    vectors = [p for p in twin.parameters() if p.dim() < 2]
    adamw = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}],
                              lr=2e-3, betas=(0.9, 0.99), foreach=False)
    generator = torch.Generator().manual_seed(0)
    for step in range(4):
        lr = learning_rate((step + 1) / 4, 2e-3)
        trainer.train_step(lr)
        for group in adamw.param_groups:
            group["lr"] = lr
        x, y = random_batch(ids, 4, SMALL.context_length, generator)
        twin.zero_grad(set_to_none=True)
        F.cross_entropy(twin(x).flatten(0, 1), y.flatten()).backward()
        torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0, foreach=False)
        adamw.step()
    assert isinstance(trainer.optimizer, torch.optim.AdamW)
    for ours, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(ours, theirs)
