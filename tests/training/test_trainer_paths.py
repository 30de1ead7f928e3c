"""The Trainer's two paths, decided once in its constructor (FlatWeights or PlainWeights behind
the same calls), proven equal here: the same losses and steps from the same weights and data,
with AdamW and with Muon, and what each path builds and runs on.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from shared_tools import small_gpt

from helpers.model.gpt import GPT
from helpers.training import speed
from helpers.training import trainer as train
from helpers.training.trainer import TrainConfig, Trainer, random_batch

# --- the two paths, proven equal: the same weights and data under each --------------------

@pytest.fixture
def paired_trainers(small_config, model_and_data) -> Callable[..., tuple[Trainer, Trainer]]:
    """paired_trainers(precision, **config) -> (plain, fast): the same weights and data on each path."""
    def make(precision: str, **config: object) -> tuple[Trainer, Trainer]:
        model, train_ids, val_ids = model_and_data()
        twin = GPT(small_config)
        twin.load_state_dict(model.state_dict())
        plain = Trainer(model, train_ids, val_ids, TrainConfig(fast=False, batch_size=4, **config))
        fast = Trainer(twin, train_ids, val_ids, TrainConfig(fast=True, precision=precision, batch_size=4,
                                                             **config))
        return plain, fast
    return make


@pytest.mark.parametrize("precision,tolerance", [("fp32", 1e-5), ("bf16", 2e-2)])
def test_fast_and_plain_paths_give_the_same_loss_on_the_same_batch(precision, tolerance, paired_trainers):
    # Tolerance: float32 only reorders sums; bfloat16 keeps ~3 significant digits, and the
    # loss (about 2 nats here) is a mean over 64 tokens, so 2e-2 nats is ~1 %.
    plain, fast = paired_trainers(precision)
    assert plain.dtype == torch.float32
    assert fast.dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
    x, y = random_batch(plain.train_ids, 4, 16, torch.Generator().manual_seed(3))
    assert abs(plain.loss_on(x, y).item() - fast.loss_on(x, y).item()) < tolerance
    # One optimiser step each from the same weights on the same batch keeps them together.
    assert plain.train_step(1e-3) == pytest.approx(fast.train_step(1e-3), abs=tolerance)
    assert abs(plain.loss_on(x, y).item() - fast.loss_on(x, y).item()) < tolerance


def test_fast_fp32_trainer_takes_the_same_steps_as_the_plain_one(paired_trainers):
    plain, fast = paired_trainers("fp32")
    for step in range(5):
        assert plain.train_step(1e-3) == pytest.approx(fast.train_step(1e-3), abs=1e-5), step
    for (name, a), b in zip(plain.model.named_parameters(), fast.model.parameters(), strict=True):
        # Adam moves every weight by about lr per step whatever its gradient's size, so the
        # weights agree to well under one step (1e-3) if the two paths agree.
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=name)


def test_fast_fp32_trainer_takes_the_same_muon_steps_as_the_plain_one(paired_trainers):
    plain, fast = paired_trainers("fp32", optimizer="muon")
    for step in range(4):
        assert plain.train_step(1e-3) == pytest.approx(fast.train_step(1e-3), abs=1e-5), step
    for (name, a), b in zip(plain.model.named_parameters(), fast.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=name)
    assert [g["lr"] for g in plain.optimizer.param_groups] == [g["lr"] for g in fast.optimizer.param_groups]


def test_bf16_path_trains_float32_weights_through_a_bf16_working_copy(model_and_data):
    model, train_ids, val_ids = model_and_data()
    trainer = Trainer(model, train_ids, val_ids, TrainConfig(batch_size=4, precision="bf16"))
    before = model.lm_head.weight.detach().clone()
    trainer.fit(steps=3, progress_bar=False)
    working = trainer.working
    assert working is not model and working.lm_head.weight is working.embed.token.weight
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in working.parameters())
    assert not torch.equal(model.lm_head.weight, before), "the float32 weights were updated"
    for master, low in zip(model.parameters(), working.parameters(), strict=True):
        assert torch.equal(low, master.to(torch.bfloat16)), "the copy follows the weights"


def _record_fast(model) -> list[bool]:
    seen: list[bool] = []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs.get("fast", False)),
                                    with_kwargs=True)
    return seen


@pytest.mark.parametrize("fast", [True, False])
def test_a_gpt_trains_on_its_fused_kernels_only_on_the_fast_path_and_evaluates_on_them(fast, tiny_trainer):
    trainer = tiny_trainer(fast=fast, precision="fp32")  # fp32: the working model is the model
    seen = _record_fast(trainer.model)
    x, y = trainer._batch(trainer.train_ids, torch.Generator().manual_seed(0))
    trainer.loss_on(x, y)
    assert seen == [fast]
    seen.clear()
    trainer.evaluate()  # the same yardstick for every trainer: fused kernels, float32
    assert seen == [True, True]


def test_a_model_that_is_not_a_gpt_is_called_without_fast():
    class Doubler(torch.nn.Module):
        def forward(self, x):
            return 2 * x
    assert train._logits(Doubler(), torch.ones(2), fast=True).tolist() == [2.0, 2.0]


def test_the_plain_path_frees_each_steps_gradients_instead_of_zeroing_them_in_place(tiny_trainer):
    trainer = tiny_trainer(fast=False)
    trainer.train_step(1e-3)
    before = [(p.grad, p.grad.clone()) for p in trainer.model.parameters()]
    trainer.train_step(1e-3)
    for p, (grad, kept) in zip(trainer.model.parameters(), before, strict=True):
        assert p.grad is not grad and torch.equal(grad, kept)  # set_to_none: the old one untouched


@pytest.mark.parametrize("fast", [True, False])
def test_each_path_builds_its_own_working_model_and_optimizer(fast, tiny_trainer):
    trainer = tiny_trainer(fast=fast, precision="fp32")
    if fast:  # one buffer for every weight, and PyTorch's fused AdamW step
        assert isinstance(trainer.weights, speed.FlatWeights) and trainer.optimizer.defaults["fused"] is True
    else:  # the model itself, and the textbook per-parameter AdamW
        assert isinstance(trainer.weights, train.PlainWeights) and trainer.working is trainer.model
        assert not trainer.optimizer.defaults["fused"] and trainer.optimizer.defaults["foreach"] is False


@pytest.mark.parametrize("fast", [False, True])
def test_weight_decay_reaches_the_matrices_only_at_the_configured_value(fast):
    model = small_gpt(torch.float32)
    ids = torch.randint(0, 31, (500,), generator=torch.Generator().manual_seed(0))
    trainer = Trainer(model, ids, ids, TrainConfig(weight_decay=0.37, learning_rate=3e-3,
                                                   fast=fast, precision="fp32", batch_size=2))
    groups = trainer.optimizer.param_groups
    assert [g["weight_decay"] for g in groups] == [0.37, 0.0]
    assert all(g["lr"] == 3e-3 for g in groups)
    decayed = sum(p.numel() for p in groups[0]["params"])
    not_decayed = sum(p.numel() for p in groups[1]["params"])
    matrices = sum(p.numel() for p in model.parameters() if p.dim() >= 2)
    vectors = sum(p.numel() for p in model.parameters() if p.dim() < 2)
    assert (decayed, not_decayed) == (matrices, vectors)  # the tied matrix counted once
