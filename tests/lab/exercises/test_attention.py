"""Notebook 3's checkers (helpers/lab/exercises/attention.py): every correct formulation passes,
each usual slip fails with a message that names it, and a stub hears what to write."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import helpers.lab.exercises as exercises
from helpers.model.attention import (
    AttentionLayer,
)

from .judging import (
    assert_cases_cover,
    assert_leaves_the_global_random_numbers_alone,
    assert_not_attempted_says_the_task,
    case_ids,
    exercise_names,
    judge,
    named,
    verdict,
)


def softmax_logsumexp(x):
    return (x - x.logsumexp(dim=-1, keepdim=True)).exp()


def softmax_unshifted(x):
    return x.exp() / x.exp().sum(-1, keepdim=True)


def softmax_columns(x):
    shifted = (x - x.max()).exp()
    return shifted / shifted.sum(0, keepdim=True)


def jacobian_broadcast(a):
    return a[:, None] * (torch.eye(len(a), dtype=a.dtype) - a[None, :])


def jacobian_diag_only(a):
    return torch.diag(a)


def jacobian_sign(a):
    return torch.outer(a, a) - torch.diag(a)


def attention_einsum(q, k, v):
    weights = torch.einsum("...nd,...md->...nm", q, k).div(q.shape[-1] ** 0.5).softmax(-1)
    return torch.einsum("...nm,...md->...nd", weights, v), weights


def attention_unscaled(q, k, v):
    weights = (q @ k.transpose(-2, -1)).softmax(-1)
    return weights @ v, weights


def attention_wrong_dim(q, k, v):
    weights = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).softmax(-2)
    return weights @ v, weights


def attention_answer(scale: str = "sqrt_dk"):
    def my_attention(q, k, v):
        scores = q @ k.transpose(-2, -1)
        if scale == "sqrt_dk":
            scores = scores / math.sqrt(q.shape[-1])
        elif scale == "dk":
            scores = scores / q.shape[-1]
        elif scale == "sqrt_dv":
            scores = scores / math.sqrt(v.shape[-1])
        weights = scores.softmax(-1)
        if scale == "after":
            weights = weights / math.sqrt(q.shape[-1])
        return weights @ v, weights
    return my_attention


ATTENTION_CASES = [
    (attention_answer(), None),
    (lambda q, k, v: (F.scaled_dot_product_attention(q, k, v),
                      (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1)), None),
    (attention_answer("none"), "divide the scores by"),
    (attention_answer("dk"), "not by d_k"),
    (attention_answer("sqrt_dv"), "sqrt(d_v)"),
    (attention_answer("after"), "before the softmax"),
]


def layer_answer(slip: str = ""):
    """A student's MyAttentionLayer; `slip` chooses how the projections are stored or what goes wrong."""
    class MyAttentionLayer(torch.nn.Module):
        def __init__(self, d_in: int, d_k: int, d_v: int) -> None:
            if slip != "no_super":
                super().__init__()
            if slip.startswith("param"):  # nn.Parameter matrices, (d_in, d) or F.linear's (d, d_in)
                shape = (lambda d: (d_in, d)) if slip == "param_in_out" else (lambda d: (d, d_in))
                self.w_q, self.w_k, self.w_v = (torch.nn.Parameter(torch.randn(*shape(d)) / math.sqrt(d_in))
                                                for d in (d_k, d_k, d_v))
            elif slip == "plain_tensor":
                self.w_q, self.w_k, self.w_v = (torch.randn(d_in, d) for d in (d_k, d_k, d_v))
            else:
                width_v = d_k if slip == "values_dk" else d_v
                self.w_q, self.w_k = (torch.nn.Linear(d_in, d_k, bias=slip == "bias") for _ in range(2))
                self.w_v = torch.nn.Linear(d_in, width_v, bias=slip == "bias")
                if slip == "zeros":
                    torch.nn.init.zeros_(self.w_k.weight)

        def project(self, name: str, x: torch.Tensor) -> torch.Tensor:
            w = getattr(self, name)
            if slip == "param_in_out" or slip == "plain_tensor":
                return x @ w
            return F.linear(x, w) if slip == "param_out_in" else w(x)

        def forward(self, x_query, x_data):
            q = self.project("w_q", x_query)
            k = self.project("w_q" if slip == "keys_wq" else "w_k", x_data)
            v = self.project("w_v", x_data)
            if slip == "swapped":  # the arguments read the other way round: layer(x_data, x_query)
                q, k, v = self.project("w_q", x_data), self.project("w_k", x_query), self.project("w_v", x_query)
            if slip == "torch":
                weights = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1)
                return F.scaled_dot_product_attention(q, k, v), weights
            size = {"unscaled": 1, "d_v": v.shape[-1], "d_in": x_query.shape[-1]}.get(slip, q.shape[-1])
            scores = (q @ (k.T if slip == "dot_T" else k.transpose(-2, -1))) / math.sqrt(size)
            weights = torch.softmax(scores, dim=-2 if slip == "columns" else -1)
            return weights @ v, weights.transpose(-2, -1) if slip == "transposed" else weights
    return MyAttentionLayer


LAYER_CASES = [
    (layer_answer(), None),
    (AttentionLayer, "helpers.model.attention.AttentionLayer"),  # the helper the notebook falls back to
    (layer_answer("param_in_out"), None),
    (layer_answer("param_out_in"), None),
    (layer_answer("torch"), None),
    (layer_answer("unscaled"), "divide the scores by sqrt(d_k)"),
    (layer_answer("d_v"), "sqrt(d_v)"),
    (layer_answer("d_in"), "sqrt(d_in)"),
    (layer_answer("columns"), "columns sum to 1"),
    (layer_answer("bias"), "has a bias"),
    (layer_answer("keys_wq"), "keys are projected with w_q"),
    (layer_answer("swapped"), "your queries come from x_data"),
    (layer_answer("dot_T"), "Leading (batch) dims must pass through"),
    (layer_answer("transposed"), "your weights are transposed"),
    (layer_answer("values_dk"), "expected nn.Linear(d_in, d_v)"),
    (layer_answer("plain_tensor"), "wrap it in nn.Parameter"),
    (layer_answer("zeros"), "all zeros"),
    (layer_answer("no_super"), "super().__init__()"),
]


def test_the_layer_checker_says_not_attempted_for_the_notebooks_stub():
    class MyAttentionLayer(torch.nn.Module):
        def __init__(self, d_in: int, d_k: int, d_v: int) -> None:
            super().__init__()
            raise NotImplementedError

    passed, said = verdict("attention.attention_layer", MyAttentionLayer)
    assert not passed and "not attempted yet" in said and "MyAttentionLayer(d_in, d_k, d_v)" in said


def test_the_layer_checker_raises_exercise_failed_itself_for_a_wrong_layer():
    """Called directly (not through check), the checker raises; `evaluate` turns that into the verdict."""
    from helpers.lab.exercises.attention import attention_layer

    with pytest.raises(exercises.ExerciseFailed, match="has a bias"):
        attention_layer(layer_answer("bias"))
    attention_layer(layer_answer())  # and a right one passes without raising


def test_the_layer_checker_wants_the_class_not_a_layer():
    passed, said = verdict("attention.attention_layer", layer_answer()(6, 4, 3))
    assert not passed and "pass the class MyAttentionLayer itself" in said


def test_the_layer_checker_names_a_matmul_that_drops_the_batch_dims():
    torch_mm = layer_answer()

    class TwoDimOnly(torch_mm):
        def forward(self, x_query, x_data):
            q, k, v = self.w_q(x_query), self.w_k(x_data), self.w_v(x_data)
            weights = torch.softmax(torch.mm(q, k.t()) / math.sqrt(q.shape[-1]), dim=-1)
            return torch.mm(weights, v), weights

    passed, said = verdict("attention.attention_layer", TwoDimOnly)
    assert not passed and "works on (N, d_in) inputs" in said and "torch.mm" in said


def backward_answer(slip: str = ""):
    """A student's attention backward pass; `slip` chooses the usual mistake."""
    def my_attention_backward(q, k, v, grad_output, scale):
        scores = torch.einsum("...qd,...kd->...qk", q, k) * scale
        weights = scores.softmax(-1)
        grad_v = (weights if slip == "no_transpose_v" else weights.mT) @ grad_output
        g = grad_output @ v.mT
        if slip == "diagonal":
            grad_scores = weights * g
        else:  # J g with J = diag(a) - a a^T, built explicitly
            jacobian = torch.diag_embed(weights) - weights[..., :, None] * weights[..., None, :]
            grad_scores = (jacobian @ g[..., None])[..., 0]
        if slip != "unscaled":
            grad_scores = grad_scores * scale
        if slip == "swapped":
            return grad_scores @ q, grad_scores.mT @ k, grad_v
        return grad_scores @ k, (grad_scores if slip == "no_transpose_k" else grad_scores.mT) @ q, grad_v
    return my_attention_backward


def backward_by_autograd(q, k, v, grad_output, scale):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    (((q @ k.mT * scale).softmax(-1) @ v) * grad_output).sum().backward()
    return q.grad, k.grad, v.grad


BACKWARD_CASES = [
    (backward_answer(), None),
    (backward_answer("diagonal"), "diag(a) only"),
    (backward_answer("unscaled"), "forgot the scale"),
    (backward_answer("swapped"), "through the other one"),
    (backward_answer("no_transpose_v"), "weights untransposed"),
    (backward_answer("no_transpose_k"), "gradient untransposed"),
    (lambda q, k, v, g, scale: backward_answer()(q, k, v, g, scale)[:2], "not three gradients"),
    (backward_by_autograd, "torch.autograd.backward, which this exercise asks you to write yourself"),
]


def test_a_jacobian_with_a_at_a_transposed_names_the_dot_product():
    # a @ a.T, as students write it, is a @ a for a vector (and warns that .T is deprecated there)
    named("attention.softmax_jacobian", lambda a: torch.diag(a) - a @ a, "one number", "outer product")


class KeysFromTheQueries(nn.Module):
    """An attention layer that takes its keys and values from x_query, not from x_data."""

    def __init__(self, d_in: int, d_k: int, d_v: int) -> None:
        super().__init__()
        self.w_q, self.w_k = nn.Linear(d_in, d_k, bias=False), nn.Linear(d_in, d_k, bias=False)
        self.w_v = nn.Linear(d_in, d_v, bias=False)

    def forward(self, x_query, x_data):
        q, k, v = self.w_q(x_query), self.w_k(x_query), self.w_v(x_query)
        scores = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])
        weights = scores.exp() / scores.exp().sum(-1, keepdim=True)
        return weights @ v, weights


def test_keys_from_the_wrong_input_are_named():
    named("attention.attention_layer", KeysFromTheQueries, "keys come from x_query", "x_data")


CASES = [
    ("attention.stable_softmax", softmax_logsumexp, None),
    ("attention.stable_softmax", softmax_unshifted, "Subtract the row maximum"),
    ("attention.stable_softmax", softmax_columns, "do not sum to 1"),
    ("attention.softmax_jacobian", jacobian_broadcast, None),
    ("attention.softmax_jacobian", jacobian_diag_only, "only diag(a)"),
    ("attention.softmax_jacobian", jacobian_sign, "sign is flipped"),
    ("attention.scaled_attention", attention_einsum, None),
    ("attention.scaled_attention", attention_unscaled, "divide the scores by"),
    ("attention.scaled_attention", attention_wrong_dim, "columns sum to 1"),
]
CASES += [("attention.scaled_attention", answer, message) for answer, message in ATTENTION_CASES]
CASES += [("attention.attention_layer", answer, message) for answer, message in LAYER_CASES]
CASES += [("attention.attention_backward", answer, message) for answer, message in BACKWARD_CASES]


@pytest.mark.parametrize("name, answer, message", CASES, ids=case_ids(CASES))
def test_checker_judges(name, answer, message):
    judge(name, answer, message)


def test_the_checkers_leave_the_global_random_numbers_alone():
    assert_leaves_the_global_random_numbers_alone([("attention.attention_layer", layer_answer())])


def test_every_checker_has_a_right_and_two_wrong_cases():
    assert_cases_cover("attention", CASES)


@pytest.mark.parametrize("name", exercise_names("attention"))
def test_not_attempted_says_the_task_not_the_recipe(name):
    assert_not_attempted_says_the_task(name)
