"""Notebook 7's checkers judge right: another correct formulation passes, and each typical mistake
fails with a message that names it (not only "wrong values")."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.lab.exercises import ExerciseFailed, get
from helpers.model.gpt import GPTConfig, build_without_weights, count_parameters


def verdict(name: str, answer) -> str:
    """The checker's praise for a right answer, or its message for a wrong one."""
    try:
        return "passed: " + get(name).checker(answer)
    except ExerciseFailed as failure:
        return str(failure)


# --- exact_parameters ----------------------------------------------------------------------

def by_formula(n_layers: int, d: int, vocab: int, context: int) -> int:
    return n_layers * (12 * d * d + 13 * d) + vocab * d + context * d + 2 * d


def by_building_it(n_layers: int, d: int, vocab: int, context: int) -> int:
    """Another correct way: build the model on the meta device and count."""
    config = GPTConfig(vocab_size=vocab, context_length=context, n_layers=n_layers, n_heads=1, d_model=d)
    return count_parameters(build_without_weights(config))


@pytest.mark.parametrize("answer", [by_formula, by_building_it])
def test_parameter_counts_by_formula_or_by_building_pass(answer):
    assert verdict("gpt.exact_parameters", answer).startswith("passed")


@pytest.mark.parametrize("answer, named", [
    (lambda n, d, v, c: by_formula(n, d, v, c) - c * d, "position table"),
    (lambda n, d, v, c: by_formula(n, d, v, c) + v * d, "tied"),
    (lambda n, d, v, c: by_formula(n, d, v, c) - n * 9 * d, "biases are missing"),
    (lambda n, d, v, c: 12 * n * d * d + v * d, "only 12 N d^2"),
])
def test_parameter_count_mistakes_are_named(answer, named):
    assert named in verdict("gpt.exact_parameters", answer)


# --- greedy_step ---------------------------------------------------------------------------

def greedy(gpt, ids):
    return gpt(ids[:, -gpt.config.context_length:])[:, -1].argmax(-1, keepdim=True)


def greedy_by_slicing(gpt, ids):
    """Another correct way: keep the last position as a slice, so the axis stays."""
    window = ids[:, max(0, ids.shape[1] - gpt.config.context_length):]
    return torch.argmax(gpt(window)[:, -1:], dim=-1)


@pytest.mark.parametrize("answer", [greedy, greedy_by_slicing])
def test_greedy_steps_pass(answer):
    assert verdict("gpt.greedy_step", answer).startswith("passed")


@pytest.mark.parametrize("answer, named", [
    (lambda gpt, ids: gpt(ids[:, -8:])[:, -1].argmax(-1), "keep the token axis"),
    (lambda gpt, ids: gpt(ids[:, -8:])[:, 0].argmax(-1, keepdim=True), "first position"),
    (lambda gpt, ids: gpt(ids)[:, -1].argmax(-1, keepdim=True), "context"),
])
def test_greedy_step_mistakes_are_named(answer, named):
    assert named in verdict("gpt.greedy_step", answer)


# --- next_token_loss -----------------------------------------------------------------------

def loss_by_gather(gpt, ids):
    log_probs = gpt(ids[:, :-1]).log_softmax(-1)
    return -log_probs.gather(-1, ids[:, 1:, None]).mean()


def loss_by_cross_entropy(gpt, ids):
    """Another correct way: PyTorch's cross-entropy on the flattened positions."""
    return F.cross_entropy(gpt(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())


@pytest.mark.parametrize("answer", [loss_by_gather, loss_by_cross_entropy])
def test_next_token_losses_pass(answer):
    assert verdict("gpt.next_token_loss", answer).startswith("passed")


@pytest.mark.parametrize("answer, named", [
    (lambda gpt, ids: -gpt(ids[:, :-1]).log_softmax(-1).gather(-1, ids[:, :-1, None]).mean(),
     "its own token"),
    (lambda gpt, ids: -gpt(ids[:, :-1]).log_softmax(-1).gather(-1, ids[:, 1:, None]).sum(),
     "mean, not the sum"),
    (lambda gpt, ids: gpt(ids[:, :-1]).log_softmax(-1).gather(-1, ids[:, 1:, None]).mean(), "sign"),
])
def test_next_token_loss_mistakes_are_named(answer, named):
    assert named in verdict("gpt.next_token_loss", answer)


# --- adamw_update --------------------------------------------------------------------------

def adamw(p, g, m, v, t, lr, betas, eps, weight_decay):
    beta1, beta2 = betas
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
    return p * (1 - lr * weight_decay) - lr * m_hat / (v_hat.sqrt() + eps), m, v


def adamw_in_place(p, g, m, v, t, lr, betas, eps, weight_decay):
    """Another correct way: PyTorch's in-place operations, as torch.optim.AdamW writes them."""
    beta1, beta2 = betas
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    p.mul_(1 - lr * weight_decay)
    denominator = (v / (1 - beta2 ** t)).sqrt().add_(eps)
    p.addcdiv_(m, denominator, value=-lr / (1 - beta1 ** t))
    return p, m, v


@pytest.mark.parametrize("answer", [adamw, adamw_in_place])
def test_adamw_updates_pass(answer):
    assert verdict("gpt.adamw_update", answer).startswith("passed")


def no_bias_correction(p, g, m, v, t, lr, betas, eps, weight_decay):
    beta1, beta2 = betas
    m, v = beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g
    return p * (1 - lr * weight_decay) - lr * m / (v.sqrt() + eps), m, v


def l2_instead_of_decay(p, g, m, v, t, lr, betas, eps, weight_decay):
    return adamw(p, g + weight_decay * p, m, v, t, lr, betas, eps, 0.0)


@pytest.mark.parametrize("answer, named", [
    (no_bias_correction, "no bias correction"),
    (l2_instead_of_decay, "decoupled"),
    (lambda p, g, m, v, t, lr, betas, eps, wd: adamw(p, g, m, v, t, lr, betas, eps, 0.0), "decay is missing"),
])
def test_adamw_mistakes_are_named(answer, named):
    assert named in verdict("gpt.adamw_update", answer)


# --- cache_step ----------------------------------------------------------------------------

def cache_step(x_new, w_q, w_k, w_v, keys, values):
    q = x_new @ w_q
    keys, values = torch.cat([keys, x_new @ w_k], dim=1), torch.cat([values, x_new @ w_v], dim=1)
    weights = (q @ keys.transpose(-2, -1) / keys.shape[-1] ** 0.5).softmax(-1)
    return weights @ values, keys, values


def cache_step_with_sdpa(x_new, w_q, w_k, w_v, keys, values):
    """Another correct way: PyTorch's attention on the grown cache (one query sees every key)."""
    keys, values = torch.cat([keys, x_new @ w_k], dim=1), torch.cat([values, x_new @ w_v], dim=1)
    return F.scaled_dot_product_attention(x_new @ w_q, keys, values), keys, values


@pytest.mark.parametrize("answer", [cache_step, cache_step_with_sdpa])
def test_cache_steps_pass(answer):
    assert verdict("gpt.cache_step", answer).startswith("passed")


def past_only(x_new, w_q, w_k, w_v, keys, values):
    q = x_new @ w_q
    out = (q @ keys.transpose(-2, -1) / keys.shape[-1] ** 0.5).softmax(-1) @ values
    return out, torch.cat([keys, x_new @ w_k], 1), torch.cat([values, x_new @ w_v], 1)


def unscaled(x_new, w_q, w_k, w_v, keys, values):
    keys, values = torch.cat([keys, x_new @ w_k], dim=1), torch.cat([values, x_new @ w_v], dim=1)
    return ((x_new @ w_q) @ keys.transpose(-2, -1)).softmax(-1) @ values, keys, values


@pytest.mark.parametrize("answer, named", [
    (past_only, "stored tokens only"),
    (unscaled, "sqrt(d_h)"),
    (lambda x, wq, wk, wv, keys, values: cache_step(x, wq, wk, wv, keys, values)[0], "tuple"),
])
def test_cache_step_mistakes_are_named(answer, named):
    assert named in verdict("gpt.cache_step", answer)
