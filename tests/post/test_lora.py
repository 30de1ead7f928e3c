"""LoRA by hand (helpers.post.lora): starts as the base model, merges exactly, equals peft."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from helpers.model.gpt import GPT, GPTConfig
from helpers.post.lora import LoRALinear, add_lora, merge_lora, trainable_count


def small_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=20, context_length=16, n_layers=2, n_heads=2, d_model=16)).eval()


def randomise_b(model: nn.Module, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.weight.copy_(torch.randn(m.lora_B.weight.shape, generator=generator) * 0.1)


def test_b_zero_leaves_the_model_unchanged():
    base = small_gpt()
    adapted = copy.deepcopy(base)
    add_lora(adapted, ["q_proj", "v_proj"], r=4, alpha=8)
    x = torch.randint(20, (3, 10))
    assert torch.equal(adapted(x), base(x))
    randomise_b(adapted)
    assert (adapted(x) - base(x)).abs().max() > 1e-4  # the check above could fail


def test_forward_is_base_plus_scaled_low_rank_product():
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(12, 6), r=3, alpha=6)
    nn.init.normal_(layer.lora_B.weight)
    x = torch.randn(5, 12)
    by_hand = x @ layer.base.weight.T + layer.base.bias + 2.0 * (x @ layer.lora_A.weight.T @ layer.lora_B.weight.T)
    torch.testing.assert_close(layer(x), by_hand)
    assert layer.scaling == 2.0


def test_only_the_adapters_train():
    model = small_gpt()
    add_lora(model, ["q_proj", "v_proj"], r=2, alpha=4)
    # 2 blocks x 2 layers x (A: 2 x 16 + B: 16 x 2)
    assert trainable_count(model) == 2 * 2 * (2 * 16 + 16 * 2)
    assert all(("lora_" in n) == p.requires_grad for n, p in model.named_parameters())


def test_merged_weights_give_the_adapters_outputs():
    model = small_gpt()
    add_lora(model, ["q_proj", "v_proj", "up"], r=4, alpha=16)
    randomise_b(model)
    x = torch.randint(20, (2, 12))
    before = model(x)
    assert merge_lora(model) == 6
    torch.testing.assert_close(model(x), before, atol=1e-5, rtol=0)


def test_peft_gives_the_same_outputs_from_the_same_a_and_b():
    peft = pytest.importorskip("peft")
    base = small_gpt()
    ours = copy.deepcopy(base)
    add_lora(ours, ["q_proj", "v_proj"], r=4, alpha=8)
    randomise_b(ours)
    theirs = peft.inject_adapter_in_model(
        peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]),
        copy.deepcopy(base))
    with torch.no_grad():
        for name, module in ours.named_modules():
            if isinstance(module, LoRALinear):
                peft_layer = theirs.get_submodule(name)
                assert peft_layer.scaling["default"] == module.scaling
                peft_layer.lora_A["default"].weight.copy_(module.lora_A.weight)
                peft_layer.lora_B["default"].weight.copy_(module.lora_B.weight)
    x = torch.randint(20, (3, 11))
    torch.testing.assert_close(theirs(x), ours(x), atol=1e-6, rtol=0)
    assert (ours(x) - base(x)).abs().max() > 1e-4


@pytest.mark.parametrize("r", [0, -1, 7])
def test_bad_rank_is_refused(r):
    with pytest.raises(ValueError, match="r is"):
        LoRALinear(nn.Linear(6, 8), r=r, alpha=1.0)


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="base"):
        LoRALinear(nn.Conv1d(2, 2, 1), r=1, alpha=1.0)
    with pytest.raises(ValueError, match="alpha"):
        LoRALinear(nn.Linear(4, 4), r=1, alpha=0.0)
    with pytest.raises(ValueError, match="no nn.Linear"):
        add_lora(small_gpt(), ["nothing"], r=1, alpha=1.0)
    with pytest.raises(ValueError, match="no LoRALinear"):
        merge_lora(small_gpt())
    layer = LoRALinear(nn.Linear(4, 4), r=1, alpha=1.0)
    layer.merge()
    with pytest.raises(ValueError, match="already merged"):
        layer.merge()


def test_fast_path_and_generation_see_the_adapter():
    model = small_gpt()
    add_lora(model, ["q_proj", "v_proj"], r=4, alpha=8)
    randomise_b(model)
    x = torch.randint(20, (2, 9))
    torch.testing.assert_close(model(x, fast=True), model(x), atol=1e-5, rtol=0)
