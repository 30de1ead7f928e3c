"""LoRA by hand (helpers.post.lora): starts as the base model, merges exactly, equals peft."""

from __future__ import annotations

import copy

import pytest
import torch
from shared_tools import full
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


# helpers.post.lora, exactly:
#
# peft's naming rule for target modules (a whole name or a dotted suffix, never a bare suffix),
# layers at the top level of a model, A's initialisation bound (peft's kaiming_uniform with
# a = sqrt(5): |A| <= 1 / sqrt(in_features)), what the properties return merged and unmerged,
# the rank at its largest, and every error message read in full.

class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(4, 4)
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.inner.add_module("proj", nn.Linear(4, 4))
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        return self.inner.proj(self.inner(self.q_proj(self.norm(x))))


def test_layer_fields_and_initial_state():
    torch.manual_seed(0)
    base = nn.Linear(64, 6)
    layer = LoRALinear(base, r=4, alpha=3)
    assert layer.base is base and layer.r == 4 and layer.alpha == 3.0 and isinstance(layer.alpha, float)
    assert layer.scaling == 0.75 and layer.merged is False
    assert layer.lora_A.weight.shape == (4, 64) and layer.lora_B.weight.shape == (6, 4)
    assert layer.lora_A.bias is None and layer.lora_B.bias is None
    assert not layer.lora_B.weight.any()
    assert not base.weight.requires_grad and not base.bias.requires_grad
    assert layer.lora_A.weight.requires_grad and layer.lora_B.weight.requires_grad
    assert layer.in_features == 64 and layer.out_features == 6 and layer.bias is base.bias


def test_a_is_kaiming_uniform_with_peft_s_bound():
    """kaiming_uniform(a = sqrt(5)) draws from U(-1/sqrt(fan_in), 1/sqrt(fan_in)): 1/8 here;
    512 draws reach past 0.12 (the chance they all stay under is 0.96^512)."""
    torch.manual_seed(0)
    a = LoRALinear(nn.Linear(64, 64), r=8, alpha=8).lora_A.weight
    assert 0.12 < a.abs().max().item() <= 1 / 8


def test_the_rank_may_be_the_smaller_side():
    layer = LoRALinear(nn.Linear(6, 3), r=3, alpha=1.0)
    assert layer.lora_A.weight.shape == (3, 6)
    with pytest.raises(ValueError, match=full("r is 4, expected at most min(in_features, out_features) "
                                              "= 3: a rank-4 update of a 3 x 6 matrix cannot exist")):
        LoRALinear(nn.Linear(6, 3), r=4, alpha=1.0)


def test_weight_delta_and_merge():
    torch.manual_seed(0)
    base = nn.Linear(5, 3)
    original = base.weight.detach().clone()
    layer = LoRALinear(base, r=2, alpha=4)
    nn.init.normal_(layer.lora_B.weight)
    delta = 2.0 * layer.lora_B.weight @ layer.lora_A.weight
    assert (layer.delta_weight() - delta).abs().max() < 1e-6
    assert (layer.weight - (original + delta)).abs().max() < 1e-6
    x = torch.randn(2, 5)
    before = layer(x)
    layer.merge()
    assert layer.merged and (base.weight - (original + delta)).abs().max() < 1e-6
    assert layer.weight is base.weight                       # not W + delta again
    assert (layer(x) - before).abs().max() < 1e-5
    assert (layer(x) - base(x)).abs().max() == 0             # one plain matmul
    with pytest.raises(ValueError, match=full("this adapter is already merged")):
        layer.merge()
    assert not base.weight.requires_grad


def test_names_match_whole_or_dotted_suffix_only():
    model = Toy()
    assert add_lora(model, ["proj"], r=1, alpha=1.0) == ["inner.proj"]  # not q_proj
    assert isinstance(model.inner.proj, LoRALinear) and isinstance(model.q_proj, nn.Linear)


def test_a_top_level_layer_and_a_numbered_one_are_wrapped():
    model = Toy()
    names = add_lora(model, ["q_proj", "0"], r=2, alpha=2.0)
    assert names == ["q_proj", "inner.0"]
    assert isinstance(model.q_proj, LoRALinear) and isinstance(model.inner[0], LoRALinear)
    assert model(torch.randn(3, 4)).shape == (3, 4)


def test_add_lora_freezes_everything_else():
    model = Toy()
    add_lora(model, ["q_proj"], r=2, alpha=2.0)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"q_proj.lora_A.weight", "q_proj.lora_B.weight"}
    assert trainable_count(model) == 2 * 4 + 4 * 2


def test_trainable_count_counts_a_shared_tensor_once():
    shared = nn.Linear(3, 3)
    model = nn.Sequential(shared, shared)
    assert trainable_count(model) == 12
    shared.bias.requires_grad_(False)
    assert trainable_count(model) == 9


def test_merge_lora_merges_every_adapter():
    model = Toy()
    add_lora(model, ["q_proj", "proj", "0"], r=1, alpha=1.0)
    assert merge_lora(model) == 3
    assert all(m.merged for m in model.modules() if isinstance(m, LoRALinear))


@pytest.mark.parametrize("call, error, message", [
    (lambda: LoRALinear(nn.Conv1d(2, 2, 1), r=1, alpha=1.0), TypeError,
     "base is a Conv1d, expected an nn.Linear"),
    (lambda: LoRALinear(nn.Linear(4, 4), r=0, alpha=1.0), ValueError, "r is 0, expected a positive int"),
    (lambda: LoRALinear(nn.Linear(4, 4), r=1, alpha=0.0), ValueError,
     "alpha is 0.0, expected a finite number > 0"),
    (lambda: add_lora(Toy(), [], r=1, alpha=1.0), ValueError,
     "target_modules is empty, expected names such as ['q_proj', 'v_proj']"),
    (lambda: add_lora(Toy(), ["k_proj", "norm"], r=1, alpha=1.0), ValueError,
     "no nn.Linear of the model is named like ['k_proj', 'norm']"),
    (lambda: merge_lora(Toy()), ValueError, "the model has no LoRALinear layer to merge"),
])
def test_errors_in_full(call, error, message):
    with pytest.raises(error, match=full(message)):
        call()


def test_a_bad_argument_leaves_the_model_untouched():
    """The rank fits the first layer (4 x 4) but not the second (4 x 2): refused before any
    layer is frozen or wrapped."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    calls = [lambda: add_lora(model, ["0", "1"], r=3, alpha=1.0),
             lambda: add_lora(model, ["0"], r=1, alpha=-1.0),
             lambda: add_lora(model, ["nothing"], r=1, alpha=1.0),
             lambda: add_lora(model, "0", r=1, alpha=1.0)]
    for call in calls:
        with pytest.raises((ValueError, TypeError)):
            call()
        assert all(isinstance(m, nn.Linear) for m in model) and trainable_count(model) == 30


@pytest.mark.parametrize("targets", ["q_proj", ["q_proj", 3]])
def test_target_modules_must_be_a_list_of_names(targets):
    with pytest.raises(TypeError, match=full(f"target_modules is {targets!r}, expected a list of "
                                             "layer names such as ['q_proj', 'v_proj']")):
        add_lora(Toy(), targets, r=1, alpha=1.0)
