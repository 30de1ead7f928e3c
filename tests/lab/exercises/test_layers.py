"""Notebook 6's checkers (helpers/lab/exercises/layers.py): every correct formulation passes,
each usual slip fails with a message that names it, and a stub hears what to write."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import helpers.lab.exercises as exercises
from helpers.model.layers import LayerNorm

from .judging import (
    assert_cases_cover,
    assert_leaves_the_global_random_numbers_alone,
    assert_not_attempted_says_the_task,
    case_ids,
    exercise_names,
    judge,
)


def layer_norm_rsqrt(x, weight, bias, eps):
    centred = x - x.mean(-1, keepdim=True)
    return centred * torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + eps) * weight + bias


def layer_norm_unbiased(x, weight, bias, eps):
    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + eps) * weight + bias


def layer_norm_eps_outside(x, weight, bias, eps):
    centred = x - x.mean(-1, keepdim=True)
    return centred / (centred.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight + bias


def swiglu_sigmoid_form(x, w_gate, w_up, w_down):
    gate = x @ w_gate
    return (gate * torch.sigmoid(gate) * (x @ w_up)) @ w_down


def swiglu_swapped(x, w_gate, w_up, w_down):
    return (F.silu(x @ w_up) * (x @ w_gate)) @ w_down


def swiglu_glu(x, w_gate, w_up, w_down):
    return (torch.sigmoid(x @ w_gate) * (x @ w_up)) @ w_down


def rank_one_flatten(x):
    centred = x - x.mean(-2, keepdim=True)
    return centred.flatten(-2).norm(dim=-1) / x.flatten(-2).norm(dim=-1)


def rank_one_whole(x):
    return (x - x.mean(-2, keepdim=True)).norm() / x.norm()


def rank_one_no_centring(x):
    return x.flatten(-2).norm(dim=-1) / x.flatten(-2).norm(dim=-1)


def block_answer(slip: str = ""):
    """A student's block; `slip` picks a usual mistake ("always_pre": ignores block.pre_norm)."""
    def my_block_forward(x, block, causal=True):
        ln2 = block.ln1 if slip == "ln1_twice" else block.ln2
        act = {"relu": F.relu, "tanh": lambda t: F.gelu(t, approximate="tanh")}.get(slip, F.gelu)
        attend = causal and slip != "no_causal"
        if slip == "post" or (not block.pre_norm and slip != "always_pre"):
            x = block.ln1(x + block.attn(x, causal=attend))
            return ln2(x + block.mlp.down(act(block.mlp.up(x))))
        h = block.ln1(x)
        base = {"no_attn_residual": 0.0, "normed_residual": h}.get(slip, x)
        x = base + block.attn(h, causal=attend)
        branch = block.mlp.down(act(block.mlp.up(ln2(x))))
        out = branch if slip == "no_mlp_residual" else x + branch
        return block.ln2(out) if slip == "final_norm" else out
    return my_block_forward


def block_by_hand(x, block, causal=True):
    """Another right answer: LayerNorm and the FFN's products written out, both orders."""
    def norm(t, ln):
        centred = t - t.mean(-1, keepdim=True)
        return centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + ln.eps) * ln.weight + ln.bias

    def ffn(t):
        return F.gelu(t @ block.mlp.up.weight.T + block.mlp.up.bias) @ block.mlp.down.weight.T + block.mlp.down.bias

    if block.pre_norm:
        x = x + block.attn(norm(x, block.ln1), causal=causal)
        return x + ffn(norm(x, block.ln2))
    x = norm(x + block.attn(x, causal=causal), block.ln1)
    return norm(x + ffn(x), block.ln2)


BLOCK_CASES = [
    (block_answer(), None),
    (block_by_hand, None),
    (lambda x, block, causal=True: block(x, causal=causal), "calls helpers.model.layers.Block.forward"),
    (block_answer("post"), "Post-LN, 2017"),
    (block_answer("always_pre"), "uses the Pre-LN order, but this block is Post-LN"),
    (block_answer("no_attn_residual"), "no residual around attention"),
    (block_answer("normed_residual"), "adds the attention branch to the normalised x"),
    (block_answer("no_mlp_residual"), "no residual around the FFN"),
    (block_answer("ln1_twice"), "uses ln1 for the FFN too"),
    (block_answer("relu"), "uses ReLU"),
    (block_answer("tanh"), "tanh approximation"),
    (block_answer("no_causal"), "ignores causal=True"),
    (block_answer("final_norm"), "normalises the block's output"),
]


def init_answer(slip: str = ""):
    """A student's GPT-2 initialisation; `slip` picks a usual mistake."""
    @torch.no_grad()
    def my_gpt2_init(blocks, n_layers, std=0.02):
        divisor = {"no_factor": 1.0, "sqrt_n": math.sqrt(n_layers), "two_n": 2 * n_layers}.get(
            slip, math.sqrt(2 * n_layers))
        for module in blocks.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, std / divisor if slip == "scale_all" else std)
                if slip != "keep_bias":
                    module.bias.zero_()
            if slip == "touch_norms" and isinstance(module, LayerNorm):
                module.weight.normal_(0.0, std)
        for block in blocks:
            residual = (block.attn.out_proj, block.mlp.down) if slip != "scale_up" else (block.attn.out_proj, block.mlp.up)
            for layer in residual:
                layer.weight.normal_(0.0, std / divisor)
        return blocks
    return my_gpt2_init


def init_by_names(blocks, n_layers, std=0.02):
    """Another right answer: by parameter name, with torch.nn.init."""
    for name, param in blocks.named_parameters():
        if name.endswith("bias") and "ln" not in name:
            torch.nn.init.zeros_(param)
        elif name.endswith(("out_proj.weight", "down.weight")):
            torch.nn.init.normal_(param, std=std / math.sqrt(2 * n_layers))
        elif "ln" not in name:
            torch.nn.init.normal_(param, std=std)
    return blocks


def init_by_the_course(blocks, n_layers, std=0.02):
    """The course's helper, which the exercise asks the student to write."""
    from helpers.model.layers import init_gpt2_

    return init_gpt2_(blocks, n_layers, std)


INIT_CASES = [
    (init_answer(), None),
    (init_by_names, None),
    (init_answer("no_factor"), "without the 1/sqrt(2N) factor"),
    (init_answer("sqrt_n"), "std / sqrt(N)"),
    (init_answer("two_n"), "divides by 2N, not by its square root"),
    (init_answer("scale_all"), "that is the residual projections' std"),
    (init_answer("scale_up"), "mlp.up.weight in block 0"),
    (init_answer("keep_bias"), "is not zero"),
    (init_answer("touch_norms"), "no longer has weight 1 and bias 0"),
    (lambda blocks, n_layers, std=0.02: None, "default initialisation"),
    (init_by_the_course, "calls helpers.model.layers.init_gpt2_"),
]


def test_yours_or_picks_the_passing_answer_and_says_so(capsys):
    mine = block_answer()
    assert exercises.yours_or("layers.block_forward", mine, print) is mine
    assert "using your my_block_forward" in capsys.readouterr().out


def test_yours_or_falls_back_to_the_helper_and_says_why(capsys, monkeypatch):
    monkeypatch.setattr(exercises, "STRICT", False)

    def my_block_forward(x, block, causal=True):
        raise NotImplementedError

    helper = block_answer()
    assert exercises.yours_or("layers.block_forward", my_block_forward, helper) is helper
    said = capsys.readouterr().out
    assert "using the course's" in said and "not attempted yet" in said
    assert exercises.yours_or("layers.block_forward", block_answer("post"), helper) is helper
    assert "does not pass its check yet" in capsys.readouterr().out


def test_yours_or_raises_in_strict_mode_so_the_solution_tests_prove_it_was_used(monkeypatch):
    monkeypatch.setattr(exercises, "STRICT", True)
    with pytest.raises(AssertionError, match="Post-LN"):
        exercises.yours_or("layers.block_forward", block_answer("post"), block_answer())


CASES = [
    ("layers.layer_norm", layer_norm_rsqrt, None),
    ("layers.layer_norm", layer_norm_unbiased, "D - 1"),
    ("layers.layer_norm", layer_norm_eps_outside, "outside the square root"),
    ("layers.swiglu", swiglu_sigmoid_form, None),
    ("layers.swiglu", swiglu_swapped, "wrong projection"),
    ("layers.swiglu", swiglu_glu, "through sigmoid"),
    ("layers.distance_from_rank_one", rank_one_flatten, None),
    ("layers.distance_from_rank_one", rank_one_whole, "one distance per set"),
    ("layers.distance_from_rank_one", rank_one_no_centring, "subtract the mean token"),
]
CASES += [("layers.block_forward", answer, message) for answer, message in BLOCK_CASES]
CASES += [("layers.gpt2_init", answer, message) for answer, message in INIT_CASES]


@pytest.mark.parametrize("name, answer, message", CASES, ids=case_ids(CASES))
def test_checker_judges(name, answer, message):
    judge(name, answer, message)


def test_the_checkers_leave_the_global_random_numbers_alone():
    assert_leaves_the_global_random_numbers_alone([("layers.block_forward", block_answer()), ("layers.gpt2_init", init_answer())])


def test_every_checker_has_a_right_and_two_wrong_cases():
    assert_cases_cover("layers", CASES)


@pytest.mark.parametrize("name", exercise_names("layers"))
def test_not_attempted_says_the_task_not_the_recipe(name):
    assert_not_attempted_says_the_task(name)
